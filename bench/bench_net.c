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
#include <errno.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "ecstore/ecstore.h"
#include "store/net.h"
#include "support/ts.h"

#define MAX_LIST 16
#define MAX_CONNS 16

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
} cfg_t;

/* What one measured cell produced. */
typedef struct result {
  double gbps;           /* payload GB/s (1e9 bytes) */
  double mops;           /* objects per second, millions */
  double p50_us, p99_us; /* per-call latency */
} result_t;

/* ------------------------------------------------------------------ */
/* the raw-socket baseline                                             */

typedef struct raw_srv {
  int lfd;
  int port;
  uint8_t *buf;
  size_t cap;
  volatile int stop;
} raw_srv_t;

/* One client: read u64 n (n == 0: bye), reply with n bytes. */
static void *raw_conn(void *p) {
  intptr_t *args = p;
  int fd = (int)args[0];
  raw_srv_t *rs = (raw_srv_t *)args[1];
  free(args);
  for (;;) {
    uint64_t n;
    if (ecs_net_read_all(fd, &n, 8, ecs_now_ms() + 60000) || n == 0)
      break;
    int bad = 0;
    while (n > 0 && !bad) {
      size_t k = n > rs->cap ? rs->cap : (size_t)n;
      struct iovec iov = {rs->buf, k};
      bad = ecs_net_writev_all(fd, &iov, 1, ecs_now_ms() + 60000) != 0;
      n -= k;
    }
    if (bad)
      break;
  }
  close(fd);
  return NULL;
}

static void *raw_accept(void *p) {
  raw_srv_t *rs = p;
  while (!rs->stop) {
    int fd = accept(rs->lfd, NULL, NULL);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        usleep(1000);
        continue;
      }
      break;
    }
    ecs_net_set_nonblock(fd);
    intptr_t *args = malloc(2 * sizeof *args);
    args[0] = fd;
    args[1] = (intptr_t)rs;
    pthread_t th;
    pthread_create(&th, NULL, raw_conn, args);
    pthread_detach(th);
  }
  return NULL;
}

/* ------------------------------------------------------------------ */
/* workers                                                              */

typedef enum mode {
  M_ECS_GET,
  M_ECS_PUT,
  M_RAW_GET,
  M_REDIS_GET,
  M_REDIS_SET,
  M_SHM_GET,
  M_SHM_PUT,
  M_SHM_VIEW,
  M_MEMCPY
} mode_t_;

typedef struct worker {
  mode_t_ mode;
  int id; /* connection index */
  size_t size;
  int batch;
  double seconds;
  const char *servers;
  const char *redis_host;
  int redis_port;
  int raw_port;
  int verify; /* ecstore: verify checksums */
  /* out */
  uint64_t bytes;
  uint64_t objects;
  double *lat_us;
  size_t nlat, lat_cap;
  int err;
} worker_t;

static void lat_push(worker_t *w, double us) {
  if (w->nlat == w->lat_cap) {
    w->lat_cap = w->lat_cap ? w->lat_cap * 2 : 1024;
    w->lat_us = realloc(w->lat_us, w->lat_cap * sizeof *w->lat_us);
  }
  w->lat_us[w->nlat++] = us;
}

static void key_of(char *out, size_t cap, int conn, int i, size_t size) {
  snprintf(out, cap, "bench-%zu-%d-%d", size, conn, i);
}

static ecs_client_t *bench_client(const char *servers, const char *transport, int verify) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = servers;
  cfg.transport = transport;
  cfg.verify_checksum = verify;
  cfg.ns = "test";
  cfg.timeout_ms = 60000;
  ecs_client_t *c = NULL;
  char err[256];
  if (ecs_client_connect(&cfg, &c, err, sizeof err) != ECS_OK)
    fprintf(stderr, "ecstore-bench: connect: %s\n", err);
  return c;
}

/* ecstore: the batch's objects are put once, then read (or re-put under new
 * keys) in a loop for the time given. */
static void run_ecs(worker_t *w) {
  int shm = w->mode == M_SHM_GET || w->mode == M_SHM_PUT || w->mode == M_SHM_VIEW;
  int get = w->mode == M_ECS_GET || w->mode == M_SHM_GET || w->mode == M_SHM_VIEW;
  ecs_client_t *c = bench_client(w->servers, shm ? "shm" : "tcp", w->verify);
  if (!c) {
    w->err = 1;
    return;
  }
  int b = w->batch;
  ecs_key_t *keys = calloc((size_t)b, sizeof *keys);
  char(*names)[64] = calloc((size_t)b, 64);
  ecs_tensor_t *ts = calloc((size_t)b, sizeof *ts);
  ecs_get_buf_t *bufs = calloc((size_t)b, sizeof *bufs);
  int *st = calloc((size_t)b, sizeof *st);
  uint8_t *src = malloc(w->size);
  uint8_t **dst = calloc((size_t)b, sizeof *dst);
  memset(src, 0x3c, w->size);
  for (int i = 0; i < b; i++) {
    key_of(names[i], 64, w->id, i, w->size);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    ts[i].data = src;
    ts[i].nbytes = w->size;
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = w->size;
    dst[i] = malloc(w->size);
    memset(dst[i], 0, w->size); /* fault the pages in before timing */
  }
  ecs_view_t *views = calloc((size_t)b, sizeof *views);
  if (get && ecs_put_batch(c, keys, ts, (size_t)b, st) != ECS_OK)
    w->err = 1;
  uint64_t end = ecs_bench_now_ns() + (uint64_t)(w->seconds * 1e9);
  uint64_t round = 0;
  while (!w->err && ecs_bench_now_ns() < end) {
    uint64_t t0 = ecs_bench_now_ns();
    int rc;
    if (w->mode == M_SHM_VIEW) {
      rc = ecs_get_view_batch(c, keys, views, (size_t)b);
      for (int i = 0; !rc && i < b; i++)
        if (views[i].status)
          rc = views[i].status;
      ecs_view_release(c, views, (size_t)b);
    } else if (get) {
      for (int i = 0; i < b; i++) {
        bufs[i].data = dst[i];
        bufs[i].capacity = w->size;
      }
      rc = ecs_get_batch(c, keys, bufs, (size_t)b);
      for (int i = 0; !rc && i < b; i++)
        if (bufs[i].status)
          rc = bufs[i].status;
    } else {
      /* fresh keys each round (objects are immutable); the pool evicts the old */
      for (int i = 0; i < b; i++) {
        snprintf(names[i], 64, "bench-put-%zu-%d-%llu-%d", w->size, w->id, (unsigned long long)round, i);
        keys[i].len = strlen(names[i]);
      }
      rc = ecs_put_batch(c, keys, ts, (size_t)b, st);
      for (int i = 0; !rc && i < b; i++)
        if (st[i])
          rc = st[i];
      round++;
    }
    if (rc) {
      fprintf(stderr, "ecstore-bench: %s failed: %s\n", w->mode == M_ECS_GET ? "get" : "put",
              ecs_strerror(rc));
      w->err = 1;
      break;
    }
    lat_push(w, (double)(ecs_bench_now_ns() - t0) / 1e3);
    w->bytes += (uint64_t)b * w->size;
    w->objects += (uint64_t)b;
  }
  if (get)
    ecs_remove_batch(c, keys, (size_t)b, st);
  free(views);
  for (int i = 0; i < b; i++)
    free(dst[i]);
  free(dst);
  free(src);
  free(st);
  free(bufs);
  free(ts);
  free(names);
  free(keys);
  ecs_client_close(c);
}

/* Raw socket: ask for batch * size bytes, read them into per-object buffers. */
static void run_raw(worker_t *w) {
  int fd;
  if (ecs_net_connect("127.0.0.1", w->raw_port, 2000, &fd)) {
    w->err = 1;
    return;
  }
  int b = w->batch;
  struct iovec *iov = calloc((size_t)b, sizeof *iov), *tmp = calloc((size_t)b, sizeof *tmp);
  for (int i = 0; i < b; i++) {
    iov[i].iov_base = malloc(w->size);
    memset(iov[i].iov_base, 0, w->size);
    iov[i].iov_len = w->size;
  }
  uint64_t end = ecs_bench_now_ns() + (uint64_t)(w->seconds * 1e9);
  while (ecs_bench_now_ns() < end) {
    uint64_t t0 = ecs_bench_now_ns();
    uint64_t n = (uint64_t)b * w->size;
    struct iovec req = {&n, 8};
    memcpy(tmp, iov, (size_t)b * sizeof *iov);
    if (ecs_net_writev_all(fd, &req, 1, ecs_now_ms() + 60000) ||
        ecs_net_readv_all(fd, tmp, b, ecs_now_ms() + 60000)) {
      w->err = 1;
      break;
    }
    lat_push(w, (double)(ecs_bench_now_ns() - t0) / 1e3);
    w->bytes += n;
  }
  uint64_t zero = 0;
  struct iovec bye = {&zero, 8};
  ecs_net_writev_all(fd, &bye, 1, ecs_now_ms() + 1000);
  close(fd);
  for (int i = 0; i < b; i++)
    free(iov[i].iov_base);
  free(iov);
  free(tmp);
}

/* Redis: the batch as one pipeline of GETs (or SETs) per round. */
static void run_redis(worker_t *w) {
  struct timeval tv = {60, 0};
  redisContext *r = redisConnectWithTimeout(w->redis_host, w->redis_port, tv);
  if (!r || r->err) {
    w->err = 1;
    if (r)
      redisFree(r);
    return;
  }
  int b = w->batch;
  char *val = malloc(w->size);
  memset(val, 0x3c, w->size);
  uint8_t *dst = malloc(w->size);
  char key[96];
  for (int i = 0; i < b; i++) {
    key_of(key, sizeof key, w->id, i, w->size);
    redisReply *rep = redisCommand(r, "SET %s %b", key, val, w->size);
    if (!rep)
      w->err = 1;
    freeReplyObject(rep);
  }
  uint64_t end = ecs_bench_now_ns() + (uint64_t)(w->seconds * 1e9);
  while (!w->err && ecs_bench_now_ns() < end) {
    uint64_t t0 = ecs_bench_now_ns();
    for (int i = 0; i < b; i++) {
      key_of(key, sizeof key, w->id, i, w->size);
      if (w->mode == M_REDIS_GET)
        redisAppendCommand(r, "GET %s", key);
      else
        redisAppendCommand(r, "SET %s %b", key, val, w->size);
    }
    for (int i = 0; i < b; i++) {
      redisReply *rep = NULL;
      if (redisGetReply(r, (void **)&rep) != REDIS_OK || !rep) {
        w->err = 1;
        break;
      }
      /* a client hands the bytes to its caller: copy out, as a get into a
       * caller buffer must */
      if (w->mode == M_REDIS_GET && rep->type == REDIS_REPLY_STRING && (size_t)rep->len == w->size)
        memcpy(dst, rep->str, w->size);
      freeReplyObject(rep);
    }
    lat_push(w, (double)(ecs_bench_now_ns() - t0) / 1e3);
    w->bytes += (uint64_t)b * w->size;
  }
  for (int i = 0; i < b; i++) {
    key_of(key, sizeof key, w->id, i, w->size);
    freeReplyObject(redisCommand(r, "DEL %s", key));
  }
  free(val);
  free(dst);
  redisFree(r);
}

/* The physical baseline of the shm path: the same bytes copied between
 * buffers of the same sizes, batch by batch. */
static void run_memcpy(worker_t *w) {
  int b = w->batch;
  uint8_t **src = calloc((size_t)b, sizeof *src), **dst = calloc((size_t)b, sizeof *dst);
  for (int i = 0; i < b; i++) {
    src[i] = malloc(w->size);
    dst[i] = malloc(w->size);
    memset(src[i], 0x3c, w->size);
    memset(dst[i], 0, w->size);
  }
  uint64_t end = ecs_bench_now_ns() + (uint64_t)(w->seconds * 1e9);
  while (ecs_bench_now_ns() < end) {
    uint64_t t0 = ecs_bench_now_ns();
    for (int i = 0; i < b; i++)
      memcpy(dst[i], src[i], w->size);
    __asm__ __volatile__("" ::: "memory"); /* keep the copies */
    lat_push(w, (double)(ecs_bench_now_ns() - t0) / 1e3);
    w->bytes += (uint64_t)b * w->size;
    w->objects += (uint64_t)b;
  }
  for (int i = 0; i < b; i++) {
    free(src[i]);
    free(dst[i]);
  }
  free(src);
  free(dst);
}

static void *worker_main(void *p) {
  worker_t *w = p;
  switch (w->mode) {
  case M_ECS_GET:
  case M_ECS_PUT:
  case M_SHM_GET:
  case M_SHM_PUT:
  case M_SHM_VIEW: run_ecs(w); break;
  case M_MEMCPY: run_memcpy(w); break;
  case M_RAW_GET: run_raw(w); break;
  case M_REDIS_GET:
  case M_REDIS_SET: run_redis(w); break;
  }
  return NULL;
}

/* Runs nconn workers at once; aggregates throughput and latencies. */
static int run_cell(const cfg_t *cfg, mode_t_ mode, size_t size, int batch, int nconn, double seconds,
                    const char *servers, const char *rhost, int rport, int raw_port, result_t *out) {
  worker_t ws[MAX_CONNS];
  pthread_t th[MAX_CONNS];
  memset(ws, 0, sizeof ws);
  for (int i = 0; i < nconn; i++) {
    ws[i] = (worker_t){.mode = mode,
                       .id = i,
                       .size = size,
                       .batch = batch,
                       .seconds = seconds,
                       .servers = servers,
                       .redis_host = rhost,
                       .redis_port = rport,
                       .raw_port = raw_port,
                       .verify = !cfg->no_verify};
    pthread_create(&th[i], NULL, worker_main, &ws[i]);
  }
  uint64_t t0 = ecs_bench_now_ns();
  uint64_t bytes = 0, objects = 0;
  size_t nlat = 0;
  int err = 0;
  for (int i = 0; i < nconn; i++) {
    pthread_join(th[i], NULL);
    bytes += ws[i].bytes;
    objects += ws[i].objects;
    nlat += ws[i].nlat;
    err |= ws[i].err;
  }
  double el = (double)(ecs_bench_now_ns() - t0) / 1e9;
  double *all = malloc((nlat ? nlat : 1) * sizeof *all);
  size_t k = 0;
  for (int i = 0; i < nconn; i++) {
    memcpy(all + k, ws[i].lat_us, ws[i].nlat * sizeof *all);
    k += ws[i].nlat;
    free(ws[i].lat_us);
  }
  out->gbps = el > 0 ? (double)bytes / el / 1e9 : 0;
  out->mops = el > 0 ? (double)objects / el / 1e6 : 0;
  out->p50_us = ecs_bench_percentile(all, nlat, 50);
  out->p99_us = ecs_bench_percentile(all, nlat, 99);
  free(all);
  return err ? -1 : 0;
}

/* Median of reps runs (by throughput; latencies of the median run). */
static int measure(const cfg_t *cfg, mode_t_ mode, size_t size, int batch, int nconn, const char *servers,
                   const char *rhost, int rport, int raw_port, result_t *out) {
  result_t rs[32];
  int reps = cfg->reps > 32 ? 32 : cfg->reps;
  result_t warm;
  if (run_cell(cfg, mode, size, batch, nconn, cfg->seconds / 4, servers, rhost, rport, raw_port, &warm))
    return -1;
  for (int i = 0; i < reps; i++)
    if (run_cell(cfg, mode, size, batch, nconn, cfg->seconds, servers, rhost, rport, raw_port, &rs[i]))
      return -1;
  /* sort by throughput, take the middle one */
  for (int i = 1; i < reps; i++)
    for (int j = i; j > 0 && rs[j].gbps < rs[j - 1].gbps; j--) {
      result_t t = rs[j];
      rs[j] = rs[j - 1];
      rs[j - 1] = t;
    }
  *out = rs[reps / 2];
  return 0;
}

/* Where the measured peers are. */
typedef struct bench_env {
  const char *servers;
  const char *rhost;
  int rport;
  int raw_port;
} bench_env_t;

static void size_label(char *out, size_t cap, size_t size) {
  if (size >= (1u << 20))
    snprintf(out, cap, "%zuM", size >> 20);
  else
    snprintf(out, cap, "%zuK", size >> 10);
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
  printf("%-4s %6s %5s %5s | %8s %9s %9s | %8s %7s | %8s %7s\n", "op", "size", "batch", "conns", "ecs GB/s",
         "p50 us", "p99 us", "raw GB/s", "ecs/raw", "rds GB/s", "ecs/rds");
  for (int op = 0; op < 2; op++) {
    for (int i = 0; i < cfg->nsizes; i++) {
      for (int j = 0; j < cfg->nbatches; j++) {
        for (int k = 0; k < cfg->nconns; k++) {
          size_t size = cfg->sizes[i];
          int b = cfg->batches[j], nc = cfg->conns[k];
          result_t ecs, raw = {0}, red = {0};
          if (measure(cfg, op == 0 ? M_ECS_GET : M_ECS_PUT, size, b, nc, e->servers, e->rhost, e->rport,
                      e->raw_port, &ecs))
            return 1;
          if (op == 0)
            measure(cfg, M_RAW_GET, size, b, nc, e->servers, e->rhost, e->rport, e->raw_port, &raw);
          if (!cfg->no_redis)
            measure(cfg, op == 0 ? M_REDIS_GET : M_REDIS_SET, size, b, nc, e->servers, e->rhost, e->rport,
                    e->raw_port, &red);
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
  return 0;
}

/* ecstore over shared memory (copy into the caller's buffer, views, puts
 * in place) next to memcpy of the same bytes. */
static int shm_table(const cfg_t *cfg, const bench_env_t *e, FILE *csv) {
  printf("\n# ecstore over shared memory (same host) vs memcpy of the same bytes, same run;\n"
         "# copy: get into a caller buffer; view: zero-copy pin + release (objects/s); checksums %s\n",
         cfg->no_verify ? "off" : "verified");
  printf("%6s %5s %5s | %8s %8s %8s | %8s %8s | %8s %7s | %8s %8s\n", "size", "batch", "conns", "copyGB/s",
         "p50 us", "p99 us", "memcpy", "cp/mcpy", "view Mo/s", "p50 us", "put GB/s", "put/mcpy");
  for (int i = 0; i < cfg->nsizes; i++) {
    for (int j = 0; j < cfg->nbatches; j++) {
      for (int k = 0; k < cfg->nconns; k++) {
        size_t size = cfg->sizes[i];
        int b = cfg->batches[j], nc = cfg->conns[k];
        result_t cp, view, put, mc;
        if (measure(cfg, M_SHM_GET, size, b, nc, e->servers, e->rhost, e->rport, e->raw_port, &cp) ||
            measure(cfg, M_SHM_VIEW, size, b, nc, e->servers, e->rhost, e->rport, e->raw_port, &view) ||
            measure(cfg, M_SHM_PUT, size, b, nc, e->servers, e->rhost, e->rport, e->raw_port, &put) ||
            measure(cfg, M_MEMCPY, size, b, nc, e->servers, e->rhost, e->rport, e->raw_port, &mc))
          return 1;
        char sz[16];
        size_label(sz, sizeof sz, size);
        printf("%6s %5d %5d | %8.2f %8.0f %8.0f | %8.2f %7.0f%% | %9.3f %7.0f | %8.2f %7.0f%%\n", sz, b, nc,
               cp.gbps, cp.p50_us, cp.p99_us, mc.gbps, mc.gbps > 0 ? 100 * cp.gbps / mc.gbps : 0, view.mops,
               view.p50_us, put.gbps, mc.gbps > 0 ? 100 * put.gbps / mc.gbps : 0);
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

static int parse_list_sizes(const char *s, size_t *out, int *n) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  char *save;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*n == MAX_LIST || ecs_bench_parse_size(t, &out[*n]) || out[*n] == 0)
      return -1;
    (*n)++;
  }
  return *n ? 0 : -1;
}

static int parse_list_ints(const char *s, int *out, int *n, int max) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  char *save;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int v = atoi(t);
    if (*n == MAX_LIST || v < 1 || v > max)
      return -1;
    out[(*n)++] = v;
  }
  return *n ? 0 : -1;
}

static void net_usage(FILE *f) {
  fprintf(f, "usage: ecstore-bench net [options]\n"
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
  static const struct option opts[] = {
      {"sizes", required_argument, 0, 's'},   {"batches", required_argument, 0, 'b'},
      {"conns", required_argument, 0, 'c'},   {"reps", required_argument, 0, 'r'},
      {"seconds", required_argument, 0, 't'}, {"server", required_argument, 0, 'S'},
      {"redis", required_argument, 0, 'R'},   {"no-redis", no_argument, 0, 'N'},
      {"csv", required_argument, 0, 'o'},     {"quick", no_argument, 0, 'q'},
      {"paths", required_argument, 0, 'P'},   {"no-verify", no_argument, 0, 'V'},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 's':
      if (parse_list_sizes(optarg, cfg.sizes, &cfg.nsizes))
        goto bad;
      break;
    case 'b':
      if (parse_list_ints(optarg, cfg.batches, &cfg.nbatches, 1024))
        goto bad;
      break;
    case 'c':
      if (parse_list_ints(optarg, cfg.conns, &cfg.nconns, MAX_CONNS))
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
  if (!getenv("ECS_BIN_DIR")) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = '\0';
      char *slash = strrchr(exe, '/');
      if (slash)
        *slash = '\0';
      setenv("ECS_BIN_DIR", exe, 1);
    }
  }
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
    const char *extra[] = {"--pool-size", psz, "--log-level", "warn", NULL};
    if (ecs_ts_server_start(&server, rport, extra)) {
      fprintf(stderr, "ecstore-bench net: cannot start ecstore-server\n");
      ecs_ts_stop(&redis, 3000);
      return 1;
    }
    snprintf(servers, sizeof servers, "127.0.0.1:%d", server.port);
  }
  raw_srv_t rs = {.cap = 1 << 20};
  rs.buf = malloc(rs.cap);
  memset(rs.buf, 0x3c, rs.cap);
  if (ecs_net_listen("127.0.0.1", 0, 64, &rs.lfd)) {
    fprintf(stderr, "ecstore-bench net: cannot listen for the raw baseline\n");
    return 1;
  }
  rs.port = ecs_net_local_port(rs.lfd);
  pthread_t acc;
  pthread_create(&acc, NULL, raw_accept, &rs);

  FILE *csv = cfg.csv ? fopen(cfg.csv, "w") : NULL;
  if (cfg.csv && !csv) {
    fprintf(stderr, "ecstore-bench net: cannot write %s\n", cfg.csv);
    return 1;
  }
  if (csv)
    fprintf(csv, "op,size,batch,conns,path,gbps,mops,p50_us,p99_us\n");
  ecs_bench_print_machine();
  bench_env_t env = {.servers = servers, .rhost = rhost, .rport = rport, .raw_port = rs.port};
  int failed = 0;
  if (cfg.do_tcp)
    failed = tcp_table(&cfg, &env, csv);
  if (cfg.do_shm && !failed)
    failed = shm_table(&cfg, &env, csv);
  if (csv)
    fclose(csv);
  rs.stop = 1;
  pthread_join(acc, NULL);
  close(rs.lfd);
  free(rs.buf);
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
  net_usage(stderr);
  return 2;
}
