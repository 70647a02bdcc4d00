/* RDMA transport on a real device, through libibverbs (verbs_real.c): the
 * round trip of test_rdma.c over a loopback QP pair on one port, a sliced
 * 9 MiB object, and one error completion with recovery.  Exits 77 (ctest
 * skip) when there is no device or no libibverbs, as on machines without
 * RDMA.  ECS_RDMA_DEVICE, ECS_RDMA_PORT and ECS_RDMA_GID_INDEX pick the
 * device (defaults: the first one, port 1, GID 0; RoCE usually wants the
 * RoCEv2 GID index that `show_gids` lists). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/rdma/rdma.h"

static ecs_rdma_opts opts;

typedef struct side {
  ecs_rdma_ctx *ctx;
  uint8_t *mem;
  size_t len;
  ecs_rdma_mr *mr;
  ecs_rdma_ep *ep;
} side;

static side srv, cli;

static void fill(uint8_t *p, size_t n, uint32_t seed) {
  uint32_t s = seed | 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = (uint8_t)(s >> 24);
  }
}

static int exchange(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE], uint8_t peer[ECS_RDMA_BLOB_SIZE],
                    int timeout_ms) {
  (void)arg, (void)timeout_ms;
  int rc = ecs_rdma_ep_reset(srv.ep);
  if (!rc)
    rc = ecs_rdma_ep_connect(srv.ep, local, ECS_RDMA_BLOB_SIZE);
  if (!rc)
    rc = ecs_rdma_ep_local_blob(srv.ep, peer);
  return rc;
}

static int setup(void **state) {
  (void)state;
  char err[160];
  const size_t len = 16u << 20;
  assert_int_equal(ecs_rdma_ctx_open(&opts, NULL, &srv.ctx, err, sizeof(err)), ECS_OK);
  assert_int_equal(ecs_rdma_ctx_open(&opts, NULL, &cli.ctx, err, sizeof(err)), ECS_OK);
  srv.len = cli.len = len;
  srv.mem = malloc(len);
  cli.mem = malloc(len);
  assert_non_null(srv.mem);
  assert_non_null(cli.mem);
  assert_int_equal(ecs_rdma_reg(srv.ctx, srv.mem, len, ECS_RDMA_REMOTE_READ | ECS_RDMA_REMOTE_WRITE, &srv.mr),
                   ECS_OK);
  assert_int_equal(ecs_rdma_reg(cli.ctx, cli.mem, len, 0, &cli.mr), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(srv.ctx, srv.mr, &srv.ep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(cli.ctx, NULL, &cli.ep), ECS_OK);
  uint8_t b[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(cli.ep, b), ECS_OK);
  assert_int_equal(exchange(NULL, b, b, 1000), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(cli.ep, b, sizeof(b)), ECS_OK);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ecs_rdma_ep_destroy(cli.ep);
  ecs_rdma_ep_destroy(srv.ep);
  ecs_rdma_dereg(cli.mr);
  ecs_rdma_dereg(srv.mr);
  ecs_rdma_ctx_close(cli.ctx);
  ecs_rdma_ctx_close(srv.ctx);
  free(cli.mem);
  free(srv.mem);
  return 0;
}

static ecs_rdma_item item(size_t coff, size_t soff, size_t len) {
  uint64_t addr, rlen;
  uint32_t rkey;
  assert_int_equal(ecs_rdma_ep_peer_region(cli.ep, &addr, &rlen, &rkey), ECS_OK);
  return (ecs_rdma_item){
      .local = cli.mr, .local_off = coff, .remote_addr = addr + soff, .rkey = rkey, .len = len};
}

static void test_hw_roundtrip(void **state) {
  (void)state;
  fill(srv.mem, srv.len, 1);
  memset(cli.mem, 0, cli.len);
  ecs_rdma_item it[4] = {item(0, 4096, 4096), item(8192, 0, 1), item(16384, 1 << 20, 65536),
                         item(1 << 20, (9u << 20) + 1, (9u << 20) + 13)};
  int st[4];
  assert_int_equal(ecs_rdma_read_batch(cli.ep, it, 4, st, 5000), ECS_OK);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_memory_equal(cli.mem + it[i].local_off, srv.mem + (it[i].remote_addr - ecs_rdma_mr_addr(srv.mr)),
                        it[i].len);
  }
  fill(cli.mem, cli.len, 2);
  for (int i = 0; i < 4; i++)
    it[i].remote_addr -= 1;
  it[0].remote_addr = ecs_rdma_mr_addr(srv.mr);
  assert_int_equal(ecs_rdma_write_batch(cli.ep, it, 4, st, 5000), ECS_OK);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_memory_equal(cli.mem + it[i].local_off, srv.mem + (it[i].remote_addr - ecs_rdma_mr_addr(srv.mr)),
                        it[i].len);
  }
}

static void test_hw_bad_rkey_recovers(void **state) {
  (void)state;
  ecs_rdma_ep_set_exchange(cli.ep, exchange, NULL);
  ecs_rdma_item it[3] = {item(0, 0, 4096), item(4096, 4096, 4096), item(8192, 8192, 4096)};
  it[1].rkey ^= 0x5a5a00;
  int st[3];
  assert_int_equal(ecs_rdma_read_batch(cli.ep, it, 3, st, 5000), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_EIO);
  assert_int_equal(st[2], ECS_OK);
  it[1].rkey ^= 0x5a5a00;
  assert_int_equal(ecs_rdma_read_batch(cli.ep, it, 3, st, 5000), ECS_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(st[i], ECS_OK);
}

/* The store's per-lease windows on the device: an isolated endpoint (own
 * PD), a zero-based read-only window over one block; the pool MR's rkey
 * (another PD) and a write are refused; a closed window's rkey is dead. */
static ecs_rdma_ep *iso_ep;

static int iso_exchange(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE], uint8_t peer[ECS_RDMA_BLOB_SIZE],
                        int timeout_ms) {
  (void)arg, (void)timeout_ms;
  int rc = ecs_rdma_ep_reset(iso_ep);
  if (!rc)
    rc = ecs_rdma_ep_connect(iso_ep, local, ECS_RDMA_BLOB_SIZE);
  if (!rc)
    rc = ecs_rdma_ep_local_blob(iso_ep, peer);
  return rc;
}

static int iso_io(ecs_rdma_ep *ep, int write, uint64_t addr, uint32_t rkey, uint64_t len) {
  ecs_rdma_item it = {.local = cli.mr, .remote_addr = addr, .rkey = rkey, .len = len};
  int st = ECS_OK;
  int rc = write ? ecs_rdma_write_batch(ep, &it, 1, &st, 5000) : ecs_rdma_read_batch(ep, &it, 1, &st, 5000);
  return rc ? rc : st;
}

static void test_hw_windows(void **state) {
  (void)state;
  ecs_rdma_ep *cep;
  assert_int_equal(ecs_rdma_ep_create_isolated(srv.ctx, &iso_ep), ECS_OK);
  assert_int_equal(ecs_rdma_ep_create(cli.ctx, NULL, &cep), ECS_OK);
  ecs_rdma_ep_set_exchange(cep, iso_exchange, NULL);
  uint8_t b[ECS_RDMA_BLOB_SIZE];
  assert_int_equal(ecs_rdma_ep_local_blob(cep, b), ECS_OK);
  assert_int_equal(iso_exchange(NULL, b, b, 1000), ECS_OK);
  assert_int_equal(ecs_rdma_ep_connect(cep, b, sizeof(b)), ECS_OK);
  fill(srv.mem, srv.len, 3);
  memset(cli.mem, 0, 65536);
  ecs_rdma_mr *w;
  assert_int_equal(ecs_rdma_ep_window(iso_ep, srv.mem + 4096, 65536, ECS_RDMA_REMOTE_READ, &w), ECS_OK);
  assert_int_equal(iso_io(cep, 0, 0, ecs_rdma_mr_rkey(w), 65536), ECS_OK); /* zero-based */
  assert_memory_equal(cli.mem, srv.mem + 4096, 65536);
  assert_int_equal(iso_io(cep, 1, 0, ecs_rdma_mr_rkey(w), 64), ECS_EIO);
  assert_int_equal(iso_io(cep, 0, 65535, ecs_rdma_mr_rkey(w), 2), ECS_EIO);
  assert_int_equal(iso_io(cep, 0, ecs_rdma_mr_addr(srv.mr), ecs_rdma_mr_rkey(srv.mr), 64), ECS_EIO);
  uint32_t dead = ecs_rdma_mr_rkey(w);
  ecs_rdma_dereg(w);
  assert_int_equal(iso_io(cep, 0, 0, dead, 64), ECS_EIO);
  ecs_rdma_ep_destroy(cep);
  ecs_rdma_ep_destroy(iso_ep);
  iso_ep = NULL;
}

int main(void) {
  opts.device = getenv("ECS_RDMA_DEVICE");
  if (getenv("ECS_RDMA_PORT"))
    opts.port = atoi(getenv("ECS_RDMA_PORT"));
  if (getenv("ECS_RDMA_GID_INDEX"))
    opts.gid_index = atoi(getenv("ECS_RDMA_GID_INDEX"));
  ecs_rdma_ctx *probe;
  char err[160] = "";
  int rc = ecs_rdma_ctx_open(&opts, NULL, &probe, err, sizeof(err));
  if (rc == ECS_ENODEV || rc == ECS_ENOTSUP) {
    printf("skip: %s\n", err);
    return 77;
  }
  if (rc) {
    fprintf(stderr, "%s (%s)\n", err, ecs_err_name(rc));
    return 1;
  }
  printf("device %s\n", ecs_rdma_ctx_device(probe));
  ecs_rdma_ctx_close(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hw_roundtrip),
      cmocka_unit_test(test_hw_bad_rkey_recovers),
      cmocka_unit_test(test_hw_windows),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
