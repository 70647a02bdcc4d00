/*
 * ecstore-bench compare, scaling sections: get throughput against client
 * connections; put/get latency and the cost of an eviction as the pool
 * grows; latency as the number of stored objects grows.  Each pool or
 * object-count step runs its own ecstore-server, so one step's state never
 * colours the next.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "bench_compare.h"
#include "ecstore/ecstore.h"
#include "support/ts.h"

#define SERVER_START_MS 180000 /* a server maps and populates its pool first */

/* ------------------------------------------------------------------ */
/* connections                                                 */

int ecs__cmp_conns_table(const ccfg_t *cfg, run_t *r, FILE *csv) {
  size_t size = MIB;
  int b = 8;
  const int idx[] = {P_RAW, P_TCP, P_REDIS, P_SHM, P_MEMCPY};
  ecs__cmp_outf("## get throughput against client connections (1 MiB objects, batches of 8; GB/s "
                "median [min-max])\n");
  ecs__cmp_outf("%5s", "conns");
  for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++)
    ecs__cmp_outf(" %23s", ecs__cmp_get_paths[idx[k]].name);
  ecs__cmp_outf("\n");
  if (csv)
    fprintf(csv, "conns,path,size,batch,gbps,gbps_min,gbps_max,p50_us,p99_us\n");
  for (int i = 0; i < cfg->nconns; i++) {
    int n = cfg->conns[i];
    ecs__cmp_outf("%5d", n);
    for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
      const path_t *p = &ecs__cmp_get_paths[idx[k]];
      char what[96];
      snprintf(what, sizeof what, "connections: %d x %s", n, p->name);
      ecs__cmp_progress(what);
      ecs_bench_result_t x;
      if (ecs__cmp_measure(cfg, r, p, size, b, n, &x)) {
        ecs__cmp_progress_end();
        return -1;
      }
      ecs__cmp_progress_end();
      ecs__cmp_outf(" %7.2f [%6.2f-%6.2f]", x.gbps, x.gbps_min, x.gbps_max);
      if (csv)
        fprintf(csv, "%d,%s,%zu,%d,%.4f,%.4f,%.4f,%.1f,%.1f\n", n, p->name, size, b, x.gbps, x.gbps_min,
                x.gbps_max, x.p50_us, x.p99_us);
    }
    ecs__cmp_outf("\n");
  }
  ecs__cmp_outf("# %ld cores: past that many connections client and server threads share them.\n\n",
                sysconf(_SC_NPROCESSORS_ONLN));
  return 0;
}

/* ------------------------------------------------------------------ */
/* scaling: pool size and object count                                  */

static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  unsigned long long kib = 0;
  char line[128];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
      break;
  if (f)
    fclose(f);
  return (uint64_t)kib * 1024;
}

/* --no-mlock when the pool exceeds RLIMIT_MEMLOCK: a pool that cannot be
 * locked would only warn, but saying it keeps runs alike. */
int ecs__cmp_need_no_mlock(size_t pool) {
  struct rlimit rl;
  return getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || (rl.rlim_cur != RLIM_INFINITY && pool > rl.rlim_cur);
}

/* An ecstore-server of its own for a scaling step: no background eviction
 * (watermarks at 1.0), so a put into a full pool evicts on demand, in the
 * put's own time. */
static int start_server(const run_t *r, ecs_ts_proc_t *srv, size_t pool, char *servers, size_t cap,
                        double *start_s) {
  char psz[32], listen[32], redis[32];
  const char *bin = ecs_ts_bin("ecstore-server");
  memset(srv, 0, sizeof *srv);
  int port = ecs_ts_free_port();
  if (port <= 0)
    return -1;
  snprintf(psz, sizeof psz, "%zuM", pool / MIB);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  snprintf(redis, sizeof redis, "127.0.0.1:%d", r->redis_port);
  char *argv[] = {(char *)bin, "--listen",
                  listen,      "--redis",
                  redis,       "--ns",
                  "test",      "--pool-size",
                  psz,         "--log-level",
                  "warn",      "--high-watermark",
                  "1.0",       "--low-watermark",
                  "1.0",       ecs__cmp_need_no_mlock(pool) ? "--no-mlock" : NULL,
                  NULL};
  uint64_t t0 = ecs_bench_now_ns();
  /* ecs_ts_server_start() waits 15 s: a large pool on a VM whose memory
   * the host has not backed yet takes longer to populate */
  if (ecs_ts_spawn(srv, argv) || ecs_ts_wait_port(srv, port, SERVER_START_MS)) {
    ecs_ts_stop(srv, 5000);
    return -1;
  }
  srv->port = port;
  *start_s = (double)(ecs_bench_now_ns() - t0) / 1e9;
  snprintf(servers, cap, "127.0.0.1:%d", port);
  return 0;
}

ecs_client_t *ecs__cmp_client(const char *servers, const char *transport) {
  ecs_client_config_t c;
  ecs_client_config_init(&c);
  c.servers = servers;
  c.transport = transport;
  c.ns = "test";
  c.timeout_ms = 60000;
  ecs_client_t *h = NULL;
  char err[256];
  if (ecs_client_connect(&c, &h, err, sizeof err) != ECS_OK)
    fprintf(stderr, "ecstore-bench compare: connect (%s): %s\n", transport, err);
  return h;
}

static void tensor_of(ecs_tensor_t *t, const void *data, size_t size) {
  memset(t, 0, sizeof *t);
  t->data = data;
  t->nbytes = size;
  t->desc.dtype = ECS_DTYPE_U8;
  t->desc.ndim = 1;
  t->desc.shape[0] = size;
}

/* Stores objects "prefix-<from..to)" of `size` bytes in batches of 64 over
 * c.  0 or -1. */
static int fill(ecs_client_t *c, const char *prefix, uint64_t from, uint64_t to, const uint8_t *src,
                size_t size) {
  enum { B = 64 };
  char names[B][48];
  ecs_key_t keys[B];
  ecs_tensor_t ts[B];
  int st[B];
  for (uint64_t i = from; i < to;) {
    int n = 0;
    for (; n < B && i < to; n++, i++) {
      snprintf(names[n], sizeof names[n], "%s-%llu", prefix, (unsigned long long)i);
      keys[n] = (ecs_key_t){names[n], strlen(names[n])};
      tensor_of(&ts[n], src, size);
    }
    if (ecs_put_batch(c, keys, ts, (size_t)n, st) != ECS_OK)
      return -1;
    for (int k = 0; k < n; k++)
      if (st[k] != ECS_OK) {
        fprintf(stderr, "ecstore-bench compare: fill: %s\n", ecs_strerror(st[k]));
        return -1;
      }
  }
  return 0;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* n timed single-object puts of fresh keys "prefix-i"; latencies (us) into lat. */
static int timed_puts(ecs_client_t *c, const char *prefix, int n, const uint8_t *src, size_t size,
                      double *lat) {
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s-%d", prefix, i);
    ecs_key_t k = {name, strlen(name)};
    ecs_tensor_t t;
    tensor_of(&t, src, size);
    int st;
    uint64_t t0 = ecs_bench_now_ns();
    if (ecs_put_batch(c, &k, &t, 1, &st) != ECS_OK || st != ECS_OK) {
      fprintf(stderr, "ecstore-bench compare: put %s: %s\n", name, ecs_strerror(st));
      return -1;
    }
    lat[i] = (double)(ecs_bench_now_ns() - t0) / 1e3;
  }
  return 0;
}

/* n timed single-object gets of random keys "prefix-[lo, hi)". */
static int timed_gets(ecs_client_t *c, const char *prefix, uint64_t lo, uint64_t hi, int n, uint8_t *dst,
                      size_t size, double *lat) {
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s-%llu", prefix, (unsigned long long)(lo + rnd(&seed) % (hi - lo)));
    ecs_key_t k = {name, strlen(name)};
    ecs_get_buf_t g = {.data = dst, .capacity = size};
    uint64_t t0 = ecs_bench_now_ns();
    if (ecs_get_batch(c, &k, &g, 1) != ECS_OK || g.status != ECS_OK) {
      fprintf(stderr, "ecstore-bench compare: get %s: %s\n", name, ecs_strerror(g.status));
      return -1;
    }
    lat[i] = (double)(ecs_bench_now_ns() - t0) / 1e3;
  }
  return 0;
}

/* In a full pool, n pairs of single 4 MiB puts: E (must evict), remove E,
 * then R (fits in E's block: must not evict).  Paired in the same state,
 * so their difference is the eviction's cost.  *per: objects evicted per
 * E; *last: the server's counters at the end.  -1 when an R evicted too
 * (the pairing did not hold). */
static int evict_pairs(ecs_client_t *c, int n, const uint8_t *src, size_t size, double *lat_e, double *lat_r,
                       double *per, ecs_server_stat_t *last) {
  uint64_t evicted = 0, stray = 0;
  ecs_server_stat_t a, b;
  if (ecs_stat(c, 0, &a) != ECS_OK)
    return -1;
  for (int i = 0; i < n; i++) {
    char name[48], ev[48];
    snprintf(name, sizeof name, "ev-%d", i);
    if (timed_puts(c, name, 1, src, size, &lat_e[i]) || ecs_stat(c, 0, &b) != ECS_OK)
      return -1;
    evicted += b.evictions - a.evictions;
    snprintf(ev, sizeof ev, "ev-%d-0", i); /* timed_puts appends "-0" */
    ecs_key_t k = {ev, strlen(ev)};
    int st;
    if (ecs_remove_batch(c, &k, 1, &st) != ECS_OK || st != ECS_OK) {
      fprintf(stderr, "ecstore-bench compare: remove %s: %s\n", ev, ecs_strerror(st));
      return -1;
    }
    snprintf(name, sizeof name, "room-%d", i);
    if (ecs_stat(c, 0, &a) != ECS_OK || timed_puts(c, name, 1, src, size, &lat_r[i]) ||
        ecs_stat(c, 0, &b) != ECS_OK)
      return -1;
    stray += b.evictions - a.evictions;
    a = b;
  }
  *per = (double)evicted / n;
  *last = b;
  if (stray)
    fprintf(stderr, "ecstore-bench compare: %llu evictions during puts that should have fit\n",
            (unsigned long long)stray);
  return 0;
}

/* Pool scaling, per pool size: put latency of 4 MiB objects with room;
 * the pool filled to the brim (64 KiB objects first, so they are the ones
 * evicted); get latency of random 64 KiB objects; put latency of 64 KiB
 * and of 4 MiB objects that must evict, and from the latter the cost per
 * evicted object. */
int ecs__cmp_pool_table(const ccfg_t *cfg, run_t *r, FILE *csv) {
  const size_t small = 64 << 10, big = 4 * MIB;
  enum { NBIG = 24, NSMALL = 400, NGET = 2000 };
  ecs__cmp_outf(
      "## latency and eviction cost against pool size (tcp, 1 connection, single-object calls, us)\n"
      "# pool filled until puts evict: its oldest quarter (<= 256 MiB) 64 KiB objects, the rest 1 MiB; gets\n"
      "# read random 64 KiB objects; 'evicting' puts find the pool full and evict the oldest (no background\n"
      "# eviction: watermarks 1.0).  Each 4M evicting put is removed and followed by a 4M put into the\n"
      "# freed block (put4M, no eviction): evict cost = (put4Mev p50 - put4M p50) / evicted per put.\n");
  ecs__cmp_outf("%5s %8s %9s %9s %9s %9s %9s %9s %9s %8s %10s %7s %6s\n", "pool", "objects", "get64K50",
                "get64K99", "put4M", "put4Mev50", "put4Mev99", "put64K50", "put64K99", "ev/put", "us/evicted",
                "start s", "fill s");
  if (csv)
    fprintf(csv, "pool_gib,objects,get_p50_us,get_p99_us,put_room_p50_us,put_evict_p50_us,put_evict_p99_us,"
                 "put_small_p50_us,put_small_p99_us,evicted_per_put,evict_us_per_object,fill_s,start_s\n");
  uint8_t *src = malloc(big), *dst = malloc(big);
  double *lat = malloc(NGET * sizeof *lat);
  if (!src || !dst || !lat) {
    free(src);
    free(dst);
    free(lat);
    return -1;
  }
  memset(src, 0x5a, big);
  memset(dst, 0, big);
  int rc = 0;
  for (int i = 0; i < cfg->npools && !rc; i++) {
    size_t pool = cfg->pools[i];
    char pl[16];
    ecs_bench_size_label(pl, sizeof pl, pool);
    uint64_t avail = mem_available();
    if (avail < pool + MEM_HEADROOM) {
      ecs__cmp_outf(
          "%5s skipped: MemAvailable %.1f GiB < pool + %llu GiB headroom (the pool is populated up front)\n",
          pl, (double)avail / GIB, (unsigned long long)(MEM_HEADROOM / GIB));
      ecs__cmp_cells_done++;
      continue;
    }
    char what[96];
    snprintf(what, sizeof what, "pool %s: starting the server", pl);
    ecs__cmp_progress(what);
    ecs_ts_proc_t srv;
    char servers[64];
    double start_s = 0;
    if (start_server(r, &srv, pool, servers, sizeof servers, &start_s)) {
      ecs__cmp_progress_end();
      ecs__cmp_outf("%5s skipped: the server did not start\n", pl);
      ecs__cmp_cells_done++;
      continue;
    }
    ecs_client_t *tc = ecs__cmp_client(servers, "tcp"), *sc = ecs__cmp_client(servers, "shm");
    double room50 = 0, ev50 = 0, ev99 = 0, g50 = 0, g99 = 0, s50 = 0, s99 = 0, per = 0, cost = 0, fill_s = 0;
    uint64_t nobj = 0;
    ecs_server_stat_t st0, st1;
    rc = !tc || !sc;
    /* fill: the oldest quarter (at most 256 MiB) with 64 KiB objects, which
     * the measured puts will evict, then 1 MiB objects (faster to store)
     * until the pool is full and puts start to evict */
    snprintf(what, sizeof what, "pool %s: filling", pl);
    ecs__cmp_progress(what);
    uint64_t t0 = ecs_bench_now_ns(), nsmall = (pool / 4 < 256 * MIB ? pool / 4 : 256 * MIB) / small;
    if (!rc)
      rc = fill(sc, "fill", 0, nsmall, src, small);
    while (!rc) {
      rc = ecs_stat(tc, 0, &st0) != ECS_OK;
      if (rc || st0.evictions > 0 || nobj > 2 * (pool / MIB))
        break;
      uint64_t step = st0.bytes_free / MIB;
      step = step < 1 ? 1 : step > 512 ? 512 : step;
      rc = fill(sc, "bigfill", nobj, nobj + step, src, MIB);
      nobj += step;
    }
    fill_s = (double)(ecs_bench_now_ns() - t0) / 1e9;
    snprintf(what, sizeof what, "pool %s: measuring", pl);
    ecs__cmp_progress(what);
    /* gets among the newer half of the small objects (none evicted yet) */
    if (!rc)
      rc = timed_gets(tc, "fill", nsmall / 2, nsmall, NGET, dst, small, lat);
    if (!rc) {
      g50 = ecs_bench_percentile(lat, NGET, 50);
      g99 = ecs_bench_percentile(lat, NGET, 99);
      rc = timed_puts(tc, "small-ev", NSMALL, src, small, lat);
    }
    if (!rc) {
      s50 = ecs_bench_percentile(lat, NSMALL, 50);
      s99 = ecs_bench_percentile(lat, NSMALL, 99);
      rc = evict_pairs(tc, NBIG, src, big, lat, lat + NBIG, &per, &st1);
    }
    if (!rc) {
      ev50 = ecs_bench_percentile(lat, NBIG, 50);
      ev99 = ecs_bench_percentile(lat, NBIG, 99);
      room50 = ecs_bench_percentile(lat + NBIG, NBIG, 50);
      cost = per > 0 ? (ev50 - room50) / per : 0;
      ecs__cmp_outf("%5s %8llu %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %8.1f %10.2f %7.1f %6.1f\n", pl,
                    (unsigned long long)st1.objects, g50, g99, room50, ev50, ev99, s50, s99, per, cost,
                    start_s, fill_s);
      if (csv)
        fprintf(csv, "%.0f,%llu,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.2f,%.3f,%.1f,%.1f\n", (double)pool / GIB,
                (unsigned long long)st1.objects, g50, g99, room50, ev50, ev99, s50, s99, per, cost, fill_s,
                start_s);
    }
    ecs__cmp_progress_end();
    ecs_client_close(tc);
    ecs_client_close(sc);
    ecs_ts_stop(&srv, 10000);
    ecs__cmp_cells_done++;
  }
  ecs__cmp_outf(
      "# p50/p99 over %d gets, %d small and %d big puts per pool; the pool is memfd-backed and populated\n"
      "# at start; --no-mlock above RLIMIT_MEMLOCK.\n\n",
      NGET, NSMALL, NBIG);
  free(src);
  free(dst);
  free(lat);
  return rc ? -1 : 0;
}

/* Object-count scaling: one server, filled step by step with 4 KiB
 * objects; at each count, latency of single gets and puts, and the
 * objects/s of batches of 32 random gets. */
int ecs__cmp_objs_table(const ccfg_t *cfg, run_t *r, FILE *csv) {
  const size_t size = 4096;
  enum { NGET = 2000, NPUT = 400, NB = 200, B = 32 };
  size_t maxn = cfg->objs[cfg->nobjs - 1];
  size_t pool = (maxn * size + maxn * size / 4 + 256 * MIB + GIB - 1) / GIB * GIB;
  ecs__cmp_outf("## latency against the number of stored objects (4 KiB objects, tcp, 1 connection, us)\n");
  uint64_t avail = mem_available();
  if (avail < pool + MEM_HEADROOM) {
    ecs__cmp_outf("skipped: a %zu GiB pool would leave less than %llu GiB free (MemAvailable %.1f GiB)\n\n",
                  pool / GIB, (unsigned long long)(MEM_HEADROOM / GIB), (double)avail / GIB);
    ecs__cmp_cells_done += cfg->nobjs;
    return 0;
  }
  ecs__cmp_outf("%8s %9s %9s %9s %9s %12s %8s\n", "objects", "get p50", "get p99", "put p50", "put p99",
                "get32 obj/s", "fill s");
  if (csv)
    fprintf(csv, "objects,get_p50_us,get_p99_us,put_p50_us,put_p99_us,get32_objs_per_s,fill_s\n");
  ecs__cmp_progress("objects: starting the server");
  ecs_ts_proc_t srv;
  char servers[64];
  double start_s = 0;
  if (start_server(r, &srv, pool, servers, sizeof servers, &start_s)) {
    ecs__cmp_progress_end();
    ecs__cmp_outf("skipped: the server did not start\n\n");
    ecs__cmp_cells_done += cfg->nobjs;
    return 0;
  }
  ecs_client_t *tc = ecs__cmp_client(servers, "tcp"), *sc = ecs__cmp_client(servers, "shm");
  uint8_t *src = malloc(size), *dst = malloc((size_t)B * size);
  double *lat = malloc(NGET * sizeof *lat);
  int rc = !tc || !sc || !src || !dst || !lat;
  if (!rc)
    memset(src, 0x77, size);
  uint64_t have = 0, seed = 12345, put_seq = 0;
  for (int i = 0; i < cfg->nobjs && !rc; i++) {
    uint64_t want = cfg->objs[i];
    char what[96];
    snprintf(what, sizeof what, "objects: filling to %llu", (unsigned long long)want);
    ecs__cmp_progress(what);
    uint64_t t0 = ecs_bench_now_ns();
    if (want > have)
      rc = fill(sc, "obj", have, want, src, size);
    double fill_s = (double)(ecs_bench_now_ns() - t0) / 1e9;
    have = want > have ? want : have;
    if (rc)
      break;
    double g50, g99, p50, p99, ops;
    rc = timed_gets(tc, "obj", 0, have, NGET, dst, size, lat);
    if (rc)
      break;
    g50 = ecs_bench_percentile(lat, NGET, 50);
    g99 = ecs_bench_percentile(lat, NGET, 99);
    char prefix[48];
    snprintf(prefix, sizeof prefix, "objput%llu", (unsigned long long)put_seq++);
    rc = timed_puts(tc, prefix, NPUT, src, size, lat);
    if (rc)
      break;
    p50 = ecs_bench_percentile(lat, NPUT, 50);
    p99 = ecs_bench_percentile(lat, NPUT, 99);
    /* batches of 32 random keys */
    char names[B][48];
    ecs_key_t keys[B];
    ecs_get_buf_t gb[B];
    uint64_t t1 = ecs_bench_now_ns();
    for (int k = 0; k < NB && !rc; k++) {
      for (int j = 0; j < B; j++) {
        snprintf(names[j], sizeof names[j], "obj-%llu", (unsigned long long)(rnd(&seed) % have));
        keys[j] = (ecs_key_t){names[j], strlen(names[j])};
        gb[j] = (ecs_get_buf_t){.data = dst + (size_t)j * size, .capacity = size};
      }
      rc = ecs_get_batch(tc, keys, gb, B) != ECS_OK;
      for (int j = 0; j < B && !rc; j++)
        rc = gb[j].status != ECS_OK;
    }
    ops = (double)NB * B / ((double)(ecs_bench_now_ns() - t1) / 1e9);
    ecs__cmp_progress_end();
    if (rc)
      break;
    ecs__cmp_outf("%8llu %9.0f %9.0f %9.0f %9.0f %12.0f %8.1f\n", (unsigned long long)have, g50, g99, p50,
                  p99, ops, fill_s);
    if (csv)
      fprintf(csv, "%llu,%.1f,%.1f,%.1f,%.1f,%.0f,%.2f\n", (unsigned long long)have, g50, g99, p50, p99, ops,
              fill_s);
    ecs__cmp_cells_done++;
  }
  ecs__cmp_progress_end();
  if (rc)
    fprintf(stderr, "ecstore-bench compare: object scaling failed\n");
  ecs__cmp_outf(
      "# one %zu GiB pool (server start %.1f s); %d gets and %d puts per step; fill over shm in batches\n"
      "# of 64.\n\n",
      pool / GIB, start_s, NGET, NPUT);
  ecs_client_close(tc);
  ecs_client_close(sc);
  ecs_ts_stop(&srv, 10000);
  free(src);
  free(dst);
  free(lat);
  return rc ? -1 : 0;
}
