/* RDMA transport against the in-process verbs emulation: a "server" (pool
 * MR, advertised in its blob) and a "client" (its own buffer MR) in one
 * process, connected by a blob exchange.  Round trips, slicing, big
 * batches, every injected error completion (each item gets its own status,
 * the others succeed where they can, the endpoint works afterwards), bounded
 * timeouts, blob validation, no device.  Every test ends by checking that no
 * verbs object leaked.  Built without libibverbs, only the blob codec and
 * the ECS_ENOTSUP answers are tested. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "store/rdma/rdma.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

/* ---- Blob codec (every build) ---------------------------------------------- */

static ecs_rdma_blob sample_blob(void) {
  ecs_rdma_blob b = {.qpn = 0x1234,
                     .psn = 0xabcdef,
                     .lid = 0,
                     .mtu = 5,
                     .rd_atom = 16,
                     .link_layer = 2,
                     .port = 1,
                     .has_region = 1,
                     .region_addr = 0x7f0000001000ull,
                     .region_len = 1ull << 30,
                     .region_rkey = 0xdeadbeef};
  for (int i = 0; i < 16; i++)
    b.gid[i] = (uint8_t)(0xf0 + i);
  return b;
}

static void test_blob_roundtrip(void **state) {
  (void)state;
  ecs_rdma_blob b = sample_blob(), d;
  uint8_t w[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_blob_encode(&b, w), ECS_OK);
  /* Little-endian on the wire, whatever the host. */
  assert_memory_equal(w, "ECRB", 4);
  assert_int_equal(w[4], 1);
  assert_int_equal(w[8], 0x34);
  assert_int_equal(w[9], 0x12);
  assert_int_equal(ecs_rdma_blob_decode(w, sizeof(w), &d), ECS_OK);
  assert_memory_equal(&b, &d, sizeof(b));
  /* Without a region the region bytes are zero and come back unset. */
  b.has_region = 0;
  assert_int_equal(ecs_rdma_blob_encode(&b, w), ECS_OK);
  for (int i = 40; i < 60; i++)
    assert_int_equal(w[i], 0);
  assert_int_equal(ecs_rdma_blob_decode(w, sizeof(w), &d), ECS_OK);
  assert_int_equal(d.has_region, 0);
  assert_int_equal(d.region_addr, 0);
  /* Encoding refuses what decoding would refuse. */
  b.qpn = 1u << 24;
  assert_int_equal(ecs_rdma_blob_encode(&b, w), ECS_EINVAL);
}

static void test_blob_validation(void **state) {
  (void)state;
  ecs_rdma_blob b = sample_blob(), d;
  uint8_t good[ECS_RDMA_BLOB_SIZE], w[ECS_RDMA_BLOB_SIZE + 1];
  assert_int_equal(ecs_rdma_blob_encode(&b, good), ECS_OK);
  struct {
    size_t off;
    uint8_t val;
  } bad[] = {
      {0, 'X'},  /* magic */
      {4, 2},    /* version */
      {5, 1},    /* version, high byte */
      {8, 0},    /* qpn 0 (with the next three) */
      {11, 1},   /* qpn over 24 bits */
      {15, 1},   /* psn over 24 bits */
      {18, 0},   /* mtu */
      {18, 6},   /* mtu */
      {19, 0},   /* READ depth */
      {20, 0},   /* link layer */
      {20, 3},   /* link layer */
      {55, 0x80} /* region wraps around (with the address's high byte, below) */
  };
  for (size_t i = 0; i < NELEM(bad); i++) {
    memcpy(w, good, ECS_RDMA_BLOB_SIZE);
    if (bad[i].off == 8)
      memset(w + 8, 0, 4);
    else
      w[bad[i].off] = bad[i].val;
    if (bad[i].off == 55)
      w[47] = 0xff;
    if (ecs_rdma_blob_decode(w, ECS_RDMA_BLOB_SIZE, &d) != ECS_EPROTO)
      fail_msg("mutation at byte %zu was accepted", bad[i].off);
  }
  /* A region of length 0. */
  memcpy(w, good, ECS_RDMA_BLOB_SIZE);
  memset(w + 48, 0, 8);
  assert_int_equal(ecs_rdma_blob_decode(w, ECS_RDMA_BLOB_SIZE, &d), ECS_EPROTO);
  /* Short, long, empty. */
  assert_int_equal(ecs_rdma_blob_decode(good, ECS_RDMA_BLOB_SIZE - 1, &d), ECS_EPROTO);
  memcpy(w, good, ECS_RDMA_BLOB_SIZE);
  assert_int_equal(ecs_rdma_blob_decode(w, ECS_RDMA_BLOB_SIZE + 1, &d), ECS_EPROTO);
  assert_int_equal(ecs_rdma_blob_decode(good, 0, &d), ECS_EPROTO);
  /* Reserved bytes and unknown flags are ignored (room for later fields). */
  memcpy(w, good, ECS_RDMA_BLOB_SIZE);
  w[22] = w[23] = w[60] = w[79] = 0x55;
  w[7] = 0x80;
  assert_int_equal(ecs_rdma_blob_decode(w, ECS_RDMA_BLOB_SIZE, &d), ECS_OK);
  assert_int_equal(d.qpn, b.qpn);
}

/* Random mutations: every blob either decodes to in-range fields or is
 * ECS_EPROTO; nothing is read outside the buffer (ASan). */
static void test_blob_mutation(void **state) {
  (void)state;
  ecs_rdma_blob b = sample_blob(), d;
  uint8_t good[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_blob_encode(&b, good), ECS_OK);
  uint64_t s = 42;
  int ok = 0, proto = 0;
  for (int iter = 0; iter < 20000; iter++) {
    size_t len = ECS_RDMA_BLOB_SIZE;
    if (rng_next(&s) % 16 == 0)
      len = rng_next(&s) % (ECS_RDMA_BLOB_SIZE + 1);
    uint8_t *w = malloc(len ? len : 1);
    memcpy(w, good, len);
    int flips = 1 + (int)(rng_next(&s) % 3);
    for (int f = 0; f < flips && len; f++)
      w[rng_next(&s) % len] ^= (uint8_t)(1u << (rng_next(&s) % 8));
    int rc = ecs_rdma_blob_decode(w, len, &d);
    free(w);
    if (rc == ECS_OK) {
      ok++;
      assert_true(d.qpn > 0 && d.qpn < (1u << 24) && d.psn < (1u << 24));
      assert_true(d.mtu >= 1 && d.mtu <= 5 && d.rd_atom > 0);
      assert_true(!d.has_region || (d.region_len > 0 && d.region_addr + d.region_len >= d.region_addr));
    } else {
      assert_int_equal(rc, ECS_EPROTO);
      proto++;
    }
  }
  assert_true(ok > 0 && proto > 0);
}

#ifndef ECS_HAVE_RDMA

static void test_enotsup(void **state) {
  (void)state;
  ecs_rdma_ctx *c = (ecs_rdma_ctx *)1;
  char err[128] = "";
  assert_int_equal(ecs_rdma_ctx_open(NULL, NULL, &c, err, sizeof(err)), ECS_ENOTSUP);
  assert_null(c);
  assert_non_null(strstr(err, "without libibverbs"));
  int st[2];
  assert_int_equal(ecs_rdma_read_batch(NULL, NULL, 2, st, 0), ECS_ENOTSUP);
  assert_int_equal(st[1], ECS_ENOTSUP);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blob_roundtrip),
      cmocka_unit_test(test_blob_validation),
      cmocka_unit_test(test_blob_mutation),
      cmocka_unit_test(test_enotsup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* ECS_HAVE_RDMA */

#include "support/verbs_emu.h"

static void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(rng_next(&s) >> 56);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- The two sides ------------------------------------------------------------ */

typedef struct world {
  ecs_verbs_emu *emu;
  ecs_rdma_ctx *sctx, *cctx; /* server and client contexts */
  uint8_t *pool;             /* server pool */
  size_t pool_len;
  ecs_rdma_mr *pool_mr; /* registered remote read+write, advertised */
  uint8_t *buf;         /* client buffer */
  size_t buf_len;
  ecs_rdma_mr *buf_mr;
  ecs_rdma_ep *sep, *cep; /* server and client endpoints */
  uint64_t raddr;         /* the pool as the client sees it */
  uint32_t rkey;
  int exchanges; /* calls of the exchange callback */
  int fail_exchange;
} world;

/* What the lead's control channel does on a reconnect: the server resets
 * its endpoint, connects it to the client's new blob and answers with its
 * own. */
static int exchange(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE], uint8_t peer[ECS_RDMA_BLOB_SIZE],
                    int timeout_ms) {
  world *w = arg;
  assert_true(timeout_ms > 0);
  w->exchanges++;
  if (w->fail_exchange)
    return ECS_ECONN;
  int rc = ecs_rdma_ep_reset(w->sep);
  if (!rc)
    rc = ecs_rdma_ep_connect(w->sep, local, ECS_RDMA_BLOB_SIZE);
  if (!rc)
    rc = ecs_rdma_ep_local_blob(w->sep, peer);
  return rc;
}

/* A manual exchange, as a caller without a callback does it. */
static void connect_pair(world *w) {
  uint8_t cb[ECS_RDMA_BLOB_SIZE], sb[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(w->cep, cb), ECS_OK);
  assert_int_equal(ecs_rdma_ep_reset(w->sep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(w->sep, cb, sizeof(cb)), ECS_OK);
  assert_int_equal(ecs_rdma_ep_local_blob(w->sep, sb), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(w->cep, sb, sizeof(sb)), ECS_OK);
  uint64_t len;
  assert_int_equal(ecs_rdma_ep_peer_region(w->cep, &w->raddr, &len, &w->rkey), ECS_OK);
  assert_int_equal(w->raddr, (uint64_t)(uintptr_t)w->pool);
  assert_int_equal(len, w->pool_len);
}

static void world_open_opts(world *w, const ecs_rdma_opts *o, size_t pool_len, size_t buf_len) {
  memset(w, 0, sizeof(*w));
  char err[160] = "";
  assert_int_equal(ecs_verbs_emu_create(2, &w->emu), ECS_OK);
  const struct ecs_verbs_ops *ops = (const struct ecs_verbs_ops *)ecs_verbs_emu_ops(w->emu);
  assert_int_equal(ecs_rdma_ctx_open(o, ops, &w->sctx, err, sizeof(err)), ECS_OK);
  assert_int_equal(ecs_rdma_ctx_open(o, ops, &w->cctx, err, sizeof(err)), ECS_OK);
  w->pool_len = pool_len;
  w->buf_len = buf_len;
  w->pool = malloc(pool_len);
  w->buf = malloc(buf_len);
  assert_non_null(w->pool);
  assert_non_null(w->buf);
  fill(w->pool, pool_len, 1);
  fill(w->buf, buf_len, 2);
  assert_int_equal(
      ecs_rdma_reg(w->sctx, w->pool, pool_len, ECS_RDMA_REMOTE_READ | ECS_RDMA_REMOTE_WRITE, &w->pool_mr),
      ECS_OK);
  assert_int_equal(ecs_rdma_reg(w->cctx, w->buf, buf_len, 0, &w->buf_mr), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(w->sctx, w->pool_mr, &w->sep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(w->cctx, NULL, &w->cep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connected(w->cep), 0);
  connect_pair(w);
  assert_int_equal(ecs_rdma_ep_connected(w->cep), 1);
}

static void world_open(world *w, const char *device, size_t slice) {
  ecs_rdma_opts o = {.device = device, .slice_size = slice};
  world_open_opts(w, &o, 1 << 20, 1 << 20);
}

/* Closes everything and checks that nothing leaked in the emulation. */
static void world_close(world *w) {
  ecs_rdma_ep_destroy(w->cep);
  ecs_rdma_ep_destroy(w->sep);
  ecs_rdma_dereg(w->buf_mr);
  ecs_rdma_dereg(w->pool_mr);
  ecs_rdma_ctx_close(w->cctx);
  ecs_rdma_ctx_close(w->sctx);
  ecs_verbs_emu_counts n;
  ecs_verbs_emu_get_counts(w->emu, &n);
  assert_int_equal(n.device_lists, 0);
  assert_int_equal(n.contexts, 0);
  assert_int_equal(n.pds, 0);
  assert_int_equal(n.mrs, 0);
  assert_int_equal(n.cqs, 0);
  assert_int_equal(n.qps, 0);
  assert_int_equal(n.cq_overruns, 0);
  ecs_verbs_emu_destroy(w->emu);
  free(w->pool);
  free(w->buf);
}

/* An item reading/writing pool[poff, +len) from/to buf[boff, +len). */
static ecs_rdma_item item(world *w, size_t boff, size_t poff, size_t len) {
  return (ecs_rdma_item){
      .local = w->buf_mr, .local_off = boff, .remote_addr = w->raddr + poff, .rkey = w->rkey, .len = len};
}

/* 8 items of 4 KiB: item i is pool[i*8K, +4K) <-> buf[i*4K, +4K). */
#define SMALL_N 8
static void small_items(world *w, ecs_rdma_item *it) {
  for (size_t i = 0; i < SMALL_N; i++)
    it[i] = item(w, i * 4096, i * 8192, 4096);
}

static void assert_item_read(world *w, const ecs_rdma_item *it) {
  assert_memory_equal(w->buf + it->local_off, w->pool + (it->remote_addr - w->raddr), it->len);
}

/* A plain read batch over the small items succeeds: the endpoint works. */
static void assert_works(world *w) {
  ecs_rdma_item it[SMALL_N];
  int st[SMALL_N];
  small_items(w, it);
  memset(w->buf, 0, SMALL_N * 4096);
  fill(w->pool, w->pool_len, (uint64_t)rand());
  assert_int_equal(ecs_rdma_read_batch(w->cep, it, SMALL_N, st, 2000), ECS_OK);
  for (size_t i = 0; i < SMALL_N; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_item_read(w, &it[i]);
  }
}

/* ---- Context --------------------------------------------------------------------- */

static void test_no_device(void **state) {
  (void)state;
  ecs_verbs_emu *emu;
  assert_int_equal(ecs_verbs_emu_create(0, &emu), ECS_OK);
  const struct ecs_verbs_ops *ops = (const struct ecs_verbs_ops *)ecs_verbs_emu_ops(emu);
  ecs_rdma_ctx *c = (ecs_rdma_ctx *)1;
  char err[128] = "";
  assert_int_equal(ecs_rdma_ctx_open(NULL, ops, &c, err, sizeof(err)), ECS_ENODEV);
  assert_null(c);
  assert_string_equal(err, "rdma: no RDMA device found");
  ecs_verbs_emu_counts n;
  ecs_verbs_emu_get_counts(emu, &n);
  assert_int_equal(n.device_lists, 0);
  ecs_verbs_emu_destroy(emu);
}

static void test_ctx_options(void **state) {
  (void)state;
  ecs_verbs_emu *emu;
  assert_int_equal(ecs_verbs_emu_create(2, &emu), ECS_OK);
  const struct ecs_verbs_ops *ops = (const struct ecs_verbs_ops *)ecs_verbs_emu_ops(emu);
  ecs_rdma_ctx *c;
  char err[160] = "";
  /* NULL options: the first device. */
  assert_int_equal(ecs_rdma_ctx_open(NULL, ops, &c, err, sizeof(err)), ECS_OK);
  assert_string_equal(ecs_rdma_ctx_device(c), "emu0");
  ecs_rdma_ctx_close(c);
  ecs_rdma_opts o = {.device = "emu1"};
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_OK);
  assert_string_equal(ecs_rdma_ctx_device(c), "emu1");
  ecs_rdma_ctx_close(c);
  /* A missing device names the ones there are. */
  o.device = "mlx5_9";
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_ENODEV);
  assert_non_null(strstr(err, "'mlx5_9' not found"));
  assert_non_null(strstr(err, "emu0, emu1"));
  /* Port and GID index. */
  o = (ecs_rdma_opts){.port = 2};
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_EINVAL);
  o = (ecs_rdma_opts){.gid_index = 2}; /* emu0 is RoCE: GID 2 is empty */
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_EINVAL);
  assert_non_null(strstr(err, "GID index 2 is empty"));
  o = (ecs_rdma_opts){.gid_index = 99};
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_EINVAL);
  o = (ecs_rdma_opts){.gid_index = 1};
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_OK);
  ecs_rdma_ctx_close(c);
  o = (ecs_rdma_opts){.max_outstanding = -1};
  assert_int_equal(ecs_rdma_ctx_open(&o, ops, &c, err, sizeof(err)), ECS_EINVAL);
  /* Registration arguments. */
  assert_int_equal(ecs_rdma_ctx_open(NULL, ops, &c, err, sizeof(err)), ECS_OK);
  uint8_t b[64];
  ecs_rdma_mr *m;
  assert_int_equal(ecs_rdma_reg(c, b, 0, 0, &m), ECS_EINVAL);
  assert_int_equal(ecs_rdma_reg(c, NULL, 64, 0, &m), ECS_EINVAL);
  assert_int_equal(ecs_rdma_reg(c, b, 64, 0x80, &m), ECS_EINVAL);
  assert_int_equal(ecs_rdma_reg(c, b, 64, ECS_RDMA_REMOTE_WRITE, &m), ECS_OK);
  assert_int_equal(ecs_rdma_mr_addr(m), (uint64_t)(uintptr_t)b);
  assert_int_equal(ecs_rdma_mr_len(m), 64);
  ecs_rdma_dereg(m);
  ecs_rdma_dereg(NULL);
  ecs_rdma_ep_destroy(NULL);
  ecs_rdma_ctx_close(c);
  ecs_rdma_ctx_close(NULL);
  ecs_verbs_emu_counts n;
  ecs_verbs_emu_get_counts(emu, &n);
  assert_int_equal(n.contexts + n.pds + n.mrs + n.device_lists, 0);
  ecs_verbs_emu_destroy(emu);
}

/* The emulation itself refuses what devices refuse. */
static void test_emu_rules(void **state) {
  (void)state;
  ecs_verbs_emu *emu;
  assert_int_equal(ecs_verbs_emu_create(1, &emu), ECS_OK);
  const ecs_verbs_ops *o = ecs_verbs_emu_ops(emu);
  int n;
  struct ibv_device **list = o->get_device_list(o->priv, &n);
  assert_int_equal(n, 1);
  struct ibv_context *ctx = o->open_device(list[0]);
  o->free_device_list(o->priv, list);
  struct ibv_pd *pd = o->alloc_pd(ctx);
  uint8_t b[64];
  assert_null(o->reg_mr(pd, b, 64, IBV_ACCESS_REMOTE_WRITE)); /* needs LOCAL_WRITE */
  struct ibv_mr *mr = o->reg_mr(pd, b, 64, IBV_ACCESS_LOCAL_WRITE);
  assert_non_null(mr);
  assert_int_not_equal(mr->lkey, mr->rkey);
  struct ibv_cq *cq = o->create_cq(ctx, 4, NULL, NULL, 0);
  struct ibv_qp_init_attr ia = {
      .send_cq = cq, .recv_cq = cq, .cap = {.max_send_wr = 4}, .qp_type = IBV_QPT_RC};
  struct ibv_qp *qp = o->create_qp(pd, &ia);
  assert_non_null(qp);
  assert_int_equal(qp->state, IBV_QPS_RESET);
  /* RESET -> RTR skips INIT; INIT without its attributes. */
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
  assert_int_equal(o->modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .port_num = 1};
  assert_int_equal(o->modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  assert_int_equal(o->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
                   0);
  /* Posting before RTS fails at post time. */
  struct ibv_sge sg = {.addr = (uintptr_t)b, .length = 8, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_READ}, *bad = NULL;
  assert_int_equal(o->post_send(qp, &wr, &bad), EINVAL);
  assert_ptr_equal(bad, &wr);
  /* RoCE port: RTR without a GRH is refused. */
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
                           .path_mtu = IBV_MTU_1024,
                           .dest_qp_num = 5,
                           .ah_attr = {.dlid = 3, .port_num = 1}};
  assert_int_equal(o->modify_qp(qp, &a,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
                   EINVAL);
  /* Busy objects cannot go. */
  assert_int_equal(o->destroy_cq(cq), EBUSY);
  assert_int_equal(o->dealloc_pd(pd), EBUSY);
  assert_int_equal(o->destroy_qp(qp), 0);
  assert_int_equal(o->destroy_cq(cq), 0);
  assert_int_equal(o->dereg_mr(mr), 0);
  assert_int_equal(o->dealloc_pd(pd), 0);
  assert_int_equal(o->close_device(ctx), 0);
  ecs_verbs_emu_destroy(emu);
}

/* ---- Round trips ------------------------------------------------------------------ */

static void roundtrip_on(const char *device) {
  world w;
  world_open(&w, device, 0);
  ecs_rdma_item it[SMALL_N];
  int st[SMALL_N];
  small_items(&w, it);
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, SMALL_N, st, 0), ECS_OK);
  for (size_t i = 0; i < SMALL_N; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_item_read(&w, &it[i]);
  }
  /* Write new bytes back to other places of the pool. */
  fill(w.buf, w.buf_len, 99);
  for (size_t i = 0; i < SMALL_N; i++)
    it[i].remote_addr = w.raddr + 512 * 1024 + i * 4096;
  assert_int_equal(ecs_rdma_write_batch(w.cep, it, SMALL_N, st, 0), ECS_OK);
  for (size_t i = 0; i < SMALL_N; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_item_read(&w, &it[i]);
  }
  ecs_rdma_ep_stats s;
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.items_ok, 2 * SMALL_N);
  assert_int_equal(s.bytes, 2 * SMALL_N * 4096);
  assert_int_equal(s.err_wcs + s.rebuilds + s.items_err, 0);
  world_close(&w);
}

static void test_roundtrip_roce(void **state) {
  (void)state;
  roundtrip_on("emu0"); /* addressed by GID */
}

static void test_roundtrip_ib(void **state) {
  (void)state;
  roundtrip_on("emu1"); /* addressed by LID, MTU 2048 */
}

static void test_slicing(void **state) {
  (void)state;
  const size_t obj = (9u << 20) + 13; /* 9 MiB and some odd bytes */
  world w;
  ecs_rdma_opts o = {.max_outstanding = 4};
  world_open_opts(&w, &o, obj + 4096, obj + 4096);
  ecs_rdma_item it = item(&w, 3, 4093, obj); /* odd offsets on both ends */
  int st;
  assert_int_equal(ecs_rdma_read_batch(w.cep, &it, 1, &st, 0), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_item_read(&w, &it);
  ecs_rdma_ep_stats s;
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.wrs, 10); /* 9 full slices and the tail */
  fill(w.buf, w.buf_len, 7);
  it.remote_addr = w.raddr + 1;
  assert_int_equal(ecs_rdma_write_batch(w.cep, &it, 1, &st, 0), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_item_read(&w, &it);
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.wrs, 20);
  world_close(&w);

  /* A small slice size, many slices per item and several items at once. */
  o = (ecs_rdma_opts){.slice_size = 1000, .max_outstanding = 3};
  world_open_opts(&w, &o, 1 << 20, 1 << 20);
  ecs_rdma_item three[3] = {item(&w, 0, 100, 10000), item(&w, 20000, 300000, 999), item(&w, 40000, 7, 1001)};
  int st3[3];
  assert_int_equal(ecs_rdma_read_batch(w.cep, three, 3, st3, 0), ECS_OK);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(st3[i], ECS_OK);
    assert_item_read(&w, &three[i]);
  }
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.wrs, 10 + 1 + 2);
  world_close(&w);
}

static void test_many_items(void **state) {
  (void)state;
  world w;
  ecs_rdma_opts o = {.slice_size = 4096};
  world_open_opts(&w, &o, 4 << 20, 4 << 20);
  enum { N = 700 };
  ecs_rdma_item *it = calloc(N, sizeof(*it));
  int *st = calloc(N, sizeof(*st));
  uint64_t s = 5;
  size_t boff = 0;
  for (size_t i = 0; i < N; i++) {
    size_t len = i % 50 == 0 ? 0 : rng_next(&s) % 9000; /* some empty, some sliced */
    it[i] = item(&w, boff, rng_next(&s) % (w.pool_len - len), len);
    boff += len;
  }
  assert_true(boff <= w.buf_len);
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, N, st, 0), ECS_OK);
  for (size_t i = 0; i < N; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_item_read(&w, &it[i]);
  }
  /* Writes to disjoint places. */
  fill(w.buf, w.buf_len, 11);
  size_t poff = 0;
  for (size_t i = 0; i < N; i++) {
    it[i].remote_addr = w.raddr + poff;
    poff += it[i].len;
  }
  assert_int_equal(ecs_rdma_write_batch(w.cep, it, N, st, 0), ECS_OK);
  for (size_t i = 0; i < N; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_item_read(&w, &it[i]);
  }
  free(it);
  free(st);
  world_close(&w);
}

/* ---- Items refused before posting ---------------------------------------------------- */

static void test_invalid_items(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  ecs_rdma_item it[SMALL_N];
  int st[SMALL_N];
  small_items(&w, it);
  it[1].local_off = w.buf_len - 100;              /* past the local MR */
  it[3].remote_addr = w.raddr + w.pool_len - 100; /* past the advertised region */
  it[5].remote_addr = w.raddr - 4096;             /* before it */
  it[6].local = NULL;                             /* no MR */
  it[7].local_off = UINT64_MAX - 10;              /* overflow */
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, SMALL_N, st, 0), ECS_OK);
  int want[SMALL_N] = {ECS_OK, ECS_EINVAL, ECS_OK, ECS_EINVAL, ECS_OK, ECS_EINVAL, ECS_EINVAL, ECS_EINVAL};
  for (size_t i = 0; i < SMALL_N; i++) {
    assert_int_equal(st[i], want[i]);
    if (!want[i])
      assert_item_read(&w, &it[i]);
  }
  /* Nothing reached the wire for them: the QP is untouched. */
  ecs_rdma_ep_stats s;
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.err_wcs + s.rebuilds, 0);
  assert_int_equal(ecs_rdma_ep_connected(w.cep), 1);
  /* Whole-call errors. */
  assert_int_equal(ecs_rdma_read_batch(w.cep, NULL, 2, st, 0), ECS_EINVAL);
  assert_int_equal(st[0], ECS_EINVAL);
  assert_int_equal(ecs_rdma_read_batch(NULL, it, 1, st, 0), ECS_EINVAL);
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, 0, st, 0), ECS_OK);
  world_close(&w);
}

static void test_not_connected(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  ecs_rdma_ep *fresh;
  assert_int_equal(ecs_rdma_ep_create(w.cctx, NULL, &fresh), ECS_OK);
  assert_int_not_equal(ecs_rdma_ep_qpn(fresh), 0);
  ecs_rdma_item it = item(&w, 0, 0, 64);
  int st = 1;
  assert_int_equal(ecs_rdma_read_batch(fresh, &it, 1, &st, 100), ECS_ENOTCONN);
  assert_int_equal(st, ECS_ENOTCONN);
  assert_int_equal(ecs_rdma_ep_peer_region(fresh, NULL, NULL, NULL), ECS_ENOTCONN);
  /* A connected endpoint refuses a second connect. */
  uint8_t b[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(w.sep, b), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(w.cep, b, sizeof(b)), ECS_EBUSY);
  /* The client's blob has no region. */
  assert_int_equal(ecs_rdma_ep_connect(fresh, b, sizeof(b)), ECS_OK);
  ecs_rdma_ep_destroy(fresh);
  world_close(&w);
}

/* A bad blob from the network is refused and changes nothing. */
static void test_connect_bad_blob(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  ecs_rdma_ep *ep;
  assert_int_equal(ecs_rdma_ep_create(w.cctx, NULL, &ep), ECS_OK);
  uint32_t qpn = ecs_rdma_ep_qpn(ep);
  uint8_t b[ECS_RDMA_BLOB_SIZE + 1];
  assert_int_equal(ecs_rdma_ep_local_blob(w.sep, b), ECS_OK);
  b[0] ^= 1;
  assert_int_equal(ecs_rdma_ep_connect(ep, b, ECS_RDMA_BLOB_SIZE), ECS_EPROTO);
  b[0] ^= 1;
  b[4] = 9;
  assert_int_equal(ecs_rdma_ep_connect(ep, b, ECS_RDMA_BLOB_SIZE), ECS_EPROTO);
  b[4] = 1;
  assert_int_equal(ecs_rdma_ep_connect(ep, b, ECS_RDMA_BLOB_SIZE - 1), ECS_EPROTO);
  assert_int_equal(ecs_rdma_ep_connect(ep, b, ECS_RDMA_BLOB_SIZE + 1), ECS_EPROTO);
  b[20] = 1; /* InfiniBand peer, RoCE port */
  assert_int_equal(ecs_rdma_ep_connect(ep, b, ECS_RDMA_BLOB_SIZE), ECS_EPROTO);
  b[20] = 2;
  memset(b + 24, 0, 16); /* RoCE peer without a GID */
  assert_int_equal(ecs_rdma_ep_connect(ep, b, ECS_RDMA_BLOB_SIZE), ECS_EPROTO);
  assert_int_not_equal(ecs_rdma_ep_errmsg(ep)[0], 0);
  assert_int_equal(ecs_rdma_ep_qpn(ep), qpn);
  assert_int_equal(ecs_rdma_ep_connected(ep), 0);
  ecs_rdma_ep_destroy(ep);
  world_close(&w);
}

/* ---- Error completions ------------------------------------------------------------------ */

typedef enum { WITH_EXCHANGE, WITHOUT_EXCHANGE } recovery;

/* Runs a batch of SMALL_N reads (or writes) where want[i] is each item's
 * expected status, then checks the endpoint works again: with the exchange
 * callback the same call already reconnected and retried the flushed
 * items; without it, they come back ECS_ECANCELED and the caller
 * re-exchanges blobs. */
static void check_batch(world *w, ecs_rdma_item *it, int write, const int *want, recovery r) {
  int st[SMALL_N];
  if (r == WITH_EXCHANGE)
    ecs_rdma_ep_set_exchange(w->cep, exchange, w);
  if (write)
    fill(w->buf, w->buf_len, 31);
  else
    memset(w->buf, 0, w->buf_len);
  assert_int_equal((write ? ecs_rdma_write_batch : ecs_rdma_read_batch)(w->cep, it, SMALL_N, st, 2000),
                   ECS_OK);
  for (size_t i = 0; i < SMALL_N; i++) {
    int exp = want[i];
    if (exp == ECS_ECANCELED && r == WITH_EXCHANGE)
      exp = ECS_OK; /* retried over the new connection */
    if (st[i] != exp)
      print_error("item %zu: status %s, want %s (%s)\n", i, ecs_err_name(st[i]), ecs_err_name(exp),
                  ecs_rdma_ep_errmsg(w->cep));
    assert_int_equal(st[i], exp);
    if (exp == ECS_OK && it[i].rkey == w->rkey)
      assert_item_read(w, &it[i]);
  }
  if (r == WITH_EXCHANGE) {
    assert_int_equal(w->exchanges, 1);
    assert_int_equal(ecs_rdma_ep_connected(w->cep), 1);
  } else {
    assert_int_equal(ecs_rdma_ep_connected(w->cep), 0);
    /* Not connected and no callback: the next call says so at once. */
    int st1;
    assert_int_equal(ecs_rdma_read_batch(w->cep, it, 1, &st1, 100), ECS_ENOTCONN);
    connect_pair(w);
  }
  ecs_rdma_ep_stats s;
  ecs_rdma_ep_get_stats(w->cep, &s);
  assert_true(s.rebuilds >= 1);
  assert_works(w);
}

static void bad_rkey(recovery r) {
  world w;
  world_open(&w, NULL, 0);
  ecs_rdma_item it[SMALL_N];
  small_items(&w, it);
  it[3].rkey ^= 0x1000; /* no such key on the server */
  int want[SMALL_N] = {0, 0, 0, ECS_EIO, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED};
  check_batch(&w, it, 0, want, r);
  /* The responder's QP went to ERR as well: the old pair is gone. */
  world_close(&w);
}

static void test_bad_rkey(void **state) {
  (void)state;
  bad_rkey(WITH_EXCHANGE);
  bad_rkey(WITHOUT_EXCHANGE);
}

/* Out of the bounds of a server MR that is not the advertised region (so it
 * is not caught before posting): a remote access error on the wire. */
static void test_remote_bounds(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  uint8_t *side = malloc(16384);
  fill(side, 16384, 4);
  ecs_rdma_mr *side_mr;
  assert_int_equal(ecs_rdma_reg(w.sctx, side, 16384, ECS_RDMA_REMOTE_READ, &side_mr), ECS_OK);
  ecs_rdma_item it[SMALL_N];
  small_items(&w, it);
  it[1] = (ecs_rdma_item){.local = w.buf_mr,
                          .local_off = 4096,
                          .remote_addr = ecs_rdma_mr_addr(side_mr),
                          .rkey = ecs_rdma_mr_rkey(side_mr),
                          .len = 4096};
  it[5] = it[1];
  it[5].local_off = 5 * 4096;
  it[5].remote_addr += 16384 - 100; /* runs 3996 bytes past the end */
  int want[SMALL_N] = {0, 0, 0, 0, 0, ECS_EIO, ECS_ECANCELED, ECS_ECANCELED};
  check_batch(&w, it, 0, want, WITH_EXCHANGE);
  ecs_rdma_dereg(side_mr);
  free(side);
  world_close(&w);
}

static void test_no_remote_write(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  uint8_t *ro = calloc(1, 65536);
  ecs_rdma_mr *ro_mr;
  assert_int_equal(ecs_rdma_reg(w.sctx, ro, 65536, ECS_RDMA_REMOTE_READ, &ro_mr), ECS_OK);
  ecs_rdma_item it[SMALL_N];
  small_items(&w, it);
  it[2].remote_addr = ecs_rdma_mr_addr(ro_mr);
  it[2].rkey = ecs_rdma_mr_rkey(ro_mr);
  int want[SMALL_N] = {
      0, 0, ECS_EIO, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED};
  check_batch(&w, it, 1, want, WITH_EXCHANGE);
  for (int i = 0; i < 65536; i++)
    assert_int_equal(ro[i], 0); /* not one byte written */
  /* Reading it is allowed. */
  ro[0] = 0x77;
  ecs_rdma_item rd = it[2];
  int st;
  assert_int_equal(ecs_rdma_read_batch(w.cep, &rd, 1, &st, 0), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_int_equal(w.buf[rd.local_off], 0x77);
  ecs_rdma_dereg(ro_mr);
  free(ro);
  world_close(&w);
}

static void retry_exceeded(recovery r) {
  world w;
  world_open(&w, NULL, 0);
  assert_int_equal(ecs_verbs_emu_inject(w.emu, ecs_rdma_ep_qpn(w.cep), ECS_EMU_FAIL_RETRY_EXC, 2), ECS_OK);
  ecs_rdma_item it[SMALL_N];
  small_items(&w, it);
  int want[SMALL_N] = {
      0, 0, ECS_ETIMEDOUT, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED};
  check_batch(&w, it, 0, want, r);
  world_close(&w);
}

static void test_retry_exceeded(void **state) {
  (void)state;
  retry_exceeded(WITH_EXCHANGE);
  retry_exceeded(WITHOUT_EXCHANGE);
}

/* The QP fails under the batch (a fatal async event): nothing is the
 * items' fault, so all of them are retried on the new connection. */
static void qp_error(recovery r) {
  world w;
  world_open(&w, NULL, 0);
  assert_int_equal(ecs_verbs_emu_inject(w.emu, ecs_rdma_ep_qpn(w.cep), ECS_EMU_FAIL_QP_ERR, 1), ECS_OK);
  ecs_rdma_item it[SMALL_N];
  small_items(&w, it);
  int want[SMALL_N] = {0,
                       ECS_ECANCELED,
                       ECS_ECANCELED,
                       ECS_ECANCELED,
                       ECS_ECANCELED,
                       ECS_ECANCELED,
                       ECS_ECANCELED,
                       ECS_ECANCELED};
  check_batch(&w, it, 1, want, r);
  world_close(&w);
}

static void test_qp_error(void **state) {
  (void)state;
  qp_error(WITH_EXCHANGE);
  qp_error(WITHOUT_EXCHANGE);
}

/* The server restarted its endpoint (its QP is new): the client's requests
 * go nowhere and retries run out; the batch reconnects for the rest. */
static void test_peer_gone(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  assert_int_equal(ecs_rdma_ep_reset(w.sep), ECS_OK);
  ecs_rdma_item it[SMALL_N];
  small_items(&w, it);
  int want[SMALL_N] = {ECS_ETIMEDOUT, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED,
                       ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED, ECS_ECANCELED};
  check_batch(&w, it, 0, want, WITH_EXCHANGE);
  world_close(&w);
}

/* Why a rebuilt QP needs a new exchange: reusing the peer's old blob after
 * a local reset leaves the peer pointing at the old QP number. */
static void test_stale_blob(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  uint8_t old[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(w.sep, old), ECS_OK);
  assert_int_equal(ecs_rdma_ep_reset(w.cep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(w.cep, old, sizeof(old)), ECS_OK);
  ecs_rdma_item it = item(&w, 0, 0, 64);
  int st;
  assert_int_equal(ecs_rdma_read_batch(w.cep, &it, 1, &st, 2000), ECS_OK);
  assert_int_equal(st, ECS_ETIMEDOUT);
  connect_pair(&w);
  assert_works(&w);
  world_close(&w);
}

/* The exchange callback fails: flushed items stay ECS_ECANCELED, the next
 * call reports ECS_ENOTCONN, and once the channel is back it recovers. */
static void test_exchange_fails(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  ecs_rdma_ep_set_exchange(w.cep, exchange, &w);
  w.fail_exchange = 1;
  assert_int_equal(ecs_verbs_emu_inject(w.emu, ecs_rdma_ep_qpn(w.cep), ECS_EMU_FAIL_QP_ERR, 0), ECS_OK);
  ecs_rdma_item it[SMALL_N];
  int st[SMALL_N];
  small_items(&w, it);
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, SMALL_N, st, 1000), ECS_OK);
  for (size_t i = 0; i < SMALL_N; i++)
    assert_int_equal(st[i], ECS_ECANCELED);
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, SMALL_N, st, 1000), ECS_ENOTCONN);
  assert_int_equal(st[0], ECS_ENOTCONN);
  assert_non_null(strstr(ecs_rdma_ep_errmsg(w.cep), "exchange failed"));
  w.fail_exchange = 0;
  assert_works(&w); /* reconnects at the start of the call */
  ecs_rdma_ep_stats s;
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.reconnects, 1);
  world_close(&w);
}

/* A silent peer: the batch ends at its deadline, not later, the items not
 * done are ECS_ETIMEDOUT, and the buffers are no longer touched. */
static void test_stall_timeout(void **state) {
  (void)state;
  world w;
  world_open(&w, NULL, 0);
  ecs_rdma_ep_set_exchange(w.cep, exchange, &w);
  assert_int_equal(ecs_verbs_emu_inject(w.emu, ecs_rdma_ep_qpn(w.cep), ECS_EMU_FAIL_STALL, 2), ECS_OK);
  uint32_t old_qpn = ecs_rdma_ep_qpn(w.cep);
  ecs_rdma_item it[SMALL_N];
  int st[SMALL_N];
  small_items(&w, it);
  memset(w.buf, 0, w.buf_len);
  uint64_t t0 = now_ms();
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, SMALL_N, st, 300), ECS_OK);
  uint64_t took = now_ms() - t0;
  assert_true(took >= 290);
  assert_true(took < 300 + ECS_RDMA_DRAIN_MS + 400);
  for (size_t i = 0; i < SMALL_N; i++)
    assert_int_equal(st[i], i < 2 ? ECS_OK : ECS_ETIMEDOUT);
  for (size_t i = 2; i < SMALL_N; i++)
    for (size_t j = 0; j < 4096; j++)
      assert_int_equal(w.buf[it[i].local_off + j], 0);
  /* The stalled QP is gone; the endpoint waits for an exchange. */
  assert_int_equal(ecs_verbs_emu_qp_state(w.emu, old_qpn), -1);
  assert_int_equal(ecs_rdma_ep_connected(w.cep), 0);
  ecs_rdma_ep_stats s;
  ecs_rdma_ep_get_stats(w.cep, &s);
  assert_int_equal(s.timeouts, 1);
  assert_int_equal(w.exchanges, 0); /* no time was left for it */
  assert_works(&w);                 /* the next call reconnects first */
  assert_int_equal(w.exchanges, 1);
  /* A stall on writes with the default deadline of the context. */
  world_close(&w);
  ecs_rdma_opts o = {.timeout_ms = 150};
  world_open_opts(&w, &o, 1 << 20, 1 << 20);
  assert_int_equal(ecs_verbs_emu_inject(w.emu, ecs_rdma_ep_qpn(w.cep), ECS_EMU_FAIL_STALL, 0), ECS_OK);
  small_items(&w, it);
  t0 = now_ms();
  assert_int_equal(ecs_rdma_write_batch(w.cep, it, SMALL_N, st, 0), ECS_OK);
  took = now_ms() - t0;
  assert_true(took >= 140 && took < 150 + ECS_RDMA_DRAIN_MS + 400);
  for (size_t i = 0; i < SMALL_N; i++)
    assert_int_equal(st[i], ECS_ETIMEDOUT);
  world_close(&w);
}

/* Two errors in one batch, slices of an erroring item in flight, and a
 * second pass that breaks too: the call still ends with one status each. */
static void test_two_errors(void **state) {
  (void)state;
  world w;
  ecs_rdma_opts o = {.slice_size = 1024, .max_outstanding = 8};
  world_open_opts(&w, &o, 1 << 20, 1 << 20);
  ecs_rdma_ep_set_exchange(w.cep, exchange, &w);
  ecs_rdma_item it[SMALL_N];
  int st[SMALL_N];
  small_items(&w, it);
  it[1].rkey ^= 0x100; /* fails on the first pass */
  it[6].rkey ^= 0x200; /* flushed on the first, fails on the second */
  assert_int_equal(ecs_rdma_read_batch(w.cep, it, SMALL_N, st, 2000), ECS_OK);
  int want[SMALL_N] = {0, ECS_EIO, 0, 0, 0, 0, ECS_EIO, ECS_ECANCELED};
  for (size_t i = 0; i < SMALL_N; i++)
    assert_int_equal(st[i], want[i]);
  assert_int_equal(w.exchanges, 1); /* one reconnect per call */
  assert_works(&w);
  assert_int_equal(w.exchanges, 2);
  world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blob_roundtrip),   cmocka_unit_test(test_blob_validation),
      cmocka_unit_test(test_blob_mutation),    cmocka_unit_test(test_no_device),
      cmocka_unit_test(test_ctx_options),      cmocka_unit_test(test_emu_rules),
      cmocka_unit_test(test_roundtrip_roce),   cmocka_unit_test(test_roundtrip_ib),
      cmocka_unit_test(test_slicing),          cmocka_unit_test(test_many_items),
      cmocka_unit_test(test_invalid_items),    cmocka_unit_test(test_not_connected),
      cmocka_unit_test(test_connect_bad_blob), cmocka_unit_test(test_bad_rkey),
      cmocka_unit_test(test_remote_bounds),    cmocka_unit_test(test_no_remote_write),
      cmocka_unit_test(test_retry_exceeded),   cmocka_unit_test(test_qp_error),
      cmocka_unit_test(test_peer_gone),        cmocka_unit_test(test_stale_blob),
      cmocka_unit_test(test_exchange_fails),   cmocka_unit_test(test_stall_timeout),
      cmocka_unit_test(test_two_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* ECS_HAVE_RDMA */
