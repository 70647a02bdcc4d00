/*
 * ecstore-bench net: put/get throughput and latency of ecstore over
 * loopback TCP, next to two baselines measured in the same run:
 *   - a raw TCP stream of the same bytes (a thread that answers "send me
 *     N bytes" with N bytes from memory: the physical limit of the path);
 *   - Redis SET/GET of the same blobs, pipelined per batch (hiredis), what
 *     users reach for today.
 * It starts its own redis-server and ecstore-server on free ports unless
 * --server/--redis name running ones.  Figures are medians over reps;
 * ratios are ecstore / baseline.
 */
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_work.h"
#include "ecstore/ecstore.h"
#include "store/core/net.h"
#include "support/ts.h"

#define MAX_LIST 16
#define MAX_CONNS ECS_BENCH_MAX_CONNS

typedef struct cfg {
  size_t sizes[MAX_LIST];
  int nsizes;
  int batches[MAX_LIST];
  int nbatches;
  int conns[MAX_LIST];
  int nconns;
  int reps;           /* timed repetitions per cell (median reported) */
  double seconds;     /* time per repetition */
  const char *server; /* existing server, or NULL to start one */
  const char *redis;  /* existing Redis, or NULL to start one */
  const char *csv;    /* CSV output file, or NULL */
  int no_redis;       /* skip the Redis baseline */
  int no_verify;      /* ecstore clients skip checksum verification */
  int do_tcp, do_shm; /* which path tables to run */
  int threads; /* --threads: the server's, and the raw baseline's slots (0: server default, raw unlimited) */
  int srv_pid; /* the server we started (its CPU time is read), or 0 */
  int mport;   /* its /metrics port (lock times are read), or 0 */
} cfg_t;

/* CPU and lock costs, for the per-request cost table and its model. */
typedef struct snap {
  double srv_cpu;   /* server process CPU seconds (user + system, all threads) */
  double self_cpu;  /* this process's (the clients, and the raw server's threads) */
  double lock_held; /* server lock held, seconds */
  double lock_wait; /* waited for, seconds */
  double lock_n;    /* acquisitions */
} snap_t;

static double proc_cpu(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the name may hold spaces; fields follow its ')' */
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec / 1e6;
}

/* The value of counter name in a /metrics scrape, or 0. */
static double metric(const char *body, const char *name) {
  size_t n = strlen(name);
  for (const char *p = body; (p = strstr(p, name)) != NULL; p += n)
    if ((p == body || p[-1] == '\n') && p[n] == ' ')
      return atof(p + n + 1);
  return 0;
}

static void scrape(int port, double *held, double *wait, double *acq) {
  *held = *wait = *acq = 0;
  int fd;
  if (port <= 0 || ecs_net_connect("127.0.0.1", port, 2000, &fd))
    return;
  static const char req[] = "GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n";
  char *body = malloc(1 << 20);
  size_t got = 0;
  if (body &&
      ecs_net_writev_all(fd, &(struct iovec){(void *)req, sizeof req - 1}, 1, ecs_now_ms() + 2000) == 0)
    for (uint64_t end = ecs_now_ms() + 2000; got < (1u << 20) - 1 && ecs_now_ms() < end;) {
      struct pollfd pf = {fd, POLLIN, 0};
      if (poll(&pf, 1, 200) <= 0)
        continue;
      ssize_t r = read(fd, body + got, (1u << 20) - 1 - got);
      if (r <= 0)
        break;
      got += (size_t)r;
    }
  close(fd);
  if (body) {
    body[got] = '\0';
    *held = metric(body, "ecstore_lock_held_microseconds_total") / 1e6;
    *wait = metric(body, "ecstore_lock_wait_microseconds_total") / 1e6;
    *acq = metric(body, "ecstore_lock_acquisitions_total");
  }
  free(body);
}

static void snap_take(const cfg_t *cfg, snap_t *sn) {
  sn->srv_cpu = cfg->srv_pid ? proc_cpu(cfg->srv_pid) : 0;
  sn->self_cpu = self_cpu();
  scrape(cfg->mport, &sn->lock_held, &sn->lock_wait, &sn->lock_n);
}

/* One get cell's costs per object (µs). */
typedef struct cost {
  size_t size;
  int batch, conns;
  double ecs_gbps, raw_gbps;               /* measured */
  double srv_us, cli_us, held_us, wait_us; /* ecstore: server CPU, client CPU, lock held, lock waited */
  double acq;                              /* lock acquisitions per object */
  double raw_us;                           /* raw baseline: CPU of both ends */
} cost_t;

#define MAX_COSTS 256
static cost_t g_costs[MAX_COSTS];
static int g_ncosts;

/* The cost table, and what the same requests would reach on `cores` cores:
 * objects/s = min(cores / CPU per object, 1 / lock hold per object), both
 * ends on the host (loopback), memory bandwidth not modelled. */
static void cost_tables(const cfg_t *cfg) {
  if (!g_ncosts)
    return;
  printf("\n# per-object costs of the get cells above (CPU: /proc of the server, getrusage of the clients;\n"
         "# lock: the server's /metrics), warm-up and setup included; raw: both ends of the raw stream\n");
  printf("%6s %5s %5s | %9s %9s %9s %9s %7s | %9s\n", "size", "batch", "conns", "srv us", "cli us", "lock us",
         "wait us", "acq", "raw us");
  for (int i = 0; i < g_ncosts; i++) {
    const cost_t *c = &g_costs[i];
    char sz[16];
    ecs_bench_size_label(sz, sizeof sz, c->size);
    printf("%6s %5d %5d | %9.1f %9.1f %9.2f %9.2f %7.1f | %9.1f\n", sz, c->batch, c->conns, c->srv_us,
           c->cli_us, c->held_us, c->wait_us, c->acq, c->raw_us);
  }
  static const int cores[] = {2, 16};
  for (int k = 0; k < 2; k++) {
    printf("\n# model: %d cores (GB/s = objects/s x size; ecs objects/s = min(cores/(srv+cli), 1/lock))%s\n",
           cores[k], cores[k] == 2 ? "; a check of the model against the measured figures" : "");
    printf("%6s %5s %5s | %9s %9s %7s | %9s %9s\n", "size", "batch", "conns", "ecs GB/s", "raw GB/s",
           "ecs/raw", "meas ecs", "meas raw");
    for (int i = 0; i < g_ncosts; i++) {
      const cost_t *c = &g_costs[i];
      double cpu = c->srv_us + c->cli_us;
      double ecs = cpu > 0 ? cores[k] * 1e6 / cpu : 0;
      if (c->held_us > 0 && 1e6 / c->held_us < ecs)
        ecs = 1e6 / c->held_us;
      double raw = c->raw_us > 0 ? cores[k] * 1e6 / c->raw_us : 0;
      char sz[16];
      ecs_bench_size_label(sz, sizeof sz, c->size);
      printf("%6s %5d %5d | %9.2f %9.2f %6.0f%% | %9.2f %9.2f\n", sz, c->batch, c->conns,
             ecs * (double)c->size / 1e9, raw * (double)c->size / 1e9, raw > 0 ? 100 * ecs / raw : 0,
             c->ecs_gbps, c->raw_gbps);
    }
  }
  (void)cfg;
}

typedef ecs_bench_result_t result_t;

/* Where the measured peers are. */
typedef ecs_bench_env_t bench_env_t;

/* Median of reps cells (bench_work.c); latencies over every timed call. */
static int measure(const cfg_t *cfg, ecs_bench_mode_t mode, const char *transport, size_t size, int batch,
                   int nconn, const bench_env_t *e, result_t *out) {
  ecs_bench_job_t job = {.mode = mode, .transport = transport, .size = size, .batch = batch, .conns = nconn};
  return ecs_bench_measure(e, &job, cfg->reps, cfg->seconds, out);
}

static void size_label(char *out, size_t cap, size_t size) {
  ecs_bench_size_label(out, cap, size);
}

static void csv_row(FILE *csv, const char *op, size_t size, int b, int nc, const char *path,
                    const result_t *r) {
  if (csv)
    fprintf(csv, "%s,%zu,%d,%d,%s,%.4f,%.4f,%.1f,%.1f\n", op, size, b, nc, path, r->gbps, r->mops, r->p50_us,
            r->p99_us);
}

/* ecstore over TCP next to a raw TCP stream and Redis. */
static int tcp_table(const cfg_t *cfg, const bench_env_t *e, FILE *csv) {
  printf("# ecstore over loopback TCP vs a raw TCP stream and Redis (pipelined), same run;\n"
         "# GB/s = 1e9 payload bytes/s, median of %d x %.2fs; latency per batch call; checksums %s\n",
         cfg->reps, cfg->seconds, cfg->no_verify ? "off" : "verified");
  /* ecstore's connections within the host, and the raw stream's, use reno
   * (store/core/net.h); Redis's sockets keep the system's, said here */
  char sys_cc[32] = "?";
  FILE *ccf = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
  if (ccf) {
    if (fscanf(ccf, "%31s", sys_cc) != 1)
      snprintf(sys_cc, sizeof sys_cc, "?");
    fclose(ccf);
  }
  printf(
      "# congestion control: reno for ecstore and the raw stream (loopback), the system's (%s) for Redis\n",
      sys_cc);
  printf("%-4s %6s %5s %5s | %8s %9s %9s | %8s %7s | %8s %7s\n", "op", "size", "batch", "conns", "ecs GB/s",
         "p50 us", "p99 us", "raw GB/s", "ecs/raw", "rds GB/s", "ecs/rds");
  for (int op = 0; op < 2; op++) {
    for (int i = 0; i < cfg->nsizes; i++) {
      for (int j = 0; j < cfg->nbatches; j++) {
        for (int k = 0; k < cfg->nconns; k++) {
          size_t size = cfg->sizes[i];
          int b = cfg->batches[j], nc = cfg->conns[k];
          result_t ecs, raw = {0}, red = {0};
          snap_t s0, s1, s2;
          snap_take(cfg, &s0);
          if (measure(cfg, op == 0 ? ECS_BM_ECS_GET : ECS_BM_ECS_PUT, "tcp", size, b, nc, e, &ecs))
            return 1;
          snap_take(cfg, &s1);
          if (op == 0)
            measure(cfg, ECS_BM_RAW_GET, NULL, size, b, nc, e, &raw);
          snap_take(cfg, &s2);
          if (op == 0 && cfg->srv_pid && g_ncosts < MAX_COSTS && ecs.objects_all && raw.objects_all) {
            double no = (double)ecs.objects_all, nr = (double)raw.objects_all;
            g_costs[g_ncosts++] = (cost_t){.size = size,
                                           .batch = b,
                                           .conns = nc,
                                           .ecs_gbps = ecs.gbps,
                                           .raw_gbps = raw.gbps,
                                           .srv_us = (s1.srv_cpu - s0.srv_cpu) / no * 1e6,
                                           .cli_us = (s1.self_cpu - s0.self_cpu) / no * 1e6,
                                           .held_us = (s1.lock_held - s0.lock_held) / no * 1e6,
                                           .wait_us = (s1.lock_wait - s0.lock_wait) / no * 1e6,
                                           .acq = (s1.lock_n - s0.lock_n) / no,
                                           .raw_us = (s2.self_cpu - s1.self_cpu) / nr * 1e6};
          }
          if (!cfg->no_redis)
            measure(cfg, op == 0 ? ECS_BM_REDIS_GET : ECS_BM_REDIS_SET, NULL, size, b, nc, e, &red);
          char sz[16];
          size_label(sz, sizeof sz, size);
          printf("%-4s %6s %5d %5d | %8.2f %9.0f %9.0f | ", op == 0 ? "get" : "put", sz, b, nc, ecs.gbps,
                 ecs.p50_us, ecs.p99_us);
          if (op == 0)
            printf("%8.2f %6.0f%% | ", raw.gbps, raw.gbps > 0 ? 100 * ecs.gbps / raw.gbps : 0);
          else
            printf("%8s %7s | ", "-", "-");
          if (!cfg->no_redis)
            printf("%8.2f %6.2fx\n", red.gbps, red.gbps > 0 ? ecs.gbps / red.gbps : 0);
          else
            printf("%8s %7s\n", "-", "-");
          fflush(stdout);
          const char *opn = op ? "put" : "get";
          csv_row(csv, opn, size, b, nc, "ecstore-tcp", &ecs);
          if (op == 0)
            csv_row(csv, opn, size, b, nc, "raw-tcp", &raw);
          if (!cfg->no_redis)
            csv_row(csv, opn, size, b, nc, "redis", &red);
        }
      }
    }
  }
  cost_tables(cfg);
  return 0;
}

/* ecstore over shared memory (copy into the caller's buffer, views, puts
 * in place) next to memcpy of the same bytes. */
static int shm_table(const cfg_t *cfg, const bench_env_t *e, FILE *csv) {
  printf("\n# ecstore over shared memory (same host) vs memcpy of the same bytes, same run;\n"
         "# copy: get into a caller buffer; view: zero-copy pin + release (objects/s); checksums %s;\n"
         "# put/rds: the shm put over Redis pipelined SET of the same blobs, measured in the same cell\n",
         cfg->no_verify ? "off" : "verified");
  printf("%6s %5s %5s | %8s %8s %8s | %8s %8s | %8s %7s | %8s %8s %8s\n", "size", "batch", "conns",
         "copyGB/s", "p50 us", "p99 us", "memcpy", "cp/mcpy", "view Mo/s", "p50 us", "put GB/s", "put/mcpy",
         "put/rds");
  for (int i = 0; i < cfg->nsizes; i++) {
    for (int j = 0; j < cfg->nbatches; j++) {
      for (int k = 0; k < cfg->nconns; k++) {
        size_t size = cfg->sizes[i];
        int b = cfg->batches[j], nc = cfg->conns[k];
        result_t cp, view, put, mc, red = {0};
        if (measure(cfg, ECS_BM_ECS_GET, "shm", size, b, nc, e, &cp) ||
            measure(cfg, ECS_BM_ECS_VIEW, "shm", size, b, nc, e, &view) ||
            measure(cfg, ECS_BM_ECS_PUT, "shm", size, b, nc, e, &put) ||
            measure(cfg, ECS_BM_MEMCPY, NULL, size, b, nc, e, &mc))
          return 1;
        if (!cfg->no_redis)
          measure(cfg, ECS_BM_REDIS_SET, NULL, size, b, nc, e, &red);
        char sz[16], vs[16] = "-";
        size_label(sz, sizeof sz, size);
        if (red.gbps > 0)
          snprintf(vs, sizeof vs, "%.2fx", put.gbps / red.gbps);
        printf("%6s %5d %5d | %8.2f %8.0f %8.0f | %8.2f %7.0f%% | %9.3f %7.0f | %8.2f %7.0f%% %8s\n", sz, b,
               nc, cp.gbps, cp.p50_us, cp.p99_us, mc.gbps, mc.gbps > 0 ? 100 * cp.gbps / mc.gbps : 0,
               view.mops, view.p50_us, put.gbps, mc.gbps > 0 ? 100 * put.gbps / mc.gbps : 0, vs);
        fflush(stdout);
        csv_row(csv, "get", size, b, nc, "ecstore-shm-copy", &cp);
        csv_row(csv, "get", size, b, nc, "ecstore-shm-view", &view);
        csv_row(csv, "put", size, b, nc, "ecstore-shm", &put);
        csv_row(csv, "get", size, b, nc, "memcpy", &mc);
      }
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* command line                                                         */

static void net_usage(FILE *f) {
  fprintf(f,
          "usage: ecstore-bench net [options]\n"
          "  --sizes LIST     object sizes (default 64K,1M,4M,16M)\n"
          "  --batches LIST   objects per call (default 1,8,32)\n"
          "  --conns LIST     client connections (default 1,4)\n"
          "  --reps N         timed repetitions per cell, median reported (default 5)\n"
          "  --seconds S      time per repetition (default 0.5)\n"
          "  --server H:P     use a running ecstore-server (namespace 'test')\n"
          "  --redis H:P      use a running Redis for the baseline\n"
          "  --no-redis       skip the Redis baseline\n"
          "  --paths LIST     tcp,shm (default both): which tables to run\n"
          "  --no-verify      ecstore clients skip checksum verification\n"
          "  --threads N      the server's --threads, and the raw baseline limited to N syscalls at once;\n"
          "                   adds per-object CPU and lock costs and a 2- and 16-core model (get cells)\n"
          "  --csv FILE       also write the table as CSV\n"
          "  --quick          a small, fast run (CI checks the harness with it)\n");
}

int ecs_bench_net(int argc, char **argv) {
  cfg_t cfg = {.sizes = {64 << 10, 1 << 20, 4 << 20, 16 << 20},
               .nsizes = 4,
               .batches = {1, 8, 32},
               .nbatches = 3,
               .conns = {1, 4},
               .nconns = 2,
               .reps = 5,
               .seconds = 0.5,
               .do_tcp = 1,
               .do_shm = 1};
  static const struct option opts[] = {{"sizes", required_argument, 0, 's'},
                                       {"batches", required_argument, 0, 'b'},
                                       {"conns", required_argument, 0, 'c'},
                                       {"reps", required_argument, 0, 'r'},
                                       {"seconds", required_argument, 0, 't'},
                                       {"server", required_argument, 0, 'S'},
                                       {"redis", required_argument, 0, 'R'},
                                       {"no-redis", no_argument, 0, 'N'},
                                       {"csv", required_argument, 0, 'o'},
                                       {"quick", no_argument, 0, 'q'},
                                       {"paths", required_argument, 0, 'P'},
                                       {"no-verify", no_argument, 0, 'V'},
                                       {"threads", required_argument, 0, 'T'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 's':
      if (ecs_bench_parse_size_list(optarg, cfg.sizes, &cfg.nsizes, MAX_LIST))
        goto bad;
      break;
    case 'b':
      if (ecs_bench_parse_int_list(optarg, cfg.batches, &cfg.nbatches, MAX_LIST, 1024))
        goto bad;
      break;
    case 'c':
      if (ecs_bench_parse_int_list(optarg, cfg.conns, &cfg.nconns, MAX_LIST, MAX_CONNS))
        goto bad;
      break;
    case 'r':
      cfg.reps = atoi(optarg);
      if (cfg.reps < 1 || cfg.reps > 32)
        goto bad;
      break;
    case 't':
      cfg.seconds = atof(optarg);
      if (cfg.seconds <= 0 || cfg.seconds > 60)
        goto bad;
      break;
    case 'T':
      cfg.threads = atoi(optarg);
      if (cfg.threads < 1 || cfg.threads > 256)
        goto bad;
      break;
    case 'S': cfg.server = optarg; break;
    case 'R': cfg.redis = optarg; break;
    case 'N': cfg.no_redis = 1; break;
    case 'V': cfg.no_verify = 1; break;
    case 'P':
      cfg.do_tcp = strstr(optarg, "tcp") != NULL;
      cfg.do_shm = strstr(optarg, "shm") != NULL;
      if (!cfg.do_tcp && !cfg.do_shm)
        goto bad;
      break;
    case 'o': cfg.csv = optarg; break;
    case 'q':
      cfg.sizes[0] = 64 << 10;
      cfg.sizes[1] = 1 << 20;
      cfg.nsizes = 2;
      cfg.batches[0] = 1;
      cfg.batches[1] = 8;
      cfg.nbatches = 2;
      cfg.conns[0] = 1;
      cfg.nconns = 1;
      cfg.reps = 3;
      cfg.seconds = 0.1;
      break;
    case 'h': net_usage(stdout); return 0;
    default: goto bad;
    }
  }
  if (optind != argc)
    goto bad;

  signal(SIGPIPE, SIG_IGN);
  /* servers: ours unless named */
  ecs_ts_proc_t redis, server;
  memset(&redis, 0, sizeof redis);
  memset(&server, 0, sizeof server);
  char servers[160], rhost[128] = "127.0.0.1";
  int rport = 0;
  ecs_bench_find_bins();
  if (cfg.redis) {
    if (ecs_net_parse_hostport(cfg.redis, rhost, sizeof rhost, &rport)) {
      fprintf(stderr, "ecstore-bench net: bad --redis '%s'\n", cfg.redis);
      return 2;
    }
  } else {
    if (ecs_ts_redis_start(&redis)) {
      fprintf(stderr, "ecstore-bench net: cannot start redis-server (scripts/install-deps.sh installs it)\n");
      return 1;
    }
    rport = redis.port;
  }
  if (cfg.server) {
    snprintf(servers, sizeof servers, "%s", cfg.server);
  } else {
    size_t maxb = 0;
    for (int i = 0; i < cfg.nsizes; i++)
      for (int j = 0; j < cfg.nbatches; j++)
        for (int k = 0; k < cfg.nconns; k++) {
          size_t need = cfg.sizes[i] * (size_t)cfg.batches[j] * (size_t)cfg.conns[k];
          maxb = need > maxb ? need : maxb;
        }
    /* room for the get working set twice over, at least 1 GiB */
    size_t pool = maxb * 2 + (64u << 20);
    pool = pool < (1u << 30) ? (1u << 30) : pool;
    char psz[32];
    snprintf(psz, sizeof psz, "%zuM", pool >> 20);
    char thr[16], mlisten[48];
    snprintf(thr, sizeof thr, "%d", cfg.threads);
    const char *extra[] = {"--pool-size", psz, "--log-level", "warn", NULL, NULL, NULL, NULL, NULL};
    if (cfg.threads) { /* the cost table reads the server's lock times from /metrics */
      int mp = ecs_ts_free_port();
      snprintf(mlisten, sizeof mlisten, "127.0.0.1:%d", mp);
      extra[4] = "--threads";
      extra[5] = thr;
      extra[6] = "--metrics-listen";
      extra[7] = mlisten;
      cfg.mport = mp;
    }
    if (ecs_ts_server_start(&server, rport, extra)) {
      fprintf(stderr, "ecstore-bench net: cannot start ecstore-server\n");
      ecs_ts_stop(&redis, 3000);
      return 1;
    }
    snprintf(servers, sizeof servers, "127.0.0.1:%d", server.port);
    if (cfg.threads)
      cfg.srv_pid = (int)server.pid;
  }
  ecs_bench_raw_t rs;
  if (ecs_bench_raw_start_threads(&rs, cfg.threads)) {
    fprintf(stderr, "ecstore-bench net: cannot listen for the raw baseline\n");
    return 1;
  }
  FILE *csv = cfg.csv ? fopen(cfg.csv, "w") : NULL;
  if (cfg.csv && !csv) {
    fprintf(stderr, "ecstore-bench net: cannot write %s\n", cfg.csv);
    return 1;
  }
  if (csv)
    fprintf(csv, "op,size,batch,conns,path,gbps,mops,p50_us,p99_us\n");
  ecs_bench_print_machine();
  bench_env_t env = {
      .servers = servers, .rhost = rhost, .rport = rport, .raw_port = rs.port, .verify = !cfg.no_verify};
  int failed = 0;
  if (cfg.do_tcp)
    failed = tcp_table(&cfg, &env, csv);
  if (cfg.do_shm && !failed)
    failed = shm_table(&cfg, &env, csv);
  if (csv)
    fclose(csv);
  ecs_bench_raw_stop(&rs);
  if (server.pid)
    ecs_ts_stop(&server, 5000);
  if (redis.pid)
    ecs_ts_stop(&redis, 5000);
  if (failed) {
    fprintf(stderr, "ecstore-bench net: a measurement failed\n");
    return 1;
  }
  return 0;
bad:
  if (optarg)
    fprintf(stderr, "ecstore-bench net: bad value '%s'\n", optarg);
  net_usage(stderr);
  return 2;
}
