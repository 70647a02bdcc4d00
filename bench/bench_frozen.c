/*
 * ecstore-bench frozen: what a stopped Redis does to gets.  One client
 * keeps putting new objects and another keeps getting stored ones (with
 * byte checks off the clock), first with Redis running (the baseline),
 * then for the same time with Redis frozen by SIGSTOP (SIGCONT after).
 * The putter upserts new content over 64 keys, so each put commits and
 * publishes a record without filling the pool.
 * Printed per phase: get p50, p99 and the slowest get, and the slowest put;
 * the frozen row's slowest get is compared with the normal run's p99 of the
 * same repetition.  Target (issue 12): no get slower than 10 ms while Redis
 * is frozen.  It starts its own redis-server (it must be able to stop it)
 * and ecstore-server on free ports.  The machine's load average is printed
 * with the figures: on a shared machine it explains outliers.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_work.h"
#include "ecstore/ecstore.h"
#include "support/ts.h"

#define HOT 16              /* objects the getter reads, round robin */
#define MAX_SAMPLES 2000000 /* get latencies kept per phase */
#define PUT_KEYS 64         /* keys the putter rewrites */

typedef struct fz_cfg {
  size_t size;       /* object bytes */
  double seconds;    /* per phase (the freeze lasts this long) */
  int reps;          /* normal + frozen pairs */
  int redis_timeout; /* the server's --redis-timeout-ms */
} fz_cfg_t;

typedef struct fz_phase {
  const char *servers;     /* where */
  size_t size;             /* object bytes */
  atomic_int stop;         /* set to end the phase */
  int seq;                 /* the putter's key sequence (unique per phase) */
  double *lat_ms;          /* get latencies */
  size_t nlat;             /* how many */
  double put_max_ms;       /* the slowest put */
  size_t puts, put_eredis; /* puts answered, of which ECS_EREDIS */
  int bad;                 /* failed gets, wrong bytes, failed puts */
} fz_phase_t;

static ecs_client_t *fz_client(const char *servers) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = servers;
  cfg.ns = "test";
  cfg.transport = "tcp";
  cfg.timeout_ms = 30000;
  ecs_client_t *c = NULL;
  char err[256] = "";
  if (ecs_client_connect(&cfg, &c, err, sizeof err) != ECS_OK) {
    fprintf(stderr, "ecstore-bench frozen: connect %s: %s\n", servers, err);
    return NULL;
  }
  return c;
}

static int fz_put(ecs_client_t *c, const char *key, const void *p, size_t n, int upsert) {
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = (void *)p;
  t.nbytes = n;
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  int st = ECS_OK;
  int rc = upsert ? ecs_upsert_batch(c, &k, &t, 1, &st) : ecs_put_batch(c, &k, &t, 1, &st);
  return rc != ECS_OK ? rc : st;
}

static void fz_fill(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(seed * 31u + i * 7u + (i >> 8));
}

static void *fz_getter(void *arg) {
  fz_phase_t *ph = arg;
  ecs_client_t *c = fz_client(ph->servers);
  uint8_t *buf = malloc(ph->size), *want = malloc(ph->size);
  if (c == NULL || buf == NULL || want == NULL) {
    ph->bad++;
    goto out;
  }
  for (int i = 0; !atomic_load(&ph->stop); i = (i + 1) % HOT) {
    char key[32];
    snprintf(key, sizeof key, "hot-%d", i);
    ecs_key_t k = {key, strlen(key)};
    ecs_get_buf_t b = {.data = buf, .capacity = ph->size};
    uint64_t t0 = ecs_bench_now_ns();
    int rc = ecs_get_batch(c, &k, &b, 1);
    double ms = (double)(ecs_bench_now_ns() - t0) / 1e6;
    if (ph->nlat < MAX_SAMPLES)
      ph->lat_ms[ph->nlat++] = ms;
    fz_fill(want, ph->size, (uint32_t)i);
    if (rc != ECS_OK || b.status != ECS_OK || b.nbytes != ph->size || memcmp(buf, want, ph->size) != 0)
      ph->bad++;
  }
out:
  ecs_client_close(c);
  free(buf);
  free(want);
  return NULL;
}

static void *fz_putter(void *arg) {
  fz_phase_t *ph = arg;
  ecs_client_t *c = fz_client(ph->servers);
  uint8_t *buf = malloc(ph->size);
  if (c == NULL || buf == NULL) {
    ph->bad++;
    goto out;
  }
  fz_fill(buf, ph->size, 999);
  while (!atomic_load(&ph->stop)) {
    /* New content over a few keys (upsert): every put commits and writes
     * a record, and the pool never fills up, so the hot objects are never
     * evicted. */
    char key[48];
    snprintf(key, sizeof key, "new-%zu", ph->puts % PUT_KEYS);
    memcpy(buf, &ph->puts, sizeof ph->puts);
    buf[sizeof ph->puts] = (uint8_t)ph->seq;
    uint64_t t0 = ecs_bench_now_ns();
    int st = fz_put(c, key, buf, ph->size, 1);
    double ms = (double)(ecs_bench_now_ns() - t0) / 1e6;
    ph->puts++;
    if (ms > ph->put_max_ms)
      ph->put_max_ms = ms;
    if (st == ECS_EREDIS)
      ph->put_eredis++;
    else if (st != ECS_OK)
      ph->bad++;
  }
out:
  ecs_client_close(c);
  free(buf);
  return NULL;
}

/* One phase of `seconds`: the getter and the putter, Redis frozen or not. */
static int fz_run(const fz_cfg_t *cfg, const char *servers, ecs_ts_proc_t *redis, int frozen, int seq,
                  fz_phase_t *ph) {
  memset(ph, 0, sizeof *ph);
  ph->servers = servers;
  ph->size = cfg->size;
  ph->seq = seq;
  ph->lat_ms = malloc(MAX_SAMPLES * sizeof *ph->lat_ms);
  if (ph->lat_ms == NULL)
    return -1;
  if (frozen && ecs_ts_signal(redis, SIGSTOP) != 0)
    return -1;
  pthread_t g, p;
  pthread_create(&g, NULL, fz_getter, ph);
  pthread_create(&p, NULL, fz_putter, ph);
  usleep((useconds_t)(cfg->seconds * 1e6));
  atomic_store(&ph->stop, 1);
  pthread_join(g, NULL); /* gets: all inside the freeze */
  if (frozen)
    ecs_ts_signal(redis, SIGCONT);
  pthread_join(p, NULL); /* a put may wait for the thaw */
  return 0;
}

static double loadavg1(void) {
  double l[3] = {0, 0, 0};
  return getloadavg(l, 3) > 0 ? l[0] : -1;
}

static void fz_usage(FILE *f) {
  fprintf(f, "usage: ecstore-bench frozen [options]\n"
             "  --size SIZE            object bytes (default 64K)\n"
             "  --seconds S            per phase; the freeze lasts this long (default 3)\n"
             "  --reps N               normal + frozen pairs (default 3)\n"
             "  --redis-timeout-ms MS  the server's Redis timeout (default 500, the server's)\n");
}

int ecs_bench_frozen(int argc, char **argv) {
  fz_cfg_t cfg = {.size = 64 << 10, .seconds = 3, .reps = 3, .redis_timeout = 500};
  static const struct option opts[] = {
      {"size", required_argument, 0, 's'}, {"seconds", required_argument, 0, 't'},
      {"reps", required_argument, 0, 'r'}, {"redis-timeout-ms", required_argument, 0, 'T'},
      {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 's':
      if (ecs_bench_parse_size(optarg, &cfg.size) || cfg.size == 0 || cfg.size > (64u << 20))
        goto bad;
      break;
    case 't':
      cfg.seconds = atof(optarg);
      if (cfg.seconds <= 0 || cfg.seconds > 60)
        goto bad;
      break;
    case 'r':
      cfg.reps = atoi(optarg);
      if (cfg.reps < 1 || cfg.reps > 20)
        goto bad;
      break;
    case 'T':
      cfg.redis_timeout = atoi(optarg);
      if (cfg.redis_timeout < 1 || cfg.redis_timeout > 60000)
        goto bad;
      break;
    case 'h': fz_usage(stdout); return 0;
    default: goto bad;
    }
  }
  if (optind != argc)
    goto bad;
  signal(SIGPIPE, SIG_IGN);
  ecs_bench_find_bins();
  ecs_ts_proc_t redis, server;
  memset(&redis, 0, sizeof redis);
  memset(&server, 0, sizeof server);
  if (ecs_ts_redis_start(&redis)) {
    fprintf(stderr, "ecstore-bench frozen: cannot start redis-server\n");
    return 1;
  }
  char rto[16];
  snprintf(rto, sizeof rto, "%d", cfg.redis_timeout);
  const char *extra[] = {"--pool-size", "1G", "--log-level", "warn", "--redis-timeout-ms", rto, NULL};
  if (ecs_ts_server_start(&server, redis.port, extra)) {
    fprintf(stderr, "ecstore-bench frozen: cannot start ecstore-server\n");
    ecs_ts_stop(&redis, 3000);
    return 1;
  }
  char servers[64];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", server.port);
  int failed = 0;
  ecs_client_t *c = fz_client(servers);
  uint8_t *buf = malloc(cfg.size);
  if (c == NULL || buf == NULL) {
    failed = 1;
    goto out;
  }
  for (int i = 0; i < HOT; i++) {
    char key[32];
    snprintf(key, sizeof key, "hot-%d", i);
    fz_fill(buf, cfg.size, (uint32_t)i);
    if (fz_put(c, key, buf, cfg.size, 0) != ECS_OK)
      failed = 1;
  }
  ecs_bench_print_machine();
  printf("# one client getting stored %zu-byte objects while another puts new ones; Redis running, then\n"
         "# frozen (SIGSTOP) for %.1f s; server --redis-timeout-ms %d; latencies in ms\n",
         cfg.size, cfg.seconds, cfg.redis_timeout);
  printf("%-4s %-7s %9s %9s %9s %9s %9s %8s %8s %7s\n", "rep", "redis", "gets", "get_p50", "get_p99",
         "get_max", "put_max", "puts", "eredis", "load1");
  double *ratio = calloc((size_t)cfg.reps, sizeof *ratio), *fmax = calloc((size_t)cfg.reps, sizeof *fmax);
  double *nmax = calloc((size_t)cfg.reps, sizeof *nmax);
  for (int r = 0; r < cfg.reps && !failed && ratio && fmax; r++) {
    double p99_normal = 0;
    if (nmax == NULL)
      break;
    for (int frozen = 0; frozen < 2; frozen++) {
      fz_phase_t ph;
      if (fz_run(&cfg, servers, &redis, frozen, r * 2 + frozen, &ph) != 0) {
        failed = 1;
        break;
      }
      size_t n = ph.nlat;
      double max = 0;
      for (size_t i = 0; i < n; i++)
        max = ph.lat_ms[i] > max ? ph.lat_ms[i] : max;
      double p50 = ecs_bench_percentile(ph.lat_ms, n, 50), p99 = ecs_bench_percentile(ph.lat_ms, n, 99);
      printf("%-4d %-7s %9zu %9.3f %9.3f %9.3f %9.1f %8zu %8zu %7.2f\n", r + 1, frozen ? "frozen" : "normal",
             n, p50, p99, max, ph.put_max_ms, ph.puts, ph.put_eredis, loadavg1());
      if (ph.bad) {
        fprintf(stderr, "ecstore-bench frozen: %d failed or wrong operations\n", ph.bad);
        failed = 1;
      }
      if (!frozen) {
        p99_normal = p99;
        nmax[r] = max;
      } else {
        fmax[r] = max;
        ratio[r] = p99_normal > 0 ? max / p99_normal : 0;
      }
      free(ph.lat_ms);
      fflush(stdout);
      if (!frozen)
        usleep(200000);
      else
        sleep(2); /* the thaw: reconnect and re-sync before the next pair */
    }
  }
  if (!failed && ratio && fmax && nmax) {
    double mr[20], mm[20];
    memcpy(mr, ratio, (size_t)cfg.reps * sizeof *mr);
    memcpy(mm, fmax, (size_t)cfg.reps * sizeof *mm);
    double lo = mm[0], hi = mm[0];
    for (int r = 0; r < cfg.reps; r++) {
      lo = mm[r] < lo ? mm[r] : lo;
      hi = mm[r] > hi ? mm[r] : hi;
    }
    printf("# slowest get while frozen: median %.3f ms (min %.3f, max %.3f over %d reps); "
           "median ratio to the normal run's p99: %.2fx; target: <= 10 ms\n",
           ecs_bench_median(mm, (size_t)cfg.reps), lo, hi, cfg.reps, ecs_bench_median(mr, (size_t)cfg.reps));
    /* On a loaded machine the slowest get of any phase is the scheduler's;
     * the normal phases' slowest gets show that floor. */
    printf("# slowest get with Redis running: median %.3f ms over the same reps\n",
           ecs_bench_median(nmax, (size_t)cfg.reps));
  }
  free(ratio);
  free(fmax);
  free(nmax);
out:
  ecs_client_close(c);
  free(buf);
  ecs_ts_signal(&redis, SIGCONT);
  ecs_ts_stop(&server, 5000);
  ecs_ts_stop(&redis, 5000);
  return failed;
bad:
  if (optarg)
    fprintf(stderr, "ecstore-bench frozen: bad value '%s'\n", optarg);
  fz_usage(stderr);
  return 2;
}
