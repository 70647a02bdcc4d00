/*
 * ecstore-bench-rdma-window: what the per-lease / per-reservation RDMA
 * windows (issue 13) add to one transfer, on the in-process verbs
 * emulation (tests/support/verbs_emu.c), as ratios against a baseline
 * measured in the same run:
 *
 *   baseline  one RDMA READ (WRITE) through a whole-pool registration made
 *             once, as the server did before windows;
 *   windows   open a zero-based window over the block in an isolated
 *             endpoint's PD, the same READ (WRITE) through it, close it:
 *             what a lease (reservation) now costs the data path;
 *   store     a whole ecs_get_batch over RDMA against the real server loop
 *             (LEASE, window, READ, RELEASE), for scale.
 *
 * Cells are interleaved (baseline, windows, store, baseline, ...) so load
 * on the machine hits them alike; each prints the median and p25..p75 in
 * microseconds and the median of per-round ratios windows / baseline.
 *
 * Emulation figures are not hardware figures: there a registration is a
 * malloc and a list insert, while ibv_reg_mr_iova on a NIC pins and maps
 * the block's pages (tens of microseconds and more per MiB) and
 * ibv_dereg_mr waits for the device.  Run it on a device host (with the
 * real table) before drawing conclusions about hardware.
 *
 * usage: ecstore-bench-rdma-window [rounds] [--device]
 *   rounds    per cell (default 31)
 *   --device  libibverbs and the first device (ECS_RDMA_DEVICE names
 *             another) instead of the emulation: the hardware figures,
 *             on a host that has one (not run here: no device)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ecstore/ecstore.h"
#include "store/core/log.h"
#include "store/rdma/rdma.h"
#include "store/server/server.h"
#include "support/fixture.h"
#include "support/verbs_emu.h"

#define MIB (1024u * 1024u)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile of v[0..n) (sorts v). */
static double quant(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return v[(int)(q * (n - 1) + 0.5)];
}

typedef struct pair {
  ecs_rdma_ep *sep; /* server side */
  ecs_rdma_ep *cep; /* client side */
} pair_t;

static int pair_xchg(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE], uint8_t remote[ECS_RDMA_BLOB_SIZE],
                     int timeout_ms) {
  (void)timeout_ms;
  pair_t *p = arg;
  int rc = ecs_rdma_ep_reset(p->sep);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_connect(p->sep, local, ECS_RDMA_BLOB_SIZE);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_local_blob(p->sep, remote);
  return rc;
}

static int pair_connect(pair_t *p) {
  uint8_t local[ECS_RDMA_BLOB_SIZE], remote[ECS_RDMA_BLOB_SIZE];
  ecs_rdma_ep_set_exchange(p->cep, pair_xchg, p);
  int rc = ecs_rdma_ep_local_blob(p->cep, local);
  if (rc == ECS_OK)
    rc = pair_xchg(p, local, remote, 0);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_connect(p->cep, remote, sizeof remote);
  return rc;
}

static int one(ecs_rdma_ep *ep, int write, ecs_rdma_mr *local, uint64_t addr, uint32_t rkey, uint64_t len) {
  ecs_rdma_item it = {.local = local, .remote_addr = addr, .rkey = rkey, .len = len};
  int st = ECS_EIO;
  int rc = write ? ecs_rdma_write_batch(ep, &it, 1, &st, 5000) : ecs_rdma_read_batch(ep, &it, 1, &st, 5000);
  return rc ? rc : st;
}

static void *serve(void *p) {
  ecs_server_run(p);
  return NULL;
}

static void fail(const char *what, int rc) {
  fprintf(stderr, "ecstore-bench-rdma-window: %s: %s\n", what, ecs_strerror(rc));
  exit(1);
}

int main(int argc, char **argv) {
  int rounds = 31, hw = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device"))
      hw = 1;
    else
      rounds = atoi(argv[i]);
  }
  if (rounds < 5 || rounds > 100000) {
    fprintf(stderr, "usage: ecstore-bench-rdma-window [rounds >= 5] [--device]\n");
    return 2;
  }
  static const uint64_t sizes[] = {64 * 1024, MIB, 4 * MIB, 16 * MIB};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  const size_t pool_len = 64 * MIB;

  ecs_verbs_emu *emu = NULL;
  int rc = ECS_OK;
  const ecs_verbs_ops *ops = NULL; /* libibverbs */
  ecs_rdma_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.device = getenv("ECS_RDMA_DEVICE");
  if (!hw) {
    if ((rc = ecs_verbs_emu_create(1, &emu)))
      fail("emulation", rc);
    ops = ecs_verbs_emu_ops(emu);
  }
  ecs_rdma_ctx *sctx, *cctx;
  char err[160] = "";
  if ((rc = ecs_rdma_ctx_open(&ro, ops, &sctx, err, sizeof err)) ||
      (rc = ecs_rdma_ctx_open(&ro, ops, &cctx, err, sizeof err))) {
    fprintf(stderr, "ecstore-bench-rdma-window: %s\n", err);
    return 1;
  }
  uint8_t *pool = malloc(pool_len), *buf = malloc(16 * MIB);
  if (!pool || !buf)
    fail("malloc", ECS_ENOMEM);
  memset(pool, 1, pool_len);
  memset(buf, 2, 16 * MIB);
  ecs_rdma_mr *pool_mr, *bmr;
  if ((rc = ecs_rdma_reg(sctx, pool, pool_len, ECS_RDMA_REMOTE_READ | ECS_RDMA_REMOTE_WRITE, &pool_mr)) ||
      (rc = ecs_rdma_reg(cctx, buf, 16 * MIB, 0, &bmr)))
    fail("reg", rc);
  pair_t base = {0}, win = {0};
  if ((rc = ecs_rdma_ep_create(sctx, pool_mr, &base.sep)) ||
      (rc = ecs_rdma_ep_create(cctx, NULL, &base.cep)) || (rc = pair_connect(&base)) ||
      (rc = ecs_rdma_ep_create_isolated(sctx, &win.sep)) || (rc = ecs_rdma_ep_create(cctx, NULL, &win.cep)) ||
      (rc = pair_connect(&win)))
    fail("endpoints", rc);

  /* the store, over the same emulation */
  ecs__rdma_set_ops_override(ops);
  ecs_server_opts_t o;
  ecs_server_opts_init(&o);
  o.listen_port = 0;
  o.pool_size = 128 * MIB;
  o.lock_pool = 0;
  snprintf(o.redis_url, sizeof o.redis_url, "none");
  snprintf(o.ns, sizeof o.ns, "bench");
  snprintf(o.shm_socket, sizeof o.shm_socket, "off");
  snprintf(o.rdma, sizeof o.rdma, "on");
  if (ro.device)
    snprintf(o.rdma_device, sizeof o.rdma_device, "%s", ro.device);
  ecs_log_set_level(ECS_LOG_WARN);
  ecs_server_t *srv;
  if ((rc = ecs_server_create(&o, &srv)))
    fail("server", rc);
  pthread_t th;
  pthread_create(&th, NULL, serve, srv);
  char servers[64];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", ecs_server_port(srv));
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = servers;
  cfg.ns = "bench";
  cfg.transport = "rdma";
  cfg.rdma_device = ro.device;
  ecs_client_t *cli;
  if ((rc = ecs_client_connect(&cfg, &cli, NULL, 0)) || strcmp(ecs_client_transport(cli), "rdma"))
    fail("client over rdma", rc ? rc : ECS_ENOTSUP);
  if ((rc = ecs_register_buffer(cli, buf, 16 * MIB)))
    fail("register_buffer", rc);
  char names[NS][16];
  for (int s = 0; s < NS; s++) {
    snprintf(names[s], sizeof names[s], "obj%d", s);
    ecs_key_t k = {names[s], strlen(names[s])};
    ecs_tensor_t t;
    memset(&t, 0, sizeof t);
    t.data = buf;
    t.nbytes = sizes[s];
    t.desc.dtype = ECS_DTYPE_U8;
    t.desc.ndim = 1;
    t.desc.shape[0] = sizes[s];
    int st;
    if ((rc = ecs_put_batch(cli, &k, &t, 1, &st)) || (rc = st))
      fail("put", rc);
  }

  printf("# ecstore-bench-rdma-window: %d rounds per cell, %s; device %s\n", rounds,
         hw ? "libibverbs" : "verbs EMULATION (not hardware: see the header)", ecs_rdma_ctx_device(sctx));
  printf("# us: median [p25..p75]; ratio: median [p25..p75] of per-round windows/baseline; "
         "added: median(windows) - median(baseline), also as %% of a whole store get\n");
  printf("%-5s %9s  %-28s %-28s %-22s %9s  %-28s %8s\n", "op", "size", "baseline us", "windows us", "ratio",
         "added us", "store get us", "added%");
  double *b = malloc(sizeof(double) * (size_t)rounds), *w = malloc(sizeof(double) * (size_t)rounds);
  double *r = malloc(sizeof(double) * (size_t)rounds), *g = malloc(sizeof(double) * (size_t)rounds);
  for (int write = 0; write <= 1; write++) {
    for (int s = 0; s < NS; s++) {
      uint64_t len = sizes[s];
      int access = write ? ECS_RDMA_REMOTE_WRITE : ECS_RDMA_REMOTE_READ;
      for (int i = 0; i < rounds + 2; i++) { /* two warm-up rounds */
        double tb = 0, tw = 0;
        for (int half = 0; half < 2; half++) { /* alternate which goes first: no order bias */
          double t0 = now_us();
          if ((half ^ (i & 1)) == 0) {
            if ((rc = one(base.cep, write, bmr, ecs_rdma_mr_addr(pool_mr), ecs_rdma_mr_rkey(pool_mr), len)))
              fail("baseline transfer", rc);
            tb = now_us() - t0;
          } else {
            ecs_rdma_mr *wmr;
            if ((rc = ecs_rdma_ep_window(win.sep, pool, (size_t)len, access, &wmr)))
              fail("window", rc);
            if ((rc = one(win.cep, write, bmr, 0, ecs_rdma_mr_rkey(wmr), len)))
              fail("window transfer", rc);
            ecs_rdma_dereg(wmr);
            tw = now_us() - t0;
          }
        }
        double t2 = now_us();
        ecs_key_t k = {names[s], strlen(names[s])};
        ecs_get_buf_t gb = {.data = buf, .capacity = 16 * MIB};
        if ((rc = ecs_get_batch(cli, &k, &gb, 1)) || (rc = gb.status))
          fail("store get", rc);
        double t3 = now_us();
        if (i < 2)
          continue;
        b[i - 2] = tb;
        w[i - 2] = tw;
        r[i - 2] = tw / tb;
        g[i - 2] = t3 - t2;
      }
      double b50 = quant(b, rounds, 0.5), b25 = quant(b, rounds, 0.25), b75 = quant(b, rounds, 0.75);
      double w50 = quant(w, rounds, 0.5), w25 = quant(w, rounds, 0.25), w75 = quant(w, rounds, 0.75);
      double r50 = quant(r, rounds, 0.5), r25 = quant(r, rounds, 0.25), r75 = quant(r, rounds, 0.75);
      double g50 = quant(g, rounds, 0.5), g25 = quant(g, rounds, 0.25), g75 = quant(g, rounds, 0.75);
      char cb[40], cw[40], cr[40], cg[40];
      snprintf(cb, sizeof cb, "%.1f [%.1f..%.1f]", b50, b25, b75);
      snprintf(cw, sizeof cw, "%.1f [%.1f..%.1f]", w50, w25, w75);
      snprintf(cr, sizeof cr, "%.3f [%.3f..%.3f]", r50, r25, r75);
      snprintf(cg, sizeof cg, "%.1f [%.1f..%.1f]", g50, g25, g75);
      char pct[16] = "-";
      if (!write)
        snprintf(pct, sizeof pct, "%.2f%%", 100.0 * (w50 - b50) / g50);
      printf("%-5s %9llu  %-28s %-28s %-22s %9.1f  %-28s %8s\n", write ? "write" : "read",
             (unsigned long long)len, cb, cw, cr, w50 - b50, write ? "-" : cg, pct);
    }
  }
  free(b);
  free(w);
  free(r);
  free(g);
  ecs_unregister_buffer(cli, buf);
  ecs_client_close(cli);
  ecs_server_stop(srv);
  pthread_join(th, NULL);
  ecs_server_destroy(srv);
  ecs__rdma_set_ops_override(NULL);
  ecs_rdma_ep_destroy(base.cep);
  ecs_rdma_ep_destroy(base.sep);
  ecs_rdma_ep_destroy(win.cep);
  ecs_rdma_ep_destroy(win.sep);
  ecs_rdma_dereg(pool_mr);
  ecs_rdma_dereg(bmr);
  ecs_rdma_ctx_close(cctx);
  ecs_rdma_ctx_close(sctx);
  ecs_verbs_emu_destroy(emu); /* accepts NULL */
  free(pool);
  free(buf);
  return 0;
}
