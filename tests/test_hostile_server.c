/*
 * "Hostile peers get nowhere", client side: a fake ecstore-server answers
 * HELLO like a real one, then sends a crafted GET reply whose sizes are
 * lies, to the real client library.  The client must answer ECS_EPROTO,
 * write nothing past any buffer (ASan is the judge in the sanitizer
 * build) and never size a malloc on the server's word alone.
 *
 * The original attack: two compressed items of 2^64-8 and 24 bytes whose
 * sizes sum (wrapping) to 16, so the client allocated a 16-byte scratch
 * buffer and read the server's bytes past it.
 *
 * And a squatter: another user listening at the shm socket path a server
 * advertises, hoping for the client's HELLO and its auth token.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/core/auth.h"
#include "store/core/codec.h"
#include "store/core/proto.h"

#define FAKE_TOKEN "s3cret" /* the token the fake server proves */

/* One lying item of the crafted reply. */
typedef struct lie {
  uint8_t codec;   /* its codec byte */
  uint64_t nbytes; /* the payload size it claims */
  uint64_t shape0; /* a 1-D u8 tensor of this many bytes (raw_nbytes) */
} lie_t;

/* The fake server: a listener, and what it answers a GET with. */
typedef struct fake {
  int lfd;              /* listening socket on 127.0.0.1 */
  int port;             /* its port */
  const lie_t *lies;    /* the reply's items */
  size_t nlies;         /* how many */
  uint64_t data_len;    /* the reply header's data_len */
  uint64_t get_cap;     /* out: the capacity the client's first GET item asked for */
  const char *shm_path; /* the Unix socket its HELLO reply advertises ("" none) */
  pthread_t th;         /* the thread that serves one connection */
} fake_t;

static int read_full(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = recv(fd, b, n, 0);
    if (r <= 0)
      return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static int send_full(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
    if (r <= 0)
      return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Reads one request: its header and records (into *meta, malloc'd). */
static int read_request(int fd, ecs_hdr_t *h, uint8_t **meta) {
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  if (read_full(fd, hb, sizeof hb) || ecs_proto_hdr_decode(hb, UINT64_MAX, h) != ECS_OK)
    return -1;
  *meta = malloc(h->meta_len ? h->meta_len : 1);
  return *meta && read_full(fd, *meta, h->meta_len) == 0 ? 0 : -1;
}

static int send_reply(int fd, uint8_t op, uint32_t req_id, uint32_t count, const ecs_wbuf_t *w,
                      uint64_t data_len) {
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = op,
                 .flags = ECS_FLAG_REPLY,
                 .req_id = req_id,
                 .count = count,
                 .meta_len = (uint32_t)w->len,
                 .data_len = data_len};
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, hb);
  return send_full(fd, hb, sizeof hb) || send_full(fd, w->p, w->len) ? -1 : 0;
}

static void *fake_serve(void *arg) {
  fake_t *f = arg;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0)
    return NULL;
  ecs_hdr_t h;
  uint8_t *meta = NULL;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  /* HELLO, as a real server answers it (no shm socket: tcp only); a
   * client with a token proves it, and so does this fake, which knows it
   * (FAKE_TOKEN): the lies below come from a server the client trusts */
  uint8_t key[ECS_AUTH_KEY_SIZE], cn[ECS_AUTH_NONCE_SIZE], sn[ECS_AUTH_NONCE_SIZE] = {1};
  for (int round = 0; round < 2; round++) {
    if (read_request(fd, &h, &meta) || h.opcode != ECS_OP_HELLO)
      goto out;
    ecs_rbuf_t hrb;
    ecs_rbuf_init(&hrb, meta, h.meta_len);
    ecs_hello_t hl;
    if (ecs_proto_hello_read(&hrb, &hl) != ECS_OK)
      goto out;
    char ns[129];
    snprintf(ns, sizeof ns, "%.*s", (int)hl.ns_len, (const char *)hl.ns);
    ecs_hello_reply_t hr = {.epoch = 1, .pool_size = 1u << 20, .max_items = 1024, .max_data = 1u << 20};
    snprintf(hr.node_id, sizeof hr.node_id, "fake");
    snprintf(hr.shm_path, sizeof hr.shm_path, "%s", f->shm_path ? f->shm_path : "");
    if (hl.client_flags & ECS_HELLO_C_CHALLENGE) {
      ecs__auth_key(FAKE_TOKEN, strlen(FAKE_TOKEN), ns, key);
      memcpy(cn, hl.nonce, sizeof cn);
      hr.proof = 1;
      memcpy(hr.snonce, sn, sizeof sn);
      ecs__auth_mac(key, 1, cn, sn, ns, hr.node_id, hr.addr, hr.smac);
    }
    ecs_wbuf_reset(&w);
    ecs_proto_hello_reply_write(&w, &hr);
    if (send_reply(fd, ECS_OP_HELLO, h.req_id, 0, &w, 0))
      goto out;
    free(meta);
    meta = NULL;
    if (!(hl.client_flags & ECS_HELLO_C_CHALLENGE))
      break;
  }
  /* GET: the lies */
  if (read_request(fd, &h, &meta) || h.opcode != ECS_OP_GET)
    goto out;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  ecs_get_item_t gi;
  if (ecs_proto_get_item_read(&r, &gi) == ECS_OK)
    f->get_cap = gi.capacity;
  ecs_wbuf_reset(&w);
  for (size_t i = 0; i < f->nlies; i++) {
    ecs_get_reply_t rep = {.status = ECS_OK,
                           .codec = f->lies[i].codec,
                           .desc = {.dtype = ECS_DTYPE_U8, .ndim = 1, .shape = {f->lies[i].shape0}},
                           .nbytes = f->lies[i].nbytes,
                           .raw_nbytes = f->lies[i].shape0};
    ecs_proto_get_reply_write(&w, &rep);
  }
  if (send_reply(fd, ECS_OP_GET, h.req_id, (uint32_t)f->nlies, &w, f->data_len))
    goto out;
  /* then bytes, far more than any buffer the lies could have bought */
  static uint8_t junk[256 * 1024];
  memset(junk, 0xA5, sizeof junk);
  (void)send_full(fd, junk, sizeof junk);
out:
  shutdown(fd, SHUT_WR);
  char sink[4096];
  while (recv(fd, sink, sizeof sink, 0) > 0) { /* until the client hangs up */
  }
  close(fd);
  free(meta);
  ecs_wbuf_free(&w);
  return NULL;
}

static void fake_start(fake_t *f, const lie_t *lies, size_t n, uint64_t data_len, const char *shm_path) {
  memset(f, 0, sizeof *f);
  f->shm_path = shm_path;
  f->lies = lies;
  f->nlies = n;
  f->data_len = data_len;
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(f->lfd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(f->lfd, 1), 0);
  assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&a, &al), 0);
  f->port = ntohs(a.sin_port);
  assert_int_equal(pthread_create(&f->th, NULL, fake_serve, f), 0);
}

static ecs_client_t *connect_to(const fake_t *f, uint64_t max_object) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", f->port);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = addr;
  cfg.transport = "tcp";
  cfg.timeout_ms = 3000;
  if (max_object)
    cfg.max_object_size = max_object;
  ecs_client_t *c = NULL;
  char err[256];
  int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
  if (rc != ECS_OK)
    fail_msg("connect to the fake server: %s", err);
  return c;
}

static void fake_stop(fake_t *f, ecs_client_t *c) {
  ecs_client_close(c); /* the fake's drain loop ends when the client hangs up */
  pthread_join(f->th, NULL);
  close(f->lfd);
}

/* Runs one GET of n keys against the lies; returns the batch's result.
 * alloc: 1 ecs_get_batch_alloc; 0 ecs_get_batch into 64-byte buffers; 2
 * ecs_get_batch with no buffers (data NULL, capacity 64: asks for 0). */
static int get_against(const lie_t *lies, size_t n, uint64_t data_len, int alloc, uint64_t max_object,
                       uint64_t *asked_cap) {
  fake_t f;
  fake_start(&f, lies, n, data_len, NULL);
  ecs_client_t *c = connect_to(&f, max_object);
  ecs_key_t keys[2] = {{"k0", 2}, {"k1", 2}};
  uint8_t dst[2][64];
  ecs_get_buf_t bufs[2] = {{.data = alloc ? NULL : dst[0], .capacity = alloc == 1 ? 0 : sizeof dst[0]},
                           {.data = alloc ? NULL : dst[1], .capacity = alloc == 1 ? 0 : sizeof dst[1]}};
  assert_true(n <= 2);
  int rc = alloc == 1 ? ecs_get_batch_alloc(c, keys, bufs, n) : ecs_get_batch(c, keys, bufs, n);
  for (size_t i = 0; alloc == 1 && i < n; i++)
    ecs_free(bufs[i].data);
  fake_stop(&f, c);
  if (asked_cap)
    *asked_cap = f.get_cap;
  return rc;
}

/* The report's attack: 2^64-8 + 24 wraps to 16. */
static void test_wrapping_sizes(void **state) {
  (void)state;
  lie_t lies[2] = {{ECS_CODEC_LZ4, UINT64_MAX - 7, 16}, {ECS_CODEC_LZ4, 24, 16}};
  assert_int_equal(get_against(lies, 2, 16, 0, 0, NULL), ECS_EPROTO);
  assert_int_equal(get_against(lies, 2, 16, 1, 0, NULL), ECS_EPROTO);
}

/* A compressed item larger than its codec could ever emit for the raw
 * size (16 raw bytes in 60000 lz4 bytes), even with data_len agreeing;
 * or of no bytes at all. */
static void test_compressed_over_bound(void **state) {
  (void)state;
  lie_t lies[1] = {{ECS_CODEC_ZSTD, 60000, 16}};
  assert_int_equal(get_against(lies, 1, 60000, 1, 0, NULL), ECS_EPROTO);
  lie_t bad_codec[1] = {{0x0e, 8, 16}}; /* no such codec id */
  assert_int_equal(get_against(bad_codec, 1, 8, 1, 0, NULL), ECS_EPROTO);
  /* A compressed item of 0 bytes (found by tests/fuzz/fuzz_client_reply):
   * no compressor emits an empty frame, and with no compressed bytes in
   * the reply the client had no scratch buffer, so it handed the decoder
   * NULL + 0 (undefined behaviour) and the batch said OK. */
  lie_t empty[1] = {{ECS_CODEC_LZ4, 0, 16}};
  assert_int_equal(get_against(empty, 1, 0, 0, 0, NULL), ECS_EPROTO);
  assert_int_equal(get_against(empty, 1, 0, 1, 0, NULL), ECS_EPROTO);
  lie_t empty_zstd[1] = {{ECS_CODEC_ZSTD | ECS_CODEC_SHUFFLE, 0, 0}};
  assert_int_equal(get_against(empty_zstd, 1, 0, 1, 0, NULL), ECS_EPROTO);
}

/* An item larger than the caller's buffer (the server was told 64 bytes),
 * and an allocating get's object over max_object_size: the client's own
 * limits, not the server's word, bound what is allocated and read. */
static void test_over_what_was_asked(void **state) {
  (void)state;
  lie_t raw[1] = {{ECS_CODEC_NONE, 4096, 4096}};
  assert_int_equal(get_against(raw, 1, 4096, 0, 0, NULL), ECS_EPROTO);
  lie_t small[1] = {{ECS_CODEC_NONE, 16, 16}};
  uint64_t asked = 1;
  assert_int_equal(get_against(small, 1, 16, 2, 0, &asked), ECS_EPROTO); /* bytes for no buffer */
  assert_int_equal(asked, 0);
  assert_int_equal(get_against(raw, 1, 4096, 1, 1024, &asked), ECS_EPROTO);
  assert_int_equal(asked, 1024);                                      /* the cap went into the request */
  assert_int_equal(get_against(raw, 1, 8, 1, 0, &asked), ECS_EPROTO); /* data_len says 8 */
  assert_int_equal(asked, ECS_DEFAULT_MAX_OBJECT_SIZE);
}

/* A squatter at the shm socket path the server advertises, listening as
 * another user (uid 65534): it must receive nothing (no HELLO, so no
 * token); "shm" fails saying why, "auto" quietly stays on TCP.  The
 * squatter reports through a pipe how many bytes it was sent. */
static pid_t squat(const char *path, int report_fd) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path)
    _exit(3);
  memcpy(a.sun_path, path, strlen(path) + 1);
  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  /* bound as root (the directory is root's), then listening as nobody:
   * SO_PEERCRED reports the listener's credentials at listen() */
  if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || chmod(path, 0666) != 0 ||
      setgid(65534) != 0 || setuid(65534) != 0 || listen(l, 4) != 0)
    _exit(3);
  if (write(report_fd, "L", 1) != 1) /* listening */
    _exit(3);
  long got = 0;
  for (int conns = 0; conns < 2; conns++) { /* one per connect below */
    struct pollfd p = {.fd = l, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
      break;
    int fd = accept(l, NULL, NULL);
    char buf[512];
    ssize_t r;
    p.fd = fd;
    while (poll(&p, 1, 5000) == 1 && (r = recv(fd, buf, sizeof buf, 0)) > 0)
      got += r;
    close(fd);
  }
  _exit(write(report_fd, &got, sizeof got) == sizeof got ? 0 : 3);
}

static void test_shm_squatter(void **state) {
  (void)state;
  if (geteuid() != 0) {
    printf("skip: test_shm_squatter: needs root (setuid to play another user)\n");
    skip();
  }
  char dir[] = "/tmp/ecs-squat-XXXXXX", path[128];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/shm.sock", dir);
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = squat(path, pfd[1]);
  assert_true(pid > 0);
  char ready;
  assert_int_equal(read(pfd[0], &ready, 1), 1);
  const char *modes[2] = {"shm", "auto"};
  for (int i = 0; i < 2; i++) {
    fake_t f;
    fake_start(&f, NULL, 0, 0, path);
    char addr[64], err[256] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%d", f.port);
    ecs_client_config_t cfg;
    ecs_client_config_init(&cfg);
    cfg.servers = addr;
    cfg.transport = modes[i];
    cfg.auth_token = "s3cret";
    ecs_client_t *c = NULL;
    int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
    if (i == 0) {
      assert_int_equal(rc, ECS_ENOTSUP);
      assert_non_null(strstr(err, "is held by uid 65534, not by root or uid 0"));
    } else {
      assert_int_equal(rc, ECS_OK); /* on TCP */
    }
    fake_stop(&f, c);
  }
  long got = -1;
  assert_int_equal(read(pfd[0], &got, sizeof got), (ssize_t)sizeof got);
  assert_int_equal(got, 0); /* not one byte, so not the token */
  int ws;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  close(pfd[0]);
  close(pfd[1]);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrapping_sizes),
      cmocka_unit_test(test_compressed_over_bound),
      cmocka_unit_test(test_over_what_was_asked),
      cmocka_unit_test(test_shm_squatter),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
