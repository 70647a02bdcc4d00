/*
 * The shm findings of issue 13, each test the attack itself, against real
 * redis-server and ecstore-server processes:
 *
 *  - a "read-only" shm client of another uid (in --shm-allow-uid) reopens
 *    the pool's memfd read-write through /proc/self/fd/N, truncates it
 *    (the server died of SIGBUS) or maps it writable: all must fail, and
 *    the server must serve a later put/get with the right bytes (root);
 *  - a uid not in --shm-write-uid is refused a writable map and puts by
 *    copy; a uid not in --shm-allow-uid maps nothing and copies both ways
 *    over the Unix socket (root);
 *  - a listener at the socket path (same uid, so it passes SO_PEERCRED)
 *    records every byte a client sends during its upgrade: the auth token
 *    is not among them, and the recorded proof replayed to the server is
 *    refused;
 *  - the socket directory: the old default path pre-created by a squatter
 *    no longer stops the server; a directory others can write is refused
 *    with a message that says why.
 *
 * Tests that switch uids run as their own ctest entry (--root-only), which
 * exits 77 with a reason when not root.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "store/core/sha256.h"
#include "support/fixture.h"
#include "support/raw.h"
#include "support/ts.h"

#define NOBODY 65534u
#define OBJ_BYTES 65536u

/* A get of key that checks every byte against the seeded pattern. */
static int get_verified(ecs_client_t *c, const char *key, uint32_t seed) {
  static uint8_t a[OBJ_BYTES], b[OBJ_BYTES];
  ecs_ts_fill(a, sizeof a, seed);
  uint64_t n = 0;
  memset(b, 0, sizeof b);
  int rc = ecs_ts_get1(c, key, b, sizeof b, &n);
  if (rc != ECS_OK)
    return rc;
  return n == sizeof a && memcmp(a, b, sizeof a) == 0 ? ECS_OK : ECS_ECHECKSUM;
}

/* A put of OBJ_BYTES seeded bytes and a get that checks every one. */
static int put_get_verified(ecs_client_t *c, const char *key, uint32_t seed) {
  static uint8_t a[OBJ_BYTES];
  ecs_ts_fill(a, sizeof a, seed);
  int rc = ecs_ts_put1(c, key, a, sizeof a, ECS_DTYPE_U8);
  return rc != ECS_OK ? rc : get_verified(c, key, seed);
}

static ecs_client_t *shm_client(const ecs_ts_env_t *e, const char *token) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e->servers, "shm");
  cfg.auth_token = token;
  return ecs_ts_connect(&cfg);
}

/* A raw ATTACH on an upgraded client's socket, as an attacker would send
 * it, keeping the descriptor.  The reply's status; *pfd the fd (or -1). */
static int raw_attach(int fd, uint32_t flags, int *pfd) {
  *pfd = -1;
  uint8_t meta[4] = {(uint8_t)flags, (uint8_t)(flags >> 8), (uint8_t)(flags >> 16), (uint8_t)(flags >> 24)};
  uint8_t hb[32], rb[64];
  ecs_ts_raw_hdr(hb, ECS_OP_ATTACH, 0, sizeof meta, 0);
  if (ecs_ts_raw_send(fd, hb, sizeof hb) || ecs_ts_raw_send(fd, meta, sizeof meta))
    return ECS_ECONN;
  if (ecs_net_read_all_fd(fd, rb, 32, ecs_now_ms() + 2000, pfd))
    return ECS_ECONN;
  ecs_hdr_t h;
  if (ecs_proto_hdr_decode(rb, 0, &h) || h.meta_len > 32 ||
      ecs_net_read_all(fd, rb + 32, h.meta_len, ecs_now_ms() + 2000))
    return ECS_EPROTO;
  return h.status;
}

/* ------------------------------------------------------------------ */
/* root: another uid against the pool                                  */

/* Runs fn as uid NOBODY in a child; its exit status (0: all held). */
static int as_nobody(const ecs_ts_env_t *e, int (*fn)(const ecs_ts_env_t *e)) {
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    /* dumpable again after the uid change, as a process started as that
     * user is: else /proc/self/fd would be root's and refuse the reopen
     * for a reason that has nothing to do with the pool */
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0 || prctl(PR_SET_DUMPABLE, 1) != 0)
      _exit(90);
    _exit(fn(e));
  }
  int ws;
  if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws))
    return -1;
  return WEXITSTATUS(ws);
}

/* A reader (in --shm-allow-uid) goes for write access to the pool. */
static int reader_attacks(const ecs_ts_env_t *e) {
  ecs_client_t *c = shm_client(e, NULL);
  if (!c)
    return 10;
  if (strcmp(ecs_client_transport(c), "shm") != 0)
    return 11;
  int fd = ecs__client_server_fd(c, 0), pfd = -1;
  /* ATTACH asking for write: refused */
  if (raw_attach(fd, ECS_ATTACH_WRITE, &pfd) != ECS_EAUTH || pfd >= 0)
    return 12;
  /* ATTACH read-only: granted, and the fd is kept */
  if (raw_attach(fd, 0, &pfd) != ECS_OK || pfd < 0)
    return 13;
  struct stat st;
  if (fstat(pfd, &st) != 0 || st.st_size <= 0)
    return 14;
  /* (a) reopen it read-write through /proc */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", pfd);
  int rw = open(path, O_RDWR);
  if (rw >= 0) {
    int t = ftruncate(rw, 0); /* the attack of the issue: the server then dies of SIGBUS */
    (void)t;
    return 20;
  }
  /* (b) truncate it to 0 */
  if (ftruncate(pfd, 0) == 0)
    return 21;
  /* (c) map it writable */
  void *w = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
  if (w != MAP_FAILED)
    return 22;
  /* what it may do: map it read-only */
  void *r = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, pfd, 0);
  if (r == MAP_FAILED)
    return 23;
  munmap(r, (size_t)st.st_size);
  close(pfd);
  ecs_client_close(c);
  return 0;
}

static void test_root_reader_cannot_write_pool(void **state) {
  (void)state;
  ecs_ts_env_t e;
  const char *const extra[] = {"--shm-allow-uid", "65534", NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  ecs_client_t *c = shm_client(&e, NULL);
  assert_non_null(c);
  assert_int_equal(put_get_verified(c, "before", 1), ECS_OK);
  assert_int_equal(as_nobody(&e, reader_attacks), 0);
  /* the server is up and serves: a put whose block may lie anywhere in the
   * pool, a get with every byte checked, and the object from before */
  assert_int_equal(put_get_verified(c, "after", 2), ECS_OK);
  assert_int_equal(get_verified(c, "before", 1), ECS_OK);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&e), 0); /* exited cleanly: no SIGBUS */
}

/* A uid in --shm-allow-uid, not in --shm-write-uid: a read-only map, and
 * its put goes by copy and lands. */
static int reader_puts(const ecs_ts_env_t *e) {
  ecs_client_t *c = shm_client(e, NULL); /* asks for a writable map */
  if (!c)
    return 10;
  if (strcmp(ecs_client_transport(c), "shm") != 0)
    return 11;
  int rc = put_get_verified(c, "from-nobody", 3);
  ecs_client_close(c);
  return rc == ECS_OK ? 0 : 12;
}

/* A uid in --shm-write-uid: ATTACH with the write flag is granted, and
 * the pool still cannot be truncated or grown through that fd. */
static int writer_attaches(const ecs_ts_env_t *e) {
  ecs_client_t *c = shm_client(e, NULL);
  if (!c)
    return 10;
  int pfd = -1;
  if (raw_attach(ecs__client_server_fd(c, 0), ECS_ATTACH_WRITE, &pfd) != ECS_OK || pfd < 0)
    return 11;
  /* a writer may write objects' bytes, never resize the pool under the
   * server: the seals hold for a writable fd too */
  if (ftruncate(pfd, 0) == 0 || ftruncate(pfd, (off_t)1 << 40) == 0)
    return 12;
  close(pfd);
  ecs_client_close(c);
  return 0;
}

static void test_root_write_uids(void **state) {
  (void)state;
  ecs_ts_env_t e;
  const char *const extra[] = {"--shm-allow-uid", "65534", NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  assert_int_equal(as_nobody(&e, reader_puts), 0);
  ecs_client_t *c = shm_client(&e, NULL);
  assert_non_null(c);
  static uint8_t want[OBJ_BYTES], got[OBJ_BYTES];
  ecs_ts_fill(want, sizeof want, 3);
  uint64_t n = 0;
  assert_int_equal(ecs_ts_get1(c, "from-nobody", got, sizeof got, &n), ECS_OK);
  assert_int_equal(n, sizeof want);
  assert_memory_equal(got, want, sizeof want);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&e), 0);

  const char *const extra_w[] = {"--shm-write-uid", "65534", NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra_w), 0);
  assert_int_equal(as_nobody(&e, writer_attaches), 0);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* A uid in neither list: no map at all; the Unix socket carries copies,
 * as TCP would, and nothing of the pool is handed over. */
static int stranger_copies(const ecs_ts_env_t *e) {
  ecs_client_t *c = shm_client(e, NULL);
  if (!c)
    return 10;
  if (strcmp(ecs_client_transport(c), "unix") != 0)
    return 11;
  if (put_get_verified(c, "from-stranger", 4) != ECS_OK)
    return 12;
  ecs_key_t k = {"from-stranger", 13};
  ecs_view_t v;
  if (ecs_get_view_batch(c, &k, &v, 1) != ECS_OK || v.status != ECS_ENOTSUP)
    return 13;
  int pfd = -1;
  if (raw_attach(ecs__client_server_fd(c, 0), 0, &pfd) != ECS_EAUTH || pfd >= 0)
    return 14;
  ecs_client_close(c);
  return 0;
}

static void test_root_stranger_copies_over_socket(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  assert_int_equal(as_nobody(&e, stranger_copies), 0);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* ------------------------------------------------------------------ */
/* a listener at the socket path                                        */

/* Relays one connection from path to real, recording what the client
 * sends; descriptors the server passes (ATTACH) go through too. */
typedef struct relay {
  int lfd;            /* listening at the advertised path */
  char real[160];     /* the server's socket, moved aside */
  uint8_t rec[65536]; /* client -> server bytes */
  size_t nrec;        /* bytes recorded */
  int tamper;         /* flip the last byte of the client's second message (the PROVE's MAC) */
} relay_t;

/* Moves one message (with any passed fd) from a to b; -1 at EOF/error. */
static int relay_once(int a, int b, uint8_t *rec, size_t *nrec, size_t cap, int tamper) {
  uint8_t buf[65536];
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct iovec iov = {buf, sizeof buf};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
  ssize_t n = recvmsg(a, &mh, 0);
  if (n <= 0)
    return -1;
  if (tamper && *nrec == 32 + 8) /* the CHALLENGE is through: this is the PROVE */
    buf[n - 1] ^= 1;
  if (rec) {
    size_t k = (size_t)n < cap - *nrec ? (size_t)n : cap - *nrec;
    memcpy(rec + *nrec, buf, k);
    *nrec += k;
  }
  iov.iov_len = (size_t)n;
  if (mh.msg_controllen == 0)
    mh.msg_control = NULL;
  return sendmsg(b, &mh, MSG_NOSIGNAL) == n ? 0 : -1;
}

static void *relay_main(void *p) {
  relay_t *r = p;
  struct pollfd pl = {r->lfd, POLLIN, 0};
  if (poll(&pl, 1, 5000) != 1)
    return NULL;
  int cfd = accept(r->lfd, NULL, NULL), sfd = -1;
  if (cfd < 0 || ecs_net_connect_unix(r->real, ecs_now_ms() + 2000, &sfd) != ECS_OK) {
    if (cfd >= 0)
      close(cfd);
    return NULL;
  }
  for (;;) {
    struct pollfd ps[2] = {{cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(ps, 2, 5000) <= 0)
      break;
    if ((ps[0].revents & (POLLIN | POLLHUP)) &&
        relay_once(cfd, sfd, r->rec, &r->nrec, sizeof r->rec, r->tamper))
      break;
    if ((ps[1].revents & (POLLIN | POLLHUP)) && relay_once(sfd, cfd, NULL, NULL, 0, 0))
      break;
  }
  close(cfd);
  close(sfd);
  return NULL;
}

static const char TOKEN[] = "upgrade-token-7f3a9c";

static void write_token(char *path, size_t cap) {
  char dir[256];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(path, cap, "%s/token", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", TOKEN);
  fclose(f);
  assert_int_equal(chmod(path, 0600), 0);
}

/* Reads one reply header (and its records) from fd: its status. */
static int read_reply(int fd, uint8_t *meta, size_t cap, uint32_t *meta_len) {
  uint8_t hb[32];
  ecs_hdr_t h;
  if (ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + 2000) || ecs_proto_hdr_decode(hb, 0, &h) ||
      h.meta_len > cap || ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + 2000))
    return ECS_ECONN;
  *meta_len = h.meta_len;
  return h.status;
}

static void test_upgrade_sends_no_token_and_resists_replay(void **state) {
  (void)state;
  char tok[300];
  write_token(tok, sizeof tok);
  ecs_ts_env_t e;
  const char *const extra[] = {"--auth-token-file", tok, NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  /* the squatter: the server's socket moved aside (it keeps listening),
   * a listener of the same uid at the advertised path */
  static relay_t r;
  memset(&r, 0, sizeof r);
  snprintf(r.real, sizeof r.real, "%.100s.real", e.shm_path);
  assert_int_equal(rename(e.shm_path, r.real), 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%.100s", e.shm_path);
  r.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(r.lfd >= 0);
  assert_int_equal(bind(r.lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(r.lfd, 4), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, relay_main, &r), 0);
  ecs_client_t *c = shm_client(&e, TOKEN);
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "shm");
  assert_int_equal(put_get_verified(c, "through-relay", 5), ECS_OK);
  ecs_client_close(c);
  pthread_join(th, NULL);
  close(r.lfd);
  /* every byte the client sent there: an upgrade, then requests; never the token */
  assert_true(r.nrec >= 32 + 8 + 32 + 48);
  assert_null(memmem(r.rec, r.nrec, TOKEN, strlen(TOKEN)));
  uint8_t meta[512];
  uint32_t mlen = 0;
  /* the recorded CHALLENGE and PROVE, replayed on a fresh connection: a
   * new nonce, and the secret is spent: refused, connection closed */
  int fd = -1;
  assert_int_equal(ecs_net_connect_unix(r.real, ecs_now_ms() + 2000, &fd), ECS_OK);
  assert_int_equal(ecs_ts_raw_send(fd, r.rec, 32 + 8 + 32 + 48), ECS_OK);
  assert_int_equal(read_reply(fd, meta, sizeof meta, &mlen), ECS_OK);
  assert_int_equal(mlen, ECS_UPGRADE_NONCE_SIZE);
  assert_int_equal(read_reply(fd, meta, sizeof meta, &mlen), ECS_EAUTH);
  assert_true(ecs_ts_raw_wait_close(fd, 2000) >= 0);
  close(fd);
  /* nor does the socket take the token in a HELLO, right as it is */
  assert_int_equal(ecs_net_connect_unix(r.real, ecs_now_ms() + 2000, &fd), ECS_OK);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hello_t hl = {.token = (const uint8_t *)TOKEN,
                    .token_len = (uint16_t)strlen(TOKEN),
                    .ns = (const uint8_t *)"test",
                    .ns_len = 4};
  ecs_proto_hello_write(&w, &hl);
  uint8_t req[32 + 512];
  assert_true(w.len <= 512);
  ecs_ts_raw_hdr(req, ECS_OP_HELLO, 0, (uint32_t)w.len, 0);
  memcpy(req + 32, w.p, w.len);
  /* one write: the server answers the header alone and closes */
  assert_int_equal(ecs_ts_raw_send(fd, req, 32 + w.len), ECS_OK);
  assert_int_equal(read_reply(fd, meta, sizeof meta, &mlen), ECS_EAUTH);
  ecs_wbuf_free(&w);
  close(fd);
  rename(r.real, e.shm_path);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* A proof altered on its way is refused, and the client does not take the
 * refused socket for a usable one (a read-only client asks for no write
 * map, so the refusal must not read as "no map: copy over the socket"). */
static void test_tampered_proof_refused(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  static relay_t r;
  memset(&r, 0, sizeof r);
  r.tamper = 1;
  snprintf(r.real, sizeof r.real, "%.100s.real", e.shm_path);
  assert_int_equal(rename(e.shm_path, r.real), 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%.100s", e.shm_path);
  r.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(r.lfd >= 0);
  assert_int_equal(bind(r.lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(r.lfd, 4), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, relay_main, &r), 0);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e.servers, "shm");
  cfg.shm_read_only = 1;
  ecs_client_t *c = NULL;
  char err[256] = "";
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EAUTH);
  assert_null(c);
  assert_non_null(strstr(err, "shm upgrade"));
  pthread_join(th, NULL);
  close(r.lfd);
  rename(r.real, e.shm_path);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* One UPGRADE on the shm socket at path: CHALLENGE, then PROVE naming id
 * with the proof under secret (NULL: a wrong proof).  The PROVE's status. */
static int upgrade_once(const char *path, uint64_t id, const uint8_t *secret) {
  int fd = -1;
  if (ecs_net_connect_unix(path, ecs_now_ms() + 2000, &fd) != ECS_OK)
    return ECS_ECONN;
  uint8_t meta[512], req[32 + 128];
  uint32_t mlen = 0;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_upgrade_t u = {.phase = ECS_UPGRADE_CHALLENGE};
  ecs_proto_upgrade_write(&w, &u);
  ecs_ts_raw_hdr(req, ECS_OP_UPGRADE, 0, (uint32_t)w.len, 0);
  memcpy(req + 32, w.p, w.len);
  int rc = ecs_ts_raw_send(fd, req, 32 + w.len);
  if (rc == ECS_OK)
    rc = read_reply(fd, meta, sizeof meta, &mlen);
  if (rc == ECS_OK && mlen != ECS_UPGRADE_NONCE_SIZE)
    rc = ECS_EPROTO;
  if (rc == ECS_OK) {
    u = (ecs_upgrade_t){.phase = ECS_UPGRADE_PROVE, .upgrade_id = id};
    if (secret)
      ecs__hmac_sha256(secret, ECS_UPGRADE_SECRET_SIZE, meta, ECS_UPGRADE_NONCE_SIZE, u.mac);
    ecs_wbuf_reset(&w);
    ecs_proto_upgrade_write(&w, &u);
    ecs_ts_raw_hdr(req, ECS_OP_UPGRADE, 0, (uint32_t)w.len, 0);
    memcpy(req + 32, w.p, w.len);
    rc = ecs_ts_raw_send(fd, req, 32 + w.len);
    if (rc == ECS_OK)
      rc = read_reply(fd, meta, sizeof meta, &mlen);
  }
  ecs_wbuf_free(&w);
  close(fd);
  return rc;
}

/* Another local client races a victim's one-time upgrade secret: it
 * cannot guess the secret, but before, the secret's id was the victim's
 * connection number (1, 2, 3, ...) and the first PROVE naming an id spends
 * its secret, right or wrong.  Naming every small id must not spend the
 * victim's: its upgrade still succeeds. */
static void test_upgrade_secret_not_raceable(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  /* the victim: a HELLO over TCP, its reply's id and secret */
  int vfd = -1;
  assert_int_equal(ecs_net_connect("127.0.0.1", e.server.port, 2000, &vfd), ECS_OK);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hello_t hl = {.ns = (const uint8_t *)"test", .ns_len = 4};
  ecs_proto_hello_write(&w, &hl);
  uint8_t req[32 + 64], meta[512];
  ecs_ts_raw_hdr(req, ECS_OP_HELLO, 0, (uint32_t)w.len, 0);
  memcpy(req + 32, w.p, w.len);
  assert_int_equal(ecs_ts_raw_send(vfd, req, 32 + w.len), ECS_OK);
  ecs_wbuf_free(&w);
  uint32_t mlen = 0;
  assert_int_equal(read_reply(vfd, meta, sizeof meta, &mlen), ECS_OK);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, mlen);
  ecs_hello_reply_t hr;
  assert_int_equal(ecs_proto_hello_reply_read(&r, &hr), ECS_OK);
  assert_true(hr.upgrade_id != 0);
  /* the racer: a wrong proof for every id a counter could have reached */
  for (uint64_t id = 1; id <= 64; id++)
    assert_int_equal(upgrade_once(e.shm_path, id, NULL), ECS_EAUTH);
  /* the victim's secret is still good */
  assert_int_equal(upgrade_once(e.shm_path, hr.upgrade_id, hr.upgrade_secret), ECS_OK);
  close(vfd);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* ------------------------------------------------------------------ */
/* the socket's directory                                               */

/* Starts a server with argv's extra arguments and no --shm-socket unless
 * given; 0 when it listens, -1 when it exited (its log in p->log). */
static int start_bare(ecs_ts_proc_t *p, const char *shm) {
  memset(p, 0, sizeof *p);
  if (ecs_ts_mkdtemp(p->dir, sizeof p->dir) != 0)
    return -1;
  p->port = ecs_ts_free_port();
  char listen[32], bin[512];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", p->port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,           "--listen", listen, "--redis", "none",
                  "--pool-size", "8M",       "--ns", "test",    shm ? "--shm-socket" : NULL,
                  (char *)shm,   NULL};
  if (ecs_ts_spawn(p, argv) != 0)
    return -1;
  return ecs_ts_wait_port(p, p->port, 10000);
}

static int log_has(const ecs_ts_proc_t *p, const char *what) {
  char buf[8192];
  FILE *f = fopen(p->log, "r");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  if (!strstr(buf, what)) {
    fprintf(stderr, "log lacks \"%s\":\n%s\n", what, buf);
    return 0;
  }
  return 1;
}

static void test_socket_dir_squat_and_hostile(void **state) {
  (void)state;
  /* the old default path taken by someone else: the server starts anyway,
   * in a directory of its own, and clients find it through HELLO */
  ecs_ts_proc_t p;
  memset(&p, 0, sizeof p);
  int port = ecs_ts_free_port();
  char squat[64];
  snprintf(squat, sizeof squat, "/tmp/ecstore-%d.sock", port);
  FILE *f = fopen(squat, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(ecs_ts_mkdtemp(p.dir, sizeof p.dir), 0);
  p.port = port;
  char listen[32], bin[512];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin, "--listen", listen, "--redis", "none", "--pool-size", "8M", "--ns", "test", NULL};
  assert_int_equal(ecs_ts_spawn(&p, argv), 0);
  int up = ecs_ts_wait_port(&p, port, 10000);
  unlink(squat);
  assert_int_equal(up, 0);
  char servers[32];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, servers, "shm");
  ecs_client_t *c = ecs_ts_connect(&cfg);
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "shm");
  assert_int_equal(put_get_verified(c, "k", 6), ECS_OK);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&p, 5000), 0);

  /* a directory everyone may write: refused, saying so */
  char dir[256], sock[300];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  assert_int_equal(chmod(dir, 0777), 0);
  snprintf(sock, sizeof sock, "%s/s.sock", dir);
  assert_int_equal(start_bare(&p, sock), -1);
  assert_true(log_has(&p, "writable by group or others"));
  assert_true(log_has(&p, dir));
  ecs_ts_stop(&p, 5000);
  /* as root, a directory of another user's: refused too */
  if (geteuid() == 0) {
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chown(dir, NOBODY, NOBODY), 0);
    assert_int_equal(start_bare(&p, sock), -1);
    assert_true(log_has(&p, "owned by another user"));
    ecs_ts_stop(&p, 5000);
  }
  rmdir(dir);
}

/* N12: another user makes /tmp/ecstore-UID before a server of uid UID
 * starts there (no XDG_RUNTIME_DIR; before: the server refused to start).
 * The server takes a fresh directory of its own (mkdtemp), says so, and
 * serves; clients find the socket through HELLO.  Root only: it plays the
 * server's user (uid 4242) and the squatter (nobody). */
static void test_root_tmp_dir_squatted(void **state) {
  (void)state;
  const unsigned uid = 4242;
  char squat[64];
  snprintf(squat, sizeof squat, "/tmp/ecstore-%u", uid);
  rmdir(squat);
  assert_int_equal(mkdir(squat, 0755), 0);
  assert_int_equal(chown(squat, NOBODY, NOBODY), 0);
  ecs_ts_proc_t p;
  memset(&p, 0, sizeof p);
  assert_int_equal(ecs_ts_mkdtemp(p.dir, sizeof p.dir), 0);
  assert_int_equal(chown(p.dir, uid, uid), 0);
  snprintf(p.log, sizeof p.log, "%s/server.log", p.dir);
  p.port = ecs_ts_free_port();
  char listen[32], bin[512];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", p.port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0); /* its own group, as ecs_ts_spawn's: ecs_ts_stop signals the group */
    int fd = open(p.log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0 || fchown(fd, uid, uid) != 0)
      _exit(3);
    unsetenv("XDG_RUNTIME_DIR");
    if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0)
      _exit(3);
    execl(bin, bin, "--listen", listen, "--redis", "none", "--pool-size", "8M", "--ns", "test", (char *)NULL);
    _exit(4);
  }
  assert_true(pid > 0);
  p.pid = pid;
  int up = ecs_ts_wait_port(&p, p.port, 10000);
  assert_int_equal(up, 0);
  assert_true(log_has(&p, "is owned by another user"));
  assert_true(log_has(&p, "instead (clients find it through HELLO)"));
  char servers[32];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", p.port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, servers, "tcp");
  ecs_client_t *c = ecs_ts_connect(&cfg);
  assert_non_null(c);
  assert_int_equal(put_get_verified(c, "k-squat", 8), ECS_OK);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&p, 5000), 0);
  rmdir(squat);
}

#define ROOT_ONLY "test_root_*"

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc > 1 && strcmp(argv[1], "--root-only") == 0) {
    if (geteuid() != 0) {
      printf("skip: %s need root (they switch to uid %u)\n", ROOT_ONLY, NOBODY);
      return 77;
    }
    cmocka_set_test_filter(ROOT_ONLY);
  } else {
    cmocka_set_skip_filter(ROOT_ONLY);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_root_reader_cannot_write_pool),
      cmocka_unit_test(test_root_write_uids),
      cmocka_unit_test(test_root_stranger_copies_over_socket),
      cmocka_unit_test(test_root_tmp_dir_squatted),
      cmocka_unit_test(test_upgrade_sends_no_token_and_resists_replay),
      cmocka_unit_test(test_tampered_proof_refused),
      cmocka_unit_test(test_upgrade_secret_not_raceable),
      cmocka_unit_test(test_socket_dir_squat_and_hostile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
