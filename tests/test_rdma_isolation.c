/*
 * RDMA tenant isolation (issue 13), as attacks: the real server loop in a
 * thread, real clients, the verbs of both going to the in-process
 * emulation, which checks rkeys, their PD, bounds and access exactly where
 * a responder NIC does (IBV_WC_REM_ACCESS_ERR, an ECS_EIO item here).
 *
 * The attacker is an authenticated client of its own: a raw TCP
 * connection that says HELLO and RDMA_CONNECT like libecstore, and its own
 * verbs context, endpoint and buffers.  It holds no lease or reservation on
 * the victim's object and tries every rkey it can learn: the region its
 * blob advertises (the whole pool, before the fix), every key the device
 * has handed out (guessed: the emulation's keys are sequential, a real
 * NIC's little better), the victim's live lease key (leaked), and its own
 * keys after release, commit or expiry.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/core/checksum.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "store/rdma/rdma.h"
#include "store/server/server.h"
#include "support/fixture.h"
#include "support/raw.h"
#include "support/verbs_emu.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define OBJ (256 * KIB) /* the victim's object */
#define IO_MS 3000

typedef struct env {
  ecs_verbs_emu *emu;
  ecs_server_t *srv;
  pthread_t th;
  char servers[64];
} env_t;

static void *serve(void *p) {
  ecs_server_run(p);
  return NULL;
}

/* A server in this process over one emulated device; lease_ms 0: default. */
static void start(env_t *e, int lease_ms) {
  memset(e, 0, sizeof *e);
  assert_int_equal(ecs_verbs_emu_create(1, &e->emu), ECS_OK);
  ecs__rdma_set_ops_override(ecs_verbs_emu_ops(e->emu));
  ecs_server_opts_t o;
  ecs_server_opts_init(&o);
  o.listen_port = 0;
  o.pool_size = 16 * MIB;
  o.lock_pool = 0;
  if (lease_ms)
    o.lease_timeout_ms = lease_ms;
  snprintf(o.redis_url, sizeof o.redis_url, "none");
  snprintf(o.ns, sizeof o.ns, "test");
  snprintf(o.shm_socket, sizeof o.shm_socket, "off");
  snprintf(o.rdma, sizeof o.rdma, "on");
  assert_int_equal(ecs_server_create(&o, &e->srv), ECS_OK);
  snprintf(e->servers, sizeof e->servers, "127.0.0.1:%d", ecs_server_port(e->srv));
  assert_int_equal(pthread_create(&e->th, NULL, serve, e->srv), 0);
}

static void stop(env_t *e) {
  ecs_server_stop(e->srv);
  pthread_join(e->th, NULL);
  ecs_server_destroy(e->srv);
  ecs_verbs_emu_counts cnt;
  ecs_verbs_emu_get_counts(e->emu, &cnt);
  ecs__rdma_set_ops_override(NULL);
  ecs_verbs_emu_destroy(e->emu);
  assert_int_equal(cnt.qps, 0); /* every window, QP and PD was given back */
  assert_int_equal(cnt.mrs, 0);
  assert_int_equal(cnt.pds, 0);
}

static ecs_client_t *client(const env_t *e) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e->servers, "rdma");
  cfg.timeout_ms = IO_MS;
  ecs_client_t *c = ecs_ts_connect(&cfg);
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "rdma");
  return c;
}

static ecs_tensor_t tensor(const void *p, uint64_t n) {
  ecs_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.nbytes = n;
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  return t;
}

static void put1(ecs_client_t *c, const char *key, const void *p, uint64_t n) {
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t = tensor(p, n);
  int st;
  assert_int_equal(ecs_put_batch(c, &k, &t, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
}

/* The stored object is still exactly want (read over RDMA by its owner). */
static void assert_intact(ecs_client_t *c, const char *key, const uint8_t *want, uint64_t n) {
  uint8_t *out = malloc(n);
  ecs_key_t k = {key, strlen(key)};
  ecs_get_buf_t b = {.data = out, .capacity = n};
  assert_int_equal(ecs_get_batch(c, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_OK);
  assert_int_equal(b.nbytes, n);
  assert_memory_equal(out, want, n);
  free(out);
}

/* ---- a raw RDMA peer ---------------------------------------------------- */

/* An authenticated connection with its own RDMA endpoint and one
 * registered buffer, speaking the protocol by hand. */
typedef struct peer {
  int fd;              /* the TCP control connection */
  ecs_rdma_ctx *ctx;   /* its own device context */
  ecs_rdma_ep *ep;     /* its endpoint, connected to the server */
  uint8_t *buf;        /* its registered buffer */
  size_t buf_len;      /* bytes of it */
  ecs_rdma_mr *mr;     /* its registration */
  uint8_t meta[65536]; /* the last reply's records */
  ecs_hdr_t rh;        /* the last reply's header */
} peer_t;

/* One request (meta only) and its reply into p->meta / p->rh. */
static int call(peer_t *p, uint8_t op, uint32_t count, const void *meta, uint32_t meta_len) {
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, op, count, meta_len, 0);
  if (ecs_ts_raw_send(p->fd, hb, sizeof hb) || (meta_len && ecs_ts_raw_send(p->fd, meta, meta_len)))
    return ECS_ECONN;
  uint64_t dl = ecs_now_ms() + IO_MS;
  if (ecs_net_read_all(p->fd, hb, sizeof hb, dl) || ecs_proto_hdr_decode(hb, UINT64_MAX, &p->rh) ||
      p->rh.meta_len > sizeof p->meta || p->rh.data_len ||
      ecs_net_read_all(p->fd, p->meta, p->rh.meta_len, dl))
    return ECS_EPROTO;
  return p->rh.status;
}

/* RDMA_CONNECT with our blob; the server's comes back. */
static int exchange(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE], uint8_t remote[ECS_RDMA_BLOB_SIZE],
                    int timeout_ms) {
  (void)timeout_ms;
  peer_t *p = arg;
  int rc = call(p, ECS_OP_RDMA_CONNECT, 0, local, ECS_RDMA_BLOB_SIZE);
  if (rc)
    return rc;
  if (p->rh.meta_len != ECS_RDMA_BLOB_SIZE)
    return ECS_EPROTO;
  memcpy(remote, p->meta, ECS_RDMA_BLOB_SIZE);
  return ECS_OK;
}

static void peer_open(peer_t *p, const env_t *e, size_t buf_len) {
  memset(p, 0, sizeof *p);
  assert_int_equal(ecs_ts_raw_open(ecs_server_port(e->srv), "test", &p->fd), ECS_OK);
  assert_int_equal(ecs_rdma_ctx_open(NULL, ecs_verbs_emu_ops(e->emu), &p->ctx, NULL, 0), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(p->ctx, NULL, &p->ep), ECS_OK);
  ecs_rdma_ep_set_exchange(p->ep, exchange, p); /* rebuilds after each access error */
  uint8_t local[ECS_RDMA_BLOB_SIZE], remote[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(p->ep, local), ECS_OK);
  assert_int_equal(exchange(p, local, remote, IO_MS), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(p->ep, remote, sizeof remote), ECS_OK);
  p->buf_len = buf_len;
  p->buf = calloc(1, buf_len);
  assert_non_null(p->buf);
  assert_int_equal(ecs_rdma_reg(p->ctx, p->buf, buf_len, 0, &p->mr), ECS_OK);
}

static void peer_close(peer_t *p) {
  close(p->fd);
  ecs_rdma_ep_destroy(p->ep);
  ecs_rdma_dereg(p->mr);
  ecs_rdma_ctx_close(p->ctx);
  free(p->buf);
}

/* One RDMA READ (write 0) or WRITE (write 1) of len bytes between the
 * peer's buffer and (addr, rkey) on the server; the item's status. */
static int rdma_io(peer_t *p, int write, uint64_t addr, uint32_t rkey, uint64_t len) {
  ecs_rdma_item it = {.local = p->mr, .local_off = 0, .remote_addr = addr, .rkey = rkey, .len = len};
  int st = ECS_OK;
  int rc = write ? ecs_rdma_write_batch(p->ep, &it, 1, &st, IO_MS)
                 : ecs_rdma_read_batch(p->ep, &it, 1, &st, IO_MS);
  return rc ? rc : st;
}

/* LEASE one key: its record. */
static ecs_lease_reply_t lease(peer_t *p, const char *key) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_key_write(&w, key, (uint16_t)strlen(key));
  assert_int_equal(call(p, ECS_OP_LEASE, 1, w.p, (uint32_t)w.len), ECS_OK);
  ecs_wbuf_free(&w);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p->meta, p->rh.meta_len);
  ecs_lease_reply_t l;
  assert_int_equal(ecs_proto_lease_reply_read(&r, &l), ECS_OK);
  return l;
}

static int release(peer_t *p, uint64_t id) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_u64_write(&w, id);
  int rc = call(p, ECS_OP_RELEASE, 1, w.p, (uint32_t)w.len);
  ecs_wbuf_free(&w);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p->meta, p->rh.meta_len);
  int32_t st = ECS_EPROTO;
  if (rc == ECS_OK)
    ecs_proto_status_read(&r, &st);
  return st;
}

/* RESERVE one raw u8 object of n bytes whose content will checksum to sum. */
static ecs_reserve_reply_t reserve(peer_t *p, const char *key, uint64_t n, uint64_t sum) {
  ecs_put_item_t it = {.key = (const uint8_t *)key, .key_len = (uint16_t)strlen(key)};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = n;
  it.nbytes = it.raw_nbytes = n;
  it.checksum = sum;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_put_item_write(&w, &it);
  assert_int_equal(call(p, ECS_OP_RESERVE, 1, w.p, (uint32_t)w.len), ECS_OK);
  ecs_wbuf_free(&w);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p->meta, p->rh.meta_len);
  ecs_reserve_reply_t rr;
  assert_int_equal(ecs_proto_reserve_reply_read(&r, &rr), ECS_OK);
  return rr;
}

static int commit(peer_t *p, uint64_t resv_id, uint64_t sum) {
  ecs_commit_item_t ci = {.resv_id = resv_id, .checksum = sum};
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_commit_item_write(&w, &ci);
  int rc = call(p, ECS_OP_COMMIT, 1, w.p, (uint32_t)w.len);
  ecs_wbuf_free(&w);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p->meta, p->rh.meta_len);
  int32_t st = ECS_EPROTO;
  if (rc == ECS_OK)
    ecs_proto_status_read(&r, &st);
  return st;
}

/* Does the peer's buffer hold the victim's bytes anywhere? */
static int holds(const peer_t *p, const uint8_t *victim) {
  for (size_t i = 0; i + 4096 <= p->buf_len; i++)
    if (p->buf[i] == victim[0] && !memcmp(p->buf + i, victim, 4096))
      return 1;
  return 0;
}

/* ---- windows, at the transport level ---------------------------------------- */

/* A server-side isolated endpoint and the client endpoint connected to it. */
typedef struct pair {
  ecs_rdma_ep *sep; /* isolated (own PD) */
  ecs_rdma_ep *cep; /* plain */
} pair_t;

/* The client's exchange callback: the "server" resets and connects. */
static int pair_exchange(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE],
                         uint8_t remote[ECS_RDMA_BLOB_SIZE], int timeout_ms) {
  (void)timeout_ms;
  pair_t *p = arg;
  int rc = ecs_rdma_ep_reset(p->sep);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_connect(p->sep, local, ECS_RDMA_BLOB_SIZE);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_local_blob(p->sep, remote);
  return rc;
}

static void pair_open(pair_t *p, ecs_rdma_ctx *sctx, ecs_rdma_ctx *cctx) {
  assert_int_equal(ecs_rdma_ep_create_isolated(sctx, &p->sep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(cctx, NULL, &p->cep), ECS_OK);
  ecs_rdma_ep_set_exchange(p->cep, pair_exchange, p);
  uint8_t local[ECS_RDMA_BLOB_SIZE], remote[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(p->cep, local), ECS_OK);
  assert_int_equal(pair_exchange(p, local, remote, 0), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(p->cep, remote, sizeof remote), ECS_OK);
}

static int io(ecs_rdma_ep *ep, int write, ecs_rdma_mr *local, uint64_t addr, uint32_t rkey, uint64_t len) {
  ecs_rdma_item it = {.local = local, .remote_addr = addr, .rkey = rkey, .len = len};
  int st = ECS_OK;
  int rc = write ? ecs_rdma_write_batch(ep, &it, 1, &st, IO_MS) : ecs_rdma_read_batch(ep, &it, 1, &st, IO_MS);
  return rc ? rc : st;
}

/* A window is its block alone, zero-based, with its access alone, for its
 * endpoint's peer alone, until it is closed; the emulation refuses the
 * rest with a remote access error, as a responder NIC does. */
static void test_windows(void **state) {
  (void)state;
  ecs_verbs_emu *emu;
  assert_int_equal(ecs_verbs_emu_create(1, &emu), ECS_OK);
  const ecs_verbs_ops *ops = ecs_verbs_emu_ops(emu);
  ecs_rdma_ctx *sctx, *cctx;
  assert_int_equal(ecs_rdma_ctx_open(NULL, ops, &sctx, NULL, 0), ECS_OK);
  assert_int_equal(ecs_rdma_ctx_open(NULL, ops, &cctx, NULL, 0), ECS_OK);
  enum { POOL = 64 * 1024 };
  uint8_t *pool = malloc(POOL), *buf = calloc(1, POOL);
  ecs_ts_fill(pool, POOL, 5);
  ecs_rdma_mr *bmr;
  assert_int_equal(ecs_rdma_reg(cctx, buf, POOL, 0, &bmr), ECS_OK);
  pair_t p1, p2;
  pair_open(&p1, sctx, cctx);
  pair_open(&p2, sctx, cctx);
  uint64_t a, l;
  uint32_t k;
  assert_int_equal(ecs_rdma_ep_peer_region(p1.cep, &a, &l, &k), ECS_ENOTFOUND); /* no address revealed */

  ecs_rdma_mr *w1, *w2, *bad;
  assert_int_equal(ecs_rdma_ep_window(p1.cep, pool, 4096, ECS_RDMA_REMOTE_READ, &bad),
                   ECS_EINVAL); /* not isolated */
  assert_int_equal(ecs_rdma_ep_window(p1.sep, pool, 4096, 0, &bad), ECS_EINVAL);
  assert_int_equal(ecs_rdma_ep_window(p1.sep, pool + 4096, 8192, ECS_RDMA_REMOTE_READ, &w1), ECS_OK);
  assert_int_equal(ecs_rdma_ep_window(p2.sep, pool + 16384, 4096, ECS_RDMA_REMOTE_WRITE, &w2), ECS_OK);
  assert_int_equal(ecs_rdma_mr_addr(w1), 0);
  uint32_t k1 = ecs_rdma_mr_rkey(w1), k2 = ecs_rdma_mr_rkey(w2);

  assert_int_equal(io(p1.cep, 0, bmr, 0, k1, 8192), ECS_OK);
  assert_memory_equal(buf, pool + 4096, 8192);
  assert_int_equal(io(p1.cep, 0, bmr, 8191, k1, 2), ECS_EIO);                             /* past its end */
  assert_int_equal(io(p1.cep, 0, bmr, (uint64_t)(uintptr_t)pool + 4096, k1, 8), ECS_EIO); /* by address */
  assert_int_equal(io(p1.cep, 1, bmr, 0, k1, 8), ECS_EIO);                                /* read-only */
  assert_int_equal(io(p1.cep, 1, bmr, 0, k2, 8), ECS_EIO);                                /* another's PD */
  assert_int_equal(io(p2.cep, 0, bmr, 0, k2, 8), ECS_EIO);                                /* write-only */
  memset(buf, 0xab, 4096);
  assert_int_equal(io(p2.cep, 1, bmr, 0, k2, 4096), ECS_OK);
  for (int i = 0; i < 4096; i++)
    assert_int_equal(pool[16384 + i], 0xab);
  ecs_rdma_item as_local = {.local = w1, .remote_addr = 0, .rkey = k2, .len = 8};
  int st;
  assert_int_equal(ecs_rdma_write_batch(p2.cep, &as_local, 1, &st, IO_MS), ECS_OK);
  assert_int_equal(st, ECS_EINVAL); /* a window is never a local buffer */
  ecs_rdma_dereg(w1);
  assert_int_equal(io(p1.cep, 0, bmr, 0, k1, 8), ECS_EIO); /* closed: dead */
  ecs_rdma_dereg(w2);
  assert_int_equal(io(p2.cep, 1, bmr, 0, k2, 8), ECS_EIO);

  ecs_rdma_ep_destroy(p1.cep);
  ecs_rdma_ep_destroy(p1.sep);
  ecs_rdma_ep_destroy(p2.cep);
  ecs_rdma_ep_destroy(p2.sep);
  ecs_rdma_dereg(bmr);
  ecs_rdma_ctx_close(cctx);
  ecs_rdma_ctx_close(sctx);
  ecs_verbs_emu_counts n;
  ecs_verbs_emu_get_counts(emu, &n);
  assert_int_equal(n.pds + n.mrs + n.qps + n.cqs + n.contexts + n.cq_overruns, 0);
  ecs_verbs_emu_destroy(emu);
  free(pool);
  free(buf);
}

/* ---- the attacks ------------------------------------------------------------ */

/* A second client, with no lease or reservation, reads and overwrites
 * another client's object with every rkey it can learn or guess.  Before
 * the fix its blob advertised the whole pool, readable and writable. */
static void test_no_lease_no_access(void **state) {
  (void)state;
  env_t e;
  start(&e, 0);
  ecs_client_t *owner = client(&e);
  uint8_t *victim = malloc(OBJ);
  ecs_ts_fill(victim, OBJ, 77);
  put1(owner, "victim", victim, OBJ);
  /* a second owner connection holds a live lease, so a window onto the
   * victim's block exists while the attacker guesses */
  peer_t holder;
  peer_open(&holder, &e, OBJ);
  ecs_lease_reply_t hl = lease(&holder, "victim");
  assert_int_equal(hl.status, ECS_OK);

  peer_t a;
  peer_open(&a, &e, 16 * MIB);
  /* 1. whatever the server's blob advertises (before: the pool, with its
   *    virtual address; now: nothing) */
  uint64_t raddr = 0, rlen = 0;
  uint32_t rkey = 0;
  if (ecs_rdma_ep_peer_region(a.ep, &raddr, &rlen, &rkey) == ECS_OK) {
    uint64_t n = rlen < a.buf_len ? rlen : a.buf_len;
    int st = rdma_io(&a, 0, raddr, rkey, n);
    assert_false(st == ECS_OK && holds(&a, victim)); /* read another tenant's object */
    memset(a.buf, 0xee, a.buf_len);
    (void)rdma_io(&a, 1, raddr, rkey, n); /* overwrite the pool */
    assert_intact(owner, "victim", victim, OBJ);
  }
  /* 2. every key the device has handed out so far, zero-based and at the
   *    pool's address: reads and writes */
  for (uint32_t k = 0x100; k < 0x140; k++) {
    uint32_t guess = (k << 8) | 0xa5;
    const uint64_t addrs[2] = {0, raddr};
    for (int i = 0; i < 2; i++) {
      memset(a.buf, 0, OBJ);
      int st = rdma_io(&a, 0, addrs[i], guess, OBJ);
      assert_false(st == ECS_OK && holds(&a, victim));
      memset(a.buf, 0xee, OBJ);
      (void)rdma_io(&a, 1, addrs[i], guess, OBJ);
    }
  }
  assert_intact(owner, "victim", victim, OBJ);
  assert_int_equal(release(&holder, hl.lease_id), ECS_OK);
  peer_close(&a);
  peer_close(&holder);
  ecs_client_close(owner);
  free(victim);
  stop(&e);
}

/* A leaked live rkey is useless on another connection; a lease's window
 * reads its block only, never writes it, and dies at release; a
 * reservation's is written, never read, and dies at commit. */
static void test_rkey_scope_and_lifetime(void **state) {
  (void)state;
  env_t e;
  start(&e, 0);
  ecs_client_t *owner = client(&e);
  uint8_t *victim = malloc(OBJ);
  ecs_ts_fill(victim, OBJ, 78);
  put1(owner, "victim", victim, OBJ);
  peer_t v, a;
  peer_open(&v, &e, OBJ);
  peer_open(&a, &e, OBJ);

  ecs_lease_reply_t l = lease(&v, "victim");
  assert_int_equal(l.status, ECS_OK);
  assert_int_not_equal(l.rkey, 0);
  assert_int_equal(rdma_io(&v, 0, 0, l.rkey, OBJ), ECS_OK); /* zero-based: [0, nbytes) */
  assert_memory_equal(v.buf, victim, OBJ);
  /* the leaked key on another connection: an access error both ways */
  memset(a.buf, 0, OBJ);
  assert_int_equal(rdma_io(&a, 0, 0, l.rkey, OBJ), ECS_EIO);
  assert_false(holds(&a, victim));
  memset(a.buf, 0xee, OBJ);
  assert_int_equal(rdma_io(&a, 1, 0, l.rkey, OBJ), ECS_EIO);
  /* the owner of the lease: no write, no byte past the block */
  memset(v.buf, 0xee, OBJ);
  assert_int_equal(rdma_io(&v, 1, 0, l.rkey, 16), ECS_EIO);
  assert_int_equal(rdma_io(&v, 0, 1, l.rkey, OBJ), ECS_EIO);
  assert_int_equal(rdma_io(&v, 0, 0, l.rkey, OBJ), ECS_OK); /* still good after those */
  assert_memory_equal(v.buf, victim, OBJ);
  /* released: the key is dead */
  assert_int_equal(release(&v, l.lease_id), ECS_OK);
  memset(v.buf, 0, OBJ);
  assert_int_equal(rdma_io(&v, 0, 0, l.rkey, OBJ), ECS_EIO);
  assert_false(holds(&v, victim));

  /* a reservation: written through its window, never read, dead at commit */
  uint8_t *mine = malloc(OBJ);
  ecs_ts_fill(mine, OBJ, 79);
  uint64_t sum = ecs_checksum(mine, OBJ);
  ecs_reserve_reply_t rr = reserve(&v, "mine", OBJ, sum);
  assert_int_equal(rr.status, ECS_OK);
  assert_int_not_equal(rr.rkey, 0);
  assert_int_equal(rdma_io(&v, 0, 0, rr.rkey, OBJ), ECS_EIO); /* no read: freed bytes stay unseen */
  memset(a.buf, 0xee, OBJ);
  assert_int_equal(rdma_io(&a, 1, 0, rr.rkey, OBJ), ECS_EIO); /* nor another's write */
  memcpy(v.buf, mine, OBJ);
  assert_int_equal(rdma_io(&v, 1, 0, rr.rkey, OBJ), ECS_OK);
  assert_int_equal(commit(&v, rr.resv_id, sum), ECS_OK);
  memset(v.buf, 0xee, OBJ);
  assert_int_equal(rdma_io(&v, 1, 0, rr.rkey, OBJ), ECS_EIO); /* committed: the key is dead */
  assert_intact(owner, "mine", mine, OBJ);
  assert_intact(owner, "victim", victim, OBJ);

  peer_close(&a);
  peer_close(&v);
  ecs_client_close(owner);
  free(victim);
  free(mine);
  stop(&e);
}

/* A lease or reservation the server drops at expiry takes its window
 * with it. */
static void test_rkey_dies_at_expiry(void **state) {
  (void)state;
  env_t e;
  start(&e, 200);
  ecs_client_t *owner = client(&e);
  uint8_t *victim = malloc(OBJ);
  ecs_ts_fill(victim, OBJ, 80);
  put1(owner, "victim", victim, OBJ);
  peer_t v;
  peer_open(&v, &e, OBJ);
  ecs_lease_reply_t l = lease(&v, "victim");
  assert_int_equal(l.status, ECS_OK);
  ecs_reserve_reply_t rr = reserve(&v, "late", OBJ, 0);
  assert_int_equal(rr.status, ECS_OK);
  assert_int_equal(rdma_io(&v, 0, 0, l.rkey, OBJ), ECS_OK);
  usleep(700 * 1000); /* past the 200 ms lease timeout and a tick */
  memset(v.buf, 0, OBJ);
  assert_int_equal(rdma_io(&v, 0, 0, l.rkey, OBJ), ECS_EIO);
  assert_false(holds(&v, victim));
  assert_int_equal(rdma_io(&v, 1, 0, rr.rkey, OBJ), ECS_EIO);
  assert_int_equal(release(&v, l.lease_id), ECS_ENOTFOUND);
  assert_intact(owner, "victim", victim, OBJ);
  peer_close(&v);
  ecs_client_close(owner);
  free(victim);
  stop(&e);
}

/* The allocating get over RDMA allocates no more than the client's
 * max_object_size, whatever size the server declares (as over TCP:
 * ECS_EBUFSMALL with nbytes the size). */
static void test_alloc_get_capped(void **state) {
  (void)state;
  env_t e;
  start(&e, 0);
  ecs_client_t *w = client(&e);
  uint8_t *obj = malloc(OBJ);
  ecs_ts_fill(obj, OBJ, 81);
  put1(w, "big", obj, OBJ);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e.servers, "rdma");
  cfg.timeout_ms = IO_MS;
  cfg.max_object_size = OBJ - 1;
  ecs_client_t *r = ecs_ts_connect(&cfg);
  assert_non_null(r);
  assert_string_equal(ecs_client_transport(r), "rdma");
  ecs_key_t k = {"big", 3};
  ecs_get_buf_t b;
  memset(&b, 0, sizeof b);
  assert_int_equal(ecs_get_batch_alloc(r, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_EBUFSMALL);
  assert_int_equal(b.nbytes, OBJ);
  assert_null(b.data);
  ecs_client_close(r);
  cfg.max_object_size = OBJ; /* at the cap: allowed */
  r = ecs_ts_connect(&cfg);
  assert_non_null(r);
  memset(&b, 0, sizeof b);
  assert_int_equal(ecs_get_batch_alloc(r, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_OK);
  assert_memory_equal(b.data, obj, OBJ);
  ecs_free(b.data);
  ecs_client_close(r);
  ecs_client_close(w);
  free(obj);
  stop(&e);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_windows),
      cmocka_unit_test(test_no_lease_no_access),
      cmocka_unit_test(test_rkey_scope_and_lifetime),
      cmocka_unit_test(test_rkey_dies_at_expiry),
      cmocka_unit_test(test_alloc_get_capped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
