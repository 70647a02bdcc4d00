/*
 * The measuring core of ecstore-bench (bench_work.h): workers, cells,
 * repetitions, and the peers' clients and servers.
 */
#include "bench_work.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "ecstore/ecstore.h"
#include "store/core/net.h"

#define RAW_PUT_FLAG (1ull << 63) /* raw request: "take N bytes" rather than "send N" */
#define IO_MS 60000               /* deadline of one peer call */
#define RAW_IOV 64                /* buffers per raw-stream writev/readv */

/* Put keys are never reused (objects are immutable: re-putting a stored
 * key with the same bytes could be answered without moving them), so a
 * process-wide counter names every put round. */
static uint64_t put_round;

static uint64_t next_round(void) {
  return __atomic_fetch_add(&put_round, 1, __ATOMIC_RELAXED);
}

/* What the workers of one measurement share: they run the same phases
 * (a warm-up, then reps timed ones) in step, a barrier between phases. */
typedef struct cell {
  pthread_barrier_t bar; /* all connections start a phase together */
  int reps;              /* timed phases */
  double seconds;        /* length of a timed phase (the warm-up: a quarter) */
} cell_t;

typedef struct worker {
  const ecs_bench_env_t *env;
  const ecs_bench_job_t *job;
  cell_t *cell;
  int id;          /* connection index */
  int phase;       /* -1 before the first; 0 warm-up; 1..reps timed */
  uint64_t ncalls; /* calls in this phase */
  uint64_t end;    /* this phase ends (ns) */
  /* out, per phase */
  uint64_t bytes[ECS_BENCH_MAX_REPS + 1];   /* payload moved */
  uint64_t objects[ECS_BENCH_MAX_REPS + 1]; /* objects moved */
  uint64_t t_first[ECS_BENCH_MAX_REPS + 1]; /* start of the first call (ns) */
  uint64_t t_last[ECS_BENCH_MAX_REPS + 1];  /* end of the last call (ns) */
  double *lat_us;                           /* one latency per timed call */
  size_t nlat, lat_cap;
  int err; /* a call failed */
} worker_t;

static void lat_push(worker_t *w, double us) {
  if (w->nlat == w->lat_cap) {
    size_t cap = w->lat_cap ? w->lat_cap * 2 : 1024;
    double *p = realloc(w->lat_us, cap * sizeof *p);
    if (!p)
      return;
    w->lat_us = p;
    w->lat_cap = cap;
  }
  w->lat_us[w->nlat++] = us;
}

/* Starts the next phase once every connection is ready for it; 0 when
 * the last one is over.  Every worker must call it until it returns 0
 * (worker_main drains it after a failure), or the others would wait. */
static int next_phase(worker_t *w) {
  if (w->phase >= w->cell->reps)
    return 0;
  pthread_barrier_wait(&w->cell->bar);
  w->phase++;
  w->ncalls = 0;
  w->end = ecs_bench_now_ns() + (uint64_t)((w->phase ? w->cell->seconds : w->cell->seconds / 4) * 1e9);
  return 1;
}

/* Another call in this phase?  At least one, however long it takes. */
static int phase_running(const worker_t *w) {
  return !w->err && (w->ncalls == 0 || ecs_bench_now_ns() < w->end);
}

/* One call done: its bytes, its span and (timed phases) its latency. */
static void call_done(worker_t *w, uint64_t t0) {
  uint64_t now = ecs_bench_now_ns();
  int p = w->phase;
  if (!w->ncalls++)
    w->t_first[p] = t0;
  w->t_last[p] = now;
  w->bytes[p] += (uint64_t)w->job->batch * w->job->size;
  w->objects[p] += (uint64_t)w->job->batch;
  if (p > 0)
    lat_push(w, (double)(now - t0) / 1e3);
}

static void key_of(char *out, size_t cap, const worker_t *w, int i) {
  snprintf(out, cap, "bench-%zu-%d-%d", w->job->size, w->id, i);
}

/* Per-object buffers, faulted in before timing. */
static uint8_t **bufs_new(int n, size_t size, int fill) {
  uint8_t **v = calloc((size_t)n, sizeof *v);
  for (int i = 0; v && i < n; i++) {
    v[i] = malloc(size);
    if (!v[i]) {
      while (i--)
        free(v[i]);
      free(v);
      return NULL;
    }
    memset(v[i], fill, size);
  }
  return v;
}

static void bufs_free(uint8_t **v, int n) {
  for (int i = 0; v && i < n; i++)
    free(v[i]);
  free(v);
}

/* ------------------------------------------------------------------ */
/* ecstore                                                              */

static ecs_client_t *bench_client(const char *servers, const char *transport, int verify) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = servers;
  cfg.transport = transport;
  cfg.verify_checksum = verify;
  cfg.ns = "test";
  cfg.timeout_ms = IO_MS;
  ecs_client_t *c = NULL;
  char err[256];
  if (ecs_client_connect(&cfg, &c, err, sizeof err) != ECS_OK)
    fprintf(stderr, "ecstore-bench: connect (%s): %s\n", transport, err);
  return c;
}

static int batch_status(const int *st, int b) {
  for (int i = 0; i < b; i++)
    if (st[i])
      return st[i];
  return 0;
}

static void run_ecs(worker_t *w) {
  const ecs_bench_job_t *j = w->job;
  int get = j->mode != ECS_BM_ECS_PUT;
  ecs_client_t *c = bench_client(w->env->servers, j->transport, w->env->verify);
  if (!c) {
    w->err = 1;
    return;
  }
  int b = j->batch;
  ecs_key_t *keys = calloc((size_t)b, sizeof *keys);
  char(*names)[80] = calloc((size_t)b, 80);
  ecs_tensor_t *ts = calloc((size_t)b, sizeof *ts);
  ecs_get_buf_t *gb = calloc((size_t)b, sizeof *gb);
  ecs_view_t *views = calloc((size_t)b, sizeof *views);
  int *st = calloc((size_t)b, sizeof *st);
  uint8_t *src = malloc(j->size);
  uint8_t **dst = bufs_new(b, j->size, 0);
  if (!keys || !names || !ts || !gb || !views || !st || !src || !dst) {
    w->err = 1;
    goto out;
  }
  memset(src, 0x3c, j->size);
  for (int i = 0; i < b; i++) {
    key_of(names[i], 80, w, i);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    ts[i].data = src;
    ts[i].nbytes = j->size;
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = j->size;
  }
  if (get && (ecs_put_batch(c, keys, ts, (size_t)b, st) != ECS_OK || batch_status(st, b))) {
    fprintf(stderr, "ecstore-bench: put of the get working set failed: %s\n",
            ecs_strerror(batch_status(st, b)));
    w->err = 1;
  }
  while (next_phase(w)) {
    while (phase_running(w)) {
      if (w->err)
        break;
      int rc;
      if (!get) { /* fresh keys each call; the pool evicts the old */
        uint64_t round = next_round();
        for (int i = 0; i < b; i++) {
          snprintf(names[i], 80, "bench-put-%zu-%llu-%d", j->size, (unsigned long long)round, i);
          keys[i].len = strlen(names[i]);
        }
      }
      uint64_t t0 = ecs_bench_now_ns();
      if (j->mode == ECS_BM_ECS_VIEW) {
        rc = ecs_get_view_batch(c, keys, views, (size_t)b);
        for (int i = 0; !rc && i < b; i++)
          rc = views[i].status;
        ecs_view_release(c, views, (size_t)b);
      } else if (get) {
        for (int i = 0; i < b; i++) {
          gb[i].data = dst[i];
          gb[i].capacity = j->size;
        }
        rc = ecs_get_batch(c, keys, gb, (size_t)b);
        for (int i = 0; !rc && i < b; i++)
          rc = gb[i].status;
      } else {
        rc = ecs_put_batch(c, keys, ts, (size_t)b, st);
        if (!rc)
          rc = batch_status(st, b);
      }
      if (rc) {
        fprintf(stderr, "ecstore-bench: %s over %s failed: %s\n", get ? "get" : "put", j->transport,
                ecs_strerror(rc));
        w->err = 1;
        break;
      }
      call_done(w, t0);
    }
  }
  if (get) {
    for (int i = 0; i < b; i++) {
      key_of(names[i], 80, w, i);
      keys[i].len = strlen(names[i]);
    }
    ecs_remove_batch(c, keys, (size_t)b, st);
  }
out:
  bufs_free(dst, b);
  free(src);
  free(st);
  free(views);
  free(gb);
  free(ts);
  free(names);
  free(keys);
  ecs_client_close(c);
}

/* ------------------------------------------------------------------ */
/* raw TCP stream                                                       */

/* The payload of one raw request with slots: each readv/writev takes a
 * slot, waits for the socket without one.  0, or -1 on error or deadline. */
static int raw_io_slots(ecs_bench_raw_t *rs, int fd, struct iovec *iov, int cnt, int put) {
  uint64_t deadline = ecs_now_ms() + IO_MS;
  while (cnt > 0) {
    sem_wait(&rs->slots_);
    ssize_t r = put ? readv(fd, iov, cnt) : writev(fd, iov, cnt);
    int e = errno;
    sem_post(&rs->slots_);
    if (r > 0) {
      ecs_iov_advance(&iov, &cnt, (size_t)r);
      continue;
    }
    if (r == 0 || (e != EAGAIN && e != EWOULDBLOCK && e != EINTR))
      return -1;
    uint64_t now = ecs_now_ms();
    if (now >= deadline)
      return -1;
    struct pollfd pf = {fd, put ? POLLIN : POLLOUT, 0};
    poll(&pf, 1, (int)(deadline - now));
  }
  return 0;
}

/* One client of the raw server: u64 n; n == 0: bye; the top bit set:
 * receive the rest of n as bytes and ack with 8 bytes; else send n bytes. */
static void *raw_conn(void *p) {
  intptr_t *args = p;
  int fd = (int)args[0];
  ecs_bench_raw_t *rs = (ecs_bench_raw_t *)args[1];
  free(args);
  for (;;) {
    uint64_t n;
    if (ecs_net_read_all(fd, &n, 8, ecs_now_ms() + IO_MS) || n == 0)
      break;
    int put = (n & RAW_PUT_FLAG) != 0, bad = 0;
    n &= ~RAW_PUT_FLAG;
    /* up to RAW_IOV buffers' worth per writev/readv (all the same bytes):
     * one call hands the kernel as much as a server sending from its pool */
    while (n > 0 && !bad) {
      struct iovec iov[RAW_IOV];
      int cnt = 0;
      for (; cnt < RAW_IOV && n > 0; cnt++) {
        size_t k = n > rs->cap ? rs->cap : (size_t)n;
        iov[cnt] = (struct iovec){rs->buf, k};
        n -= k;
      }
      if (rs->threads > 0)
        bad = raw_io_slots(rs, fd, iov, cnt, put) != 0;
      else
        bad = (put ? ecs_net_readv_all(fd, iov, cnt, ecs_now_ms() + IO_MS)
                   : ecs_net_writev_all(fd, iov, cnt, ecs_now_ms() + IO_MS)) != 0;
    }
    if (!bad && put) {
      uint64_t ack = 1;
      struct iovec iov = {&ack, 8};
      bad = ecs_net_writev_all(fd, &iov, 1, ecs_now_ms() + IO_MS) != 0;
    }
    if (bad)
      break;
  }
  close(fd);
  return NULL;
}

static void *raw_accept(void *p) {
  ecs_bench_raw_t *rs = p;
  while (!rs->stop) {
    struct pollfd pf = {rs->lfd, POLLIN, 0};
    if (poll(&pf, 1, 50) <= 0)
      continue;
    int fd = accept(rs->lfd, NULL, NULL);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        continue;
      break;
    }
    ecs_net_set_nonblock(fd);
    ecs_net_tune_local(fd); /* as ecstore's own connections, so it stays the path's limit */
    intptr_t *args = malloc(2 * sizeof *args);
    pthread_t th;
    if (!args) {
      close(fd);
      continue;
    }
    args[0] = fd;
    args[1] = (intptr_t)rs;
    if (pthread_create(&th, NULL, raw_conn, args) != 0) {
      free(args);
      close(fd);
      continue;
    }
    pthread_detach(th);
  }
  return NULL;
}

int ecs_bench_raw_start(ecs_bench_raw_t *rs) {
  return ecs_bench_raw_start_threads(rs, 0);
}

int ecs_bench_raw_start_threads(ecs_bench_raw_t *rs, int threads) {
  memset(rs, 0, sizeof *rs);
  rs->lfd = -1;
  if (threads > 0 && sem_init(&rs->slots_, 0, (unsigned)threads) != 0)
    return -1;
  rs->threads = threads;
  rs->cap = 1 << 20;
  rs->buf = malloc(rs->cap);
  if (!rs->buf)
    return -1;
  memset(rs->buf, 0x3c, rs->cap);
  if (ecs_net_listen("127.0.0.1", 0, 64, &rs->lfd)) {
    free(rs->buf);
    rs->buf = NULL;
    return -1;
  }
  rs->port = ecs_net_local_port(rs->lfd);
  pthread_t th;
  if (pthread_create(&th, NULL, raw_accept, rs) != 0) {
    ecs_bench_raw_stop(rs);
    return -1;
  }
  rs->thread_ = (uint64_t)th;
  rs->started = 1;
  return 0;
}

void ecs_bench_raw_stop(ecs_bench_raw_t *rs) {
  if (rs->started) {
    rs->stop = 1;
    pthread_join((pthread_t)rs->thread_, NULL);
    rs->started = 0;
  }
  if (rs->lfd >= 0)
    close(rs->lfd);
  rs->lfd = -1;
  free(rs->buf);
  rs->buf = NULL;
  if (rs->threads > 0)
    sem_destroy(&rs->slots_);
  rs->threads = 0;
}

/* Raw socket: the batch as one request for (or one upload of) batch*size
 * bytes, read into (or sent from) per-object buffers. */
static void run_raw(worker_t *w) {
  const ecs_bench_job_t *j = w->job;
  int put = j->mode == ECS_BM_RAW_PUT, fd, b = j->batch;
  if (ecs_net_connect("127.0.0.1", w->env->raw_port, 2000, &fd)) {
    w->err = 1;
    return;
  }
  ecs_net_tune_local(fd);
  struct iovec *iov = calloc((size_t)b + 1, sizeof *iov), *tmp = calloc((size_t)b + 1, sizeof *tmp);
  uint8_t **obj = bufs_new(b, j->size, 0x3c);
  if (!iov || !tmp || !obj) {
    w->err = 1;
    goto out;
  }
  uint64_t n = (uint64_t)b * j->size, req = put ? n | RAW_PUT_FLAG : n, ack;
  iov[0].iov_base = &req;
  iov[0].iov_len = 8;
  for (int i = 0; i < b; i++) {
    iov[i + 1].iov_base = obj[i];
    iov[i + 1].iov_len = j->size;
  }
  while (next_phase(w)) {
    while (phase_running(w)) {
      uint64_t t0 = ecs_bench_now_ns();
      int rc;
      if (put) { /* header and bytes in one writev, then the ack */
        memcpy(tmp, iov, ((size_t)b + 1) * sizeof *iov);
        rc = ecs_net_writev_all(fd, tmp, b + 1, ecs_now_ms() + IO_MS) ||
             ecs_net_read_all(fd, &ack, 8, ecs_now_ms() + IO_MS);
      } else {
        memcpy(tmp, iov, ((size_t)b + 1) * sizeof *iov);
        rc = ecs_net_writev_all(fd, tmp, 1, ecs_now_ms() + IO_MS) ||
             ecs_net_readv_all(fd, tmp + 1, b, ecs_now_ms() + IO_MS);
      }
      if (rc) {
        fprintf(stderr, "ecstore-bench: raw stream failed\n");
        w->err = 1;
        break;
      }
      call_done(w, t0);
    }
  }
  uint64_t zero = 0;
  struct iovec bye = {&zero, 8};
  ecs_net_writev_all(fd, &bye, 1, ecs_now_ms() + 1000);
out:
  close(fd);
  bufs_free(obj, b);
  free(iov);
  free(tmp);
}

/* ------------------------------------------------------------------ */
/* Redis                                                                */

/* The batch as one pipeline of GETs (or SETs) per call; a GET's bytes are
 * copied out of hiredis's reply into the caller's buffer, as a client
 * library handing bytes to its caller must. */
static void run_redis(worker_t *w) {
  const ecs_bench_job_t *j = w->job;
  struct timeval tv = {IO_MS / 1000, 0};
  redisContext *r = redisConnectWithTimeout(w->env->rhost, w->env->rport, tv);
  if (!r || r->err) {
    fprintf(stderr, "ecstore-bench: cannot connect to Redis\n");
    w->err = 1;
    if (r)
      redisFree(r);
    return;
  }
  redisSetTimeout(r, tv);
  int b = j->batch, get = j->mode == ECS_BM_REDIS_GET;
  char *val = malloc(j->size);
  uint8_t **dst = bufs_new(b, j->size, 0);
  char key[96];
  if (!val || !dst) {
    w->err = 1;
    goto out;
  }
  memset(val, 0x3c, j->size);
  for (int i = 0; get && i < b; i++) {
    key_of(key, sizeof key, w, i);
    redisReply *rep = redisCommand(r, "SET %s %b", key, val, j->size);
    if (!rep || rep->type == REDIS_REPLY_ERROR)
      w->err = 1;
    freeReplyObject(rep);
  }
  while (next_phase(w)) {
    while (phase_running(w)) {
      if (w->err)
        break;
      uint64_t t0 = ecs_bench_now_ns();
      for (int i = 0; i < b; i++) {
        key_of(key, sizeof key, w, i);
        if (get)
          redisAppendCommand(r, "GET %s", key);
        else
          redisAppendCommand(r, "SET %s %b", key, val, j->size);
      }
      for (int i = 0; i < b; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(r, (void **)&rep) != REDIS_OK || !rep || rep->type == REDIS_REPLY_ERROR ||
            (get && (rep->type != REDIS_REPLY_STRING || (size_t)rep->len != j->size))) {
          fprintf(stderr, "ecstore-bench: Redis %s failed\n", get ? "GET" : "SET");
          freeReplyObject(rep);
          w->err = 1;
          break;
        }
        if (get)
          memcpy(dst[i], rep->str, j->size);
        freeReplyObject(rep);
      }
      if (w->err)
        break;
      call_done(w, t0);
    }
  }
  for (int i = 0; i < b; i++) {
    key_of(key, sizeof key, w, i);
    freeReplyObject(redisCommand(r, "DEL %s", key));
  }
out:
  free(val);
  bufs_free(dst, b);
  redisFree(r);
}

/* ------------------------------------------------------------------ */
/* memcached: a tiny text-protocol client                               */

typedef struct mc {
  int fd;
  uint8_t buf[64 << 10]; /* bytes read ahead */
  size_t off, len;       /* unread bytes: buf[off..len) */
} mc_t;

static int mc_fill(mc_t *m) {
  if (m->off == m->len)
    m->off = m->len = 0;
  if (m->len == sizeof m->buf)
    return -1; /* a line longer than the buffer: not memcached */
  struct iovec iov = {m->buf + m->len, sizeof m->buf - m->len};
  /* readv_all wants every byte; a short read is what we want here */
  struct pollfd pf = {m->fd, POLLIN, 0};
  if (poll(&pf, 1, IO_MS) <= 0)
    return -1;
  ssize_t k = readv(m->fd, &iov, 1);
  if (k <= 0)
    return -1;
  m->len += (size_t)k;
  return 0;
}

/* One "\r\n"-terminated line into out (NUL-terminated, without the end). */
static int mc_line(mc_t *m, char *out, size_t cap) {
  for (;;) {
    uint8_t *s = m->buf + m->off, *e = memchr(s, '\n', m->len - m->off);
    if (e) {
      size_t n = (size_t)(e - s);
      if (n && s[n - 1] == '\r')
        n--;
      if (n >= cap)
        return -1;
      memcpy(out, s, n);
      out[n] = '\0';
      m->off += (size_t)(e - s) + 1;
      return 0;
    }
    if (m->off) { /* make room: move the partial line to the front */
      memmove(m->buf, m->buf + m->off, m->len - m->off);
      m->len -= m->off;
      m->off = 0;
    }
    if (mc_fill(m))
      return -1;
  }
}

/* n bytes into dst: what was read ahead first, the rest straight from the
 * socket into dst. */
static int mc_read(mc_t *m, void *dst, size_t n) {
  size_t have = m->len - m->off, k = have < n ? have : n;
  memcpy(dst, m->buf + m->off, k);
  m->off += k;
  if (k == n)
    return 0;
  return ecs_net_read_all(m->fd, (uint8_t *)dst + k, n - k, ecs_now_ms() + IO_MS) ? -1 : 0;
}

/* set: every item's "set KEY 0 0 N\r\n" + bytes + "\r\n" in one writev
 * stream, then the batch's STORED lines. */
static int mc_set(mc_t *m, char (*hdr)[128], struct iovec *iov, const uint8_t *val, size_t size, int b) {
  char line[256];
  for (int i = 0; i < b; i++) {
    iov[3 * i] = (struct iovec){hdr[i], strlen(hdr[i])};
    iov[3 * i + 1] = (struct iovec){(void *)val, size};
    iov[3 * i + 2] = (struct iovec){"\r\n", 2};
  }
  if (ecs_net_writev_all(m->fd, iov, 3 * b, ecs_now_ms() + IO_MS))
    return -1;
  for (int i = 0; i < b; i++)
    if (mc_line(m, line, sizeof line) || strcmp(line, "STORED") != 0)
      return -1;
  return 0;
}

/* get: one "get K1 .. Kb" request; the VALUE blocks are read straight
 * into the caller's buffers (the best a client can do). */
static int mc_get(mc_t *m, const char *req, size_t rl, uint8_t **dst, size_t size, int b) {
  char line[256], key[128];
  struct iovec q = {(void *)req, rl};
  if (ecs_net_writev_all(m->fd, &q, 1, ecs_now_ms() + IO_MS))
    return -1;
  for (int i = 0; i < b; i++) {
    size_t nb = 0;
    unsigned fl;
    if (mc_line(m, line, sizeof line) || sscanf(line, "VALUE %127s %u %zu", key, &fl, &nb) != 3 ||
        nb != size || mc_read(m, dst[i], nb) || mc_line(m, line, sizeof line) || line[0] != '\0')
      return -1;
  }
  return mc_line(m, line, sizeof line) || strcmp(line, "END") != 0 ? -1 : 0;
}

static void run_mc(worker_t *w) {
  const ecs_bench_job_t *j = w->job;
  int b = j->batch, get = j->mode == ECS_BM_MC_GET;
  mc_t *m = calloc(1, sizeof *m);
  if (!m || ecs_net_connect("127.0.0.1", w->env->mc_port, 2000, &m->fd)) {
    fprintf(stderr, "ecstore-bench: cannot connect to memcached\n");
    free(m);
    w->err = 1;
    return;
  }
  uint8_t *val = malloc(j->size);
  uint8_t **dst = bufs_new(b, j->size, 0);
  char(*hdr)[128] = calloc((size_t)b, 128);
  struct iovec *iov = calloc(3 * (size_t)b, sizeof *iov);
  char *req = malloc((size_t)b * 48 + 16);
  if (!val || !dst || !hdr || !iov || !req) {
    w->err = 1;
    goto out;
  }
  memset(val, 0x3c, j->size);
  char key[96];
  size_t rl = (size_t)sprintf(req, "get");
  for (int i = 0; i < b; i++) {
    key_of(key, sizeof key, w, i);
    snprintf(hdr[i], 128, "set %s 0 0 %zu\r\n", key, j->size);
    rl += (size_t)sprintf(req + rl, " %s", key);
  }
  rl += (size_t)sprintf(req + rl, "\r\n");
  if (get && mc_set(m, hdr, iov, val, j->size, b)) {
    fprintf(stderr, "ecstore-bench: memcached set of the get working set failed\n");
    w->err = 1;
    goto out;
  }
  while (next_phase(w)) {
    while (phase_running(w)) {
      uint64_t t0 = ecs_bench_now_ns();
      if (get ? mc_get(m, req, rl, dst, j->size, b) : mc_set(m, hdr, iov, val, j->size, b)) {
        fprintf(stderr, "ecstore-bench: memcached %s failed\n", get ? "get" : "set");
        w->err = 1;
        break;
      }
      call_done(w, t0);
    }
  }
out:
  close(m->fd);
  free(m);
  free(val);
  bufs_free(dst, b);
  free(hdr);
  free(iov);
  free(req);
}

/* ------------------------------------------------------------------ */
/* files, as vLLM's disk connector keeps them                            */

static void file_name(char *out, size_t cap, const worker_t *w, int i, int tmp) {
  snprintf(out, cap, "%s/%sobj-%zu-%d-%d%s", w->job->dir, tmp ? "." : "", w->job->size, w->id, i,
           tmp ? ".tmp" : ".bin");
}

static int write_file(const worker_t *w, int i, const uint8_t *src) {
  char tmp[600], path[600];
  file_name(tmp, sizeof tmp, w, i, 1);
  file_name(path, sizeof path, w, i, 0);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return -1;
  size_t done = 0;
  while (done < w->job->size) {
    ssize_t k = write(fd, src + done, w->job->size - done);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      close(fd);
      return -1;
    }
    done += (size_t)k;
  }
  if ((w->job->fsync && fsync(fd) != 0) || close(fd) != 0)
    return -1;
  return rename(tmp, path);
}

static int read_file(const worker_t *w, int i, uint8_t *dst) {
  char path[600];
  file_name(path, sizeof path, w, i, 0);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  size_t done = 0;
  while (done < w->job->size) {
    ssize_t k = read(fd, dst + done, w->job->size - done);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    done += (size_t)k;
  }
  close(fd);
  return done == w->job->size ? 0 : -1;
}

/* One file per object (vLLM's example connector writes one safetensors
 * file per mm_hash): put writes a temp file, fsyncs it when job.fsync, and
 * renames it over the object's name (ecstore's disk backend does the same
 * for atomicity); get opens, reads into the caller's buffer, closes. */
static void run_file(worker_t *w) {
  const ecs_bench_job_t *j = w->job;
  int b = j->batch, get = j->mode == ECS_BM_FILE_GET;
  uint8_t *src = malloc(j->size);
  uint8_t **dst = bufs_new(b, j->size, 0);
  if (!src || !dst) {
    w->err = 1;
    goto out;
  }
  memset(src, 0x3c, j->size);
  for (int i = 0; get && i < b && !w->err; i++)
    w->err = write_file(w, i, src) != 0;
  while (next_phase(w)) {
    while (phase_running(w)) {
      if (w->err)
        break;
      uint64_t t0 = ecs_bench_now_ns();
      for (int i = 0; i < b && !w->err; i++)
        w->err = (get ? read_file(w, i, dst[i]) : write_file(w, i, src)) != 0;
      if (w->err) {
        fprintf(stderr, "ecstore-bench: file %s in %s failed: %s\n", get ? "read" : "write", j->dir,
                strerror(errno));
        break;
      }
      call_done(w, t0);
    }
  }
  for (int i = 0; i < b; i++) {
    char path[600];
    file_name(path, sizeof path, w, i, 0);
    unlink(path);
  }
out:
  free(src);
  bufs_free(dst, b);
}

/* ------------------------------------------------------------------ */
/* memcpy                                                               */

/* The physical limit of the shared-memory path: the same bytes copied
 * between private buffers of the same sizes, batch by batch. */
static void run_memcpy(worker_t *w) {
  int b = w->job->batch;
  size_t size = w->job->size;
  uint8_t **src = bufs_new(b, size, 0x3c), **dst = bufs_new(b, size, 0);
  if (!src || !dst) {
    w->err = 1;
    goto out;
  }
  while (next_phase(w)) {
    while (phase_running(w)) {
      uint64_t t0 = ecs_bench_now_ns();
      for (int i = 0; i < b; i++)
        memcpy(dst[i], src[i], size);
      __asm__ __volatile__("" ::: "memory"); /* keep the copies */
      call_done(w, t0);
    }
  }
out:
  bufs_free(src, b);
  bufs_free(dst, b);
}

/* ------------------------------------------------------------------ */
/* cells and measurements                                               */

static void *worker_main(void *p) {
  worker_t *w = p;
  switch (w->job->mode) {
  case ECS_BM_ECS_GET:
  case ECS_BM_ECS_PUT:
  case ECS_BM_ECS_VIEW: run_ecs(w); break;
  case ECS_BM_RAW_GET:
  case ECS_BM_RAW_PUT: run_raw(w); break;
  case ECS_BM_REDIS_GET:
  case ECS_BM_REDIS_SET: run_redis(w); break;
  case ECS_BM_MC_GET:
  case ECS_BM_MC_SET: run_mc(w); break;
  case ECS_BM_FILE_GET:
  case ECS_BM_FILE_PUT: run_file(w); break;
  case ECS_BM_MEMCPY: run_memcpy(w); break;
  }
  if (!w->err && w->phase < w->cell->reps)
    w->err = 1;         /* a worker that left early failed somewhere */
  while (next_phase(w)) /* keep step with the others to the end */
    ;
  return NULL;
}

/* One measurement: the job's connections run a warm-up phase and reps
 * timed phases in step, each worker setting up once (connect, store a
 * get's batch) before the first.  A phase's throughput is its payload over
 * the span from its first call's start to its last call's end, across
 * connections; latencies pool every timed call. */
int ecs_bench_measure(const ecs_bench_env_t *env, const ecs_bench_job_t *job, int reps, double seconds,
                      ecs_bench_result_t *out) {
  memset(out, 0, sizeof *out);
  reps = reps < 1 ? 1 : reps > ECS_BENCH_MAX_REPS ? ECS_BENCH_MAX_REPS : reps;
  int n = job->conns < 1 ? 1 : job->conns > ECS_BENCH_MAX_CONNS ? ECS_BENCH_MAX_CONNS : job->conns;
  cell_t cell = {.reps = reps, .seconds = seconds};
  worker_t *ws = calloc((size_t)n, sizeof *ws);
  pthread_t th[ECS_BENCH_MAX_CONNS];
  if (!ws || pthread_barrier_init(&cell.bar, NULL, (unsigned)n) != 0) {
    free(ws);
    return -1;
  }
  int started = 0, err = 0;
  for (int i = 0; i < n; i++) {
    ws[i] = (worker_t){.env = env, .job = job, .cell = &cell, .id = i, .phase = -1};
    if (pthread_create(&th[i], NULL, worker_main, &ws[i]) != 0)
      break;
    started++;
  }
  if (started < n) { /* the barrier counts n: the started ones would wait forever */
    fprintf(stderr, "ecstore-bench: cannot start %d threads\n", n);
    exit(1);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    err |= ws[i].err;
  }
  pthread_barrier_destroy(&cell.bar);
  double g[ECS_BENCH_MAX_REPS], m[ECS_BENCH_MAX_REPS];
  size_t nlat = 0;
  for (int p = 1; p <= reps; p++) {
    uint64_t bytes = 0, objects = 0, t0 = UINT64_MAX, t1 = 0;
    for (int i = 0; i < n; i++) {
      bytes += ws[i].bytes[p];
      objects += ws[i].objects[p];
      if (ws[i].bytes[p] || ws[i].objects[p]) {
        t0 = ws[i].t_first[p] < t0 ? ws[i].t_first[p] : t0;
        t1 = ws[i].t_last[p] > t1 ? ws[i].t_last[p] : t1;
      }
    }
    double span = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0;
    g[p - 1] = span > 0 ? (double)bytes / span / 1e9 : 0;
    m[p - 1] = span > 0 ? (double)objects / span / 1e6 : 0;
  }
  for (int i = 0; i < n; i++)
    for (int p = 0; p <= reps; p++)
      out->objects_all += ws[i].objects[p];
  for (int i = 0; i < n; i++)
    nlat += ws[i].nlat;
  double *lat = malloc((nlat ? nlat : 1) * sizeof *lat);
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    if (lat)
      memcpy(lat + k, ws[i].lat_us, ws[i].nlat * sizeof *lat);
    k += ws[i].nlat;
    free(ws[i].lat_us);
  }
  free(ws);
  if (err || !lat) {
    free(lat);
    return -1;
  }
  out->reps = reps;
  out->gbps = ecs_bench_median(g, (size_t)reps); /* sorts g */
  out->gbps_min = g[0];
  out->gbps_max = g[reps - 1];
  out->mops = ecs_bench_median(m, (size_t)reps);
  out->calls = nlat;
  out->p50_us = ecs_bench_percentile(lat, nlat, 50);
  out->p99_us = ecs_bench_percentile(lat, nlat, 99);
  free(lat);
  return 0;
}

/* ------------------------------------------------------------------ */
/* processes and labels                                                 */

int ecs_bench_memcached_start(ecs_ts_proc_t *p, size_t mem_mb, size_t max_item) {
  const char *bin = access("/usr/bin/memcached", X_OK) == 0 ? "/usr/bin/memcached" : NULL;
  if (!bin)
    return -1;
  memset(p, 0, sizeof *p);
  int port = ecs_ts_free_port();
  if (port <= 0)
    return -1;
  char sport[16], smem[32], sitem[32];
  snprintf(sport, sizeof sport, "%d", port);
  snprintf(smem, sizeof smem, "%zu", mem_mb);
  /* -I bounds the item with its header: twice the largest value, >= 2 MiB */
  size_t item_mb = 2 * ((max_item + (1u << 20) - 1) >> 20);
  snprintf(sitem, sizeof sitem, "%zum", item_mb < 2 ? 2 : item_mb);
  if (mem_mb < 2 * item_mb)
    snprintf(smem, sizeof smem, "%zu", 2 * item_mb);
  /* -U 0: no UDP; -t 2: the machine's cores; -u: memcached refuses root */
  char *argv[] = {(char *)bin, "-l", "127.0.0.1", "-p", sport, "-U", "0",    "-m",
                  smem,        "-I", sitem,       "-t", "2",   "-u", "root", NULL};
  if (geteuid() != 0)
    argv[13] = NULL;
  if (ecs_ts_spawn(p, argv) || ecs_ts_wait_port(p, port, 10000)) {
    ecs_ts_stop(p, 2000);
    return -1;
  }
  p->port = port;
  return 0;
}

void ecs_bench_find_bins(void) {
  if (getenv("ECS_BIN_DIR"))
    return;
  char exe[512];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash)
    *slash = '\0';
  setenv("ECS_BIN_DIR", exe, 1);
}

void ecs_bench_size_label(char *out, size_t cap, size_t size) {
  if (size >= (1u << 30) && size % (1u << 30) == 0)
    snprintf(out, cap, "%zuG", size >> 30);
  else if (size >= (1u << 20) && size % (1u << 20) == 0)
    snprintf(out, cap, "%zuM", size >> 20);
  else if (size >= 1024 && size % 1024 == 0)
    snprintf(out, cap, "%zuK", size >> 10);
  else
    snprintf(out, cap, "%zu", size);
}
