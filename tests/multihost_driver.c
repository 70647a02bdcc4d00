/*
 * ecs-mh-driver: the client side of the multi-host tests and benchmark
 * (tests/multihost_netns.sh, bench/multihost_bench.sh), one process per
 * simulated host.  Every client here is configured with only a Redis URL
 * and a namespace: the servers come from the registry.
 *
 *   put     --prefix P --n N --size B [--placement X] [--replicas R]
 *           puts P-0..P-(N-1), each B bytes of a pattern drawn from its key;
 *           prints "put ok=N fail=F copies=S/W"; exit 0 when all are OK
 *   getloop --ctl FILE --n N --size B --rounds R [--interval-ms I]
 *           each round reads the prefixes listed in FILE (one a line: a
 *           prefix, or "stop"), gets all their objects in one batch with
 *           one long-lived client, checks every byte, and prints
 *           "round=K rc=RC servers=S ok=A miss=M wrong=W other=O P:ok ..."
 *   holders --prefix P --n N
 *           prints "KEY NODE" per key, from the Redis records
 *   rawserve --listen HOST:PORT
 *           raw TCP baseline: per request (8 bytes, big-endian length)
 *           writes that many bytes
 *   bench   --prefix P --n N --size B --batches 1,32 --reps R --raw HOST:PORT
 *           median and spread of a get batch from the remote holder, of a
 *           raw TCP read of the same bytes over the same link, and of the
 *           batch's Redis location lookup alone
 *   spread  --prefix P --prefix2 Q --n N --size B --reps R
 *           a batch of N/2 objects of P and N/2 of Q (held by two servers)
 *           in one call, against the same two halves in two calls one
 *           after the other: what fetching the groups in parallel saves
 *   putbench --prefix P --n N --size B --reps R [--replicas K]
 *           median and spread of a put batch of N fresh objects with
 *           replicas 1 and with replicas K (default 2), the two
 *           alternating rep by rep, and the ratio of the medians
 *
 *   rateloop --prefix P --n N --size B --secs S
 *           get batches of P-0..P-(N-1) back to back for S seconds, one
 *           long-lived client; prints per call "call wall=MS dt=MS ok=A
 *           miss=M other=O wrong=W rc=RC" (wall: its start, CLOCK_REALTIME
 *           ms), for a partition's rates and deadlines
 *
 * Common: --redis URL --ns NS [--transport T] [--timeout-ms MS]
 * [--verify 0|1] (the client's verify_checksum, default 1).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ecstore/ecstore.h"
#include "store/redis/meta.h"
#include "store/core/net.h"

typedef struct opts {
  const char *redis, *ns, *prefix, *placement, *transport, *ctl, *listen, *raw, *batches, *prefix2;
  int n, rounds, interval_ms, reps, timeout_ms, verify, replicas, secs;
  uint64_t size;
} opts_t;

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The bytes object `key` must hold: a stream seeded by the key's FNV-1a. */
static void pattern(const char *key, uint8_t *p, uint64_t n) {
  uint64_t s = 0xcbf29ce484222325ull;
  for (const char *c = key; *c; c++)
    s = (s ^ (uint8_t)*c) * 0x100000001b3ull;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, 8);
  }
  for (uint64_t v = splitmix(&s); i < n; i++, v >>= 8)
    p[i] = (uint8_t)v;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static ecs_client_t *connect_or_die(const opts_t *o) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.redis_url = o->redis;
  cfg.ns = o->ns;
  cfg.placement = o->placement;
  cfg.transport = o->transport;
  cfg.timeout_ms = o->timeout_ms;
  cfg.connect_timeout_ms = o->timeout_ms < 1000 ? o->timeout_ms : 1000;
  cfg.registry_refresh_ms = 500;
  cfg.verify_checksum = o->verify;
  cfg.replicas = o->replicas;
  ecs_client_t *c = NULL;
  char err[300] = "";
  int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
  if (rc) {
    fprintf(stderr, "ecs-mh-driver: connect: %s: %s\n", ecs_strerror(rc), err);
    exit(1);
  }
  return c;
}

static char (*key_names(const char *pfx, int n))[64] {
  char(*k)[64] = calloc((size_t)n, 64);
  if (!k)
    exit(1);
  for (int i = 0; i < n; i++)
    snprintf(k[i], 64, "%.40s-%d", pfx, i);
  return k;
}

static int cmd_put(const opts_t *o) {
  ecs_client_t *c = connect_or_die(o);
  char(*names)[64] = key_names(o->prefix, o->n);
  uint8_t *buf = malloc(o->size ? o->size : 1);
  int ok = 0, fail = 0;
  size_t stored = 0, wanted = 0;
  for (int i = 0; i < o->n; i++) { /* one at a time: a put's bytes can be large */
    pattern(names[i], buf, o->size);
    ecs_key_t k = {names[i], strlen(names[i])};
    ecs_tensor_t t = {.data = buf, .nbytes = o->size, .desc = {.dtype = ECS_DTYPE_U8, .ndim = 1}};
    t.desc.shape[0] = o->size;
    int st = ECS_OK;
    int rc = ecs_put_batch(c, &k, &t, 1, &st);
    size_t s1 = 0, w1 = 0;
    ecs_client_put_copies(c, &s1, &w1);
    stored += s1;
    wanted += w1;
    if (rc == ECS_OK && st == ECS_OK)
      ok++;
    else {
      fail++;
      fprintf(stderr, "put %s: %s (%s)\n", names[i], ecs_strerror(rc ? rc : st), ecs_client_errmsg(c));
    }
  }
  printf("put ok=%d fail=%d copies=%zu/%zu servers=%zu transport=%s\n", ok, fail, stored, wanted,
         ecs_client_server_count(c), ecs_client_transport(c));
  free(buf);
  free(names);
  ecs_client_close(c);
  return fail ? 1 : 0;
}

#define MAXP 16

static int cmd_getloop(const opts_t *o) {
  ecs_client_t *c = connect_or_die(o);
  uint8_t *want = malloc(o->size ? o->size : 1);
  for (int round = 0; round < o->rounds; round++) {
    char pf[MAXP][64];
    int np = 0, stop = 0;
    FILE *f = fopen(o->ctl, "r");
    char line[128];
    while (f && np < MAXP && fgets(line, sizeof line, f)) {
      line[strcspn(line, "\r\n")] = '\0';
      if (!strcmp(line, "stop"))
        stop = 1;
      else if (line[0])
        snprintf(pf[np++], sizeof pf[0], "%.40s", line);
    }
    if (f)
      fclose(f);
    if (stop)
      break;
    size_t n = (size_t)np * (size_t)o->n;
    char(*names)[64] = calloc(n ? n : 1, 64);
    ecs_key_t *keys = calloc(n ? n : 1, sizeof *keys);
    ecs_get_buf_t *b = calloc(n ? n : 1, sizeof *b);
    for (int p = 0; p < np; p++)
      for (int i = 0; i < o->n; i++) {
        size_t j = (size_t)p * (size_t)o->n + (size_t)i;
        snprintf(names[j], 64, "%.40s-%d", pf[p], i);
        keys[j] = (ecs_key_t){names[j], strlen(names[j])};
      }
    int rc = ecs_get_batch_alloc(c, keys, b, n);
    int ok = 0, miss = 0, wrong = 0, other = 0, pok[MAXP] = {0};
    for (size_t j = 0; j < n; j++) {
      if (b[j].status == ECS_OK) {
        pattern(names[j], want, o->size);
        if (b[j].nbytes != o->size || memcmp(b[j].data, want, o->size) != 0)
          wrong++;
        else {
          ok++;
          pok[j / (size_t)o->n]++;
        }
      } else if (b[j].status == ECS_ENOTFOUND)
        miss++;
      else
        other++;
      ecs_free(b[j].data);
    }
    printf("round=%d rc=%d servers=%zu ok=%d miss=%d wrong=%d other=%d", round, rc,
           ecs_client_server_count(c), ok, miss, wrong, other);
    for (int p = 0; p < np; p++)
      printf(" %s:%d", pf[p], pok[p]);
    printf("%s%s\n", rc ? " err=" : "", rc ? ecs_client_errmsg(c) : "");
    fflush(stdout);
    free(names);
    free(keys);
    free(b);
    usleep((useconds_t)o->interval_ms * 1000);
  }
  free(want);
  ecs_client_close(c);
  return 0;
}

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int cmd_rateloop(const opts_t *o) {
  ecs_client_t *c = connect_or_die(o);
  size_t n = (size_t)o->n;
  char(*names)[64] = calloc(n, 64);
  ecs_key_t *keys = calloc(n, sizeof *keys);
  ecs_get_buf_t *b = calloc(n, sizeof *b);
  uint8_t *want = malloc(o->size ? o->size : 1);
  if (!names || !keys || !b || !want)
    return 1;
  for (size_t j = 0; j < n; j++) {
    snprintf(names[j], 64, "%.40s-%zu", o->prefix, j);
    keys[j] = (ecs_key_t){names[j], strlen(names[j])};
  }
  uint64_t end = ecs_now_ms() + (uint64_t)o->secs * 1000u;
  while (ecs_now_ms() < end) {
    uint64_t w0 = wall_ms(), t0 = ecs_now_ms();
    int rc = ecs_get_batch_alloc(c, keys, b, n);
    uint64_t dt = ecs_now_ms() - t0;
    int ok = 0, miss = 0, wrong = 0, other = 0;
    for (size_t j = 0; j < n; j++) {
      if (b[j].status == ECS_OK) {
        pattern(names[j], want, o->size);
        if (b[j].nbytes != o->size || memcmp(b[j].data, want, o->size) != 0)
          wrong++;
        else
          ok++;
      } else if (b[j].status == ECS_ENOTFOUND) {
        miss++;
      } else {
        other++;
      }
      ecs_free(b[j].data);
      b[j].data = NULL;
    }
    printf("call wall=%llu dt=%llu ok=%d miss=%d other=%d wrong=%d rc=%d\n", (unsigned long long)w0,
           (unsigned long long)dt, ok, miss, other, wrong, rc);
    fflush(stdout);
  }
  free(names);
  free(keys);
  free(b);
  free(want);
  ecs_client_close(c);
  return 0;
}

static ecs_meta_t *meta_or_die(const opts_t *o) {
  ecs_meta_opts_t mo;
  ecs_meta_opts_init(&mo);
  mo.redis_url = o->redis;
  mo.ns = o->ns;
  mo.timeout_ms = 2000;
  ecs_meta_t *m = NULL;
  if (ecs_meta_open(&mo, &m) != ECS_OK || !ecs_meta_is_up(m)) {
    fprintf(stderr, "ecs-mh-driver: cannot reach Redis %s\n", o->redis);
    exit(1);
  }
  return m;
}

static int cmd_holders(const opts_t *o) {
  ecs_meta_t *m = meta_or_die(o);
  char(*names)[64] = key_names(o->prefix, o->n);
  const uint8_t **kp = calloc((size_t)o->n, sizeof *kp);
  uint16_t *kl = calloc((size_t)o->n, sizeof *kl);
  ecs_meta_rec_t *recs = calloc((size_t)o->n, sizeof *recs);
  int *st = calloc((size_t)o->n, sizeof *st);
  for (int i = 0; i < o->n; i++) {
    kp[i] = (const uint8_t *)names[i];
    kl[i] = (uint16_t)strlen(names[i]);
  }
  int rc = ecs_meta_lookup_batch(m, kp, kl, (size_t)o->n, recs, st);
  for (int i = 0; i < o->n && rc == ECS_OK; i++)
    printf("%s %s\n", names[i], st[i] == ECS_OK ? recs[i].node_id : "-");
  ecs_meta_close(m);
  free(names);
  free(kp);
  free(kl);
  free(recs);
  free(st);
  return rc ? 1 : 0;
}

static int cmd_rawserve(const opts_t *o) {
  char host[128];
  int port, lfd;
  if (ecs_net_parse_hostport(o->listen, host, sizeof host, &port) || ecs_net_listen(host, port, 16, &lfd)) {
    fprintf(stderr, "ecs-mh-driver: cannot listen on %s\n", o->listen);
    return 1;
  }
  static uint8_t chunk[1 << 20];
  for (;;) {
    struct pollfd p = {lfd, POLLIN, 0};
    poll(&p, 1, -1);
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
      continue;
    for (;;) {
      uint64_t be;
      if (ecs_net_read_all(fd, &be, 8, ecs_now_ms() + 600000) != ECS_OK)
        break;
      uint64_t left = be64toh(be);
      int bad = 0;
      while (left && !bad) {
        size_t k = left < sizeof chunk ? (size_t)left : sizeof chunk;
        struct iovec iov = {chunk, k};
        bad = ecs_net_writev_all(fd, &iov, 1, ecs_now_ms() + 60000) != ECS_OK;
        left -= k;
      }
      if (bad)
        break;
    }
    close(fd);
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median and the spread (p10..p90) of v[0..n), sorted in place. */
static void stats(double *v, int n, double *med, double *lo, double *hi) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  *med = v[n / 2];
  *lo = v[n / 10];
  *hi = v[n - 1 - n / 10];
}

static int cmd_bench(const opts_t *o) {
  ecs_client_t *c = connect_or_die(o);
  ecs_meta_t *m = meta_or_die(o);
  char host[128];
  int port, rfd;
  if (ecs_net_parse_hostport(o->raw, host, sizeof host, &port) || ecs_net_connect(host, port, 2000, &rfd)) {
    fprintf(stderr, "ecs-mh-driver: cannot reach the raw server %s\n", o->raw);
    return 1;
  }
  char(*names)[64] = key_names(o->prefix, o->n);
  uint8_t *sink = malloc(o->size);
  uint8_t *dst = malloc(o->size * (uint64_t)o->n);
  double *t_get = calloc((size_t)o->reps, sizeof(double)), *t_raw = calloc((size_t)o->reps, sizeof(double));
  double *t_loc = calloc((size_t)o->reps, sizeof(double));
  char list[64];
  snprintf(list, sizeof list, "%s", o->batches);
  int fail = 0;
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && !fail; tok = strtok_r(NULL, ",", &save)) {
    int batch = atoi(tok);
    if (batch < 1 || batch > o->n)
      continue;
    ecs_key_t *keys = calloc((size_t)batch, sizeof *keys);
    ecs_get_buf_t *b = calloc((size_t)batch, sizeof *b);
    const uint8_t **kp = calloc((size_t)batch, sizeof *kp);
    uint16_t *kl = calloc((size_t)batch, sizeof *kl);
    ecs_meta_rec_t *recs = calloc((size_t)batch, sizeof *recs);
    int *st = calloc((size_t)batch, sizeof *st);
    for (int i = 0; i < batch; i++) {
      keys[i] = (ecs_key_t){names[i], strlen(names[i])};
      kp[i] = (const uint8_t *)names[i];
      kl[i] = (uint16_t)strlen(names[i]);
    }
    for (int r = -1; r < o->reps && !fail; r++) { /* r = -1: warm-up */
      for (int i = 0; i < batch; i++)
        b[i] = (ecs_get_buf_t){.data = dst + (uint64_t)i * o->size, .capacity = o->size};
      double t0 = now_s();
      int rc = ecs_get_batch(c, keys, b, (size_t)batch);
      double t1 = now_s();
      for (int i = 0; i < batch; i++)
        if (rc || b[i].status != ECS_OK) {
          fprintf(stderr, "bench get %s: %s %s\n", names[i], ecs_strerror(rc ? rc : b[i].status),
                  ecs_client_errmsg(c));
          fail = 1;
          break;
        }
      uint64_t be = htobe64(o->size * (uint64_t)batch);
      double t2 = now_s();
      struct iovec iov = {&be, 8};
      int e = ecs_net_writev_all(rfd, &iov, 1, ecs_now_ms() + 60000);
      for (int i = 0; i < batch && e == ECS_OK; i++)
        e = ecs_net_read_all(rfd, dst + (uint64_t)i * o->size, o->size, ecs_now_ms() + 60000);
      double t3 = now_s();
      int lrc = ecs_meta_lookup_batch(m, kp, kl, (size_t)batch, recs, st);
      double t4 = now_s();
      if (e != ECS_OK || lrc != ECS_OK) {
        fprintf(stderr, "bench: raw read or lookup failed\n");
        fail = 1;
      }
      if (r >= 0) {
        t_get[r] = t1 - t0;
        t_raw[r] = t3 - t2;
        t_loc[r] = t4 - t3;
      }
    }
    if (!fail) {
      double gm, gl, gh, rm, rl, rh, lm, ll, lh;
      stats(t_get, o->reps, &gm, &gl, &gh);
      stats(t_raw, o->reps, &rm, &rl, &rh);
      stats(t_loc, o->reps, &lm, &ll, &lh);
      double mib = (double)o->size * batch / (1 << 20);
      printf("size=%lluKiB batch=%d reps=%d verify=%d  ecstore get %.3f ms [%.3f..%.3f] %.0f MiB/s  raw tcp "
             "%.3f ms "
             "[%.3f..%.3f] %.0f MiB/s  ratio get/raw %.2f  redis lookup %.3f ms [%.3f..%.3f] (%.1f%% of the "
             "get)\n",
             (unsigned long long)(o->size >> 10), batch, o->reps, o->verify, gm * 1e3, gl * 1e3, gh * 1e3,
             mib / gm, rm * 1e3, rl * 1e3, rh * 1e3, mib / rm, gm / rm, lm * 1e3, ll * 1e3, lh * 1e3,
             100.0 * lm / gm);
      fflush(stdout);
    }
    free(keys);
    free(b);
    free(kp);
    free(kl);
    free(recs);
    free(st);
  }
  close(rfd);
  free(names);
  free(sink);
  free(dst);
  free(t_get);
  free(t_raw);
  free(t_loc);
  ecs_meta_close(m);
  ecs_client_close(c);
  return fail;
}

/* One get of keys[0..n) into dst; 0 when every item came back. */
static int get_n(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *b, uint8_t *dst, size_t n,
                 uint64_t size) {
  for (size_t i = 0; i < n; i++)
    b[i] = (ecs_get_buf_t){.data = dst + i * size, .capacity = size};
  int rc = ecs_get_batch(c, keys, b, n);
  for (size_t i = 0; i < n && rc == ECS_OK; i++)
    rc = b[i].status;
  if (rc)
    fprintf(stderr, "spread get: %s %s\n", ecs_strerror(rc), ecs_client_errmsg(c));
  return rc;
}

static int cmd_spread(const opts_t *o) {
  ecs_client_t *c = connect_or_die(o);
  int half = o->n / 2;
  char(*n1)[64] = key_names(o->prefix, half), (*n2)[64] = key_names(o->prefix2, half);
  ecs_key_t *keys = calloc((size_t)o->n, sizeof *keys);
  ecs_get_buf_t *b = calloc((size_t)o->n, sizeof *b);
  uint8_t *dst = malloc(o->size * (uint64_t)o->n);
  double *t_one = calloc((size_t)o->reps, sizeof(double)), *t_two = calloc((size_t)o->reps, sizeof(double));
  if (!keys || !b || !dst || !t_one || !t_two || half < 1)
    return 1;
  for (int i = 0; i < half; i++) {
    keys[i] = (ecs_key_t){n1[i], strlen(n1[i])};
    keys[half + i] = (ecs_key_t){n2[i], strlen(n2[i])};
  }
  int fail = 0;
  for (int r = -1; r < o->reps && !fail; r++) { /* r = -1: warm-up */
    double t0 = now_s();
    fail |= get_n(c, keys, b, dst, (size_t)half * 2, o->size);
    double t1 = now_s();
    fail |= get_n(c, keys, b, dst, (size_t)half, o->size);
    fail |= get_n(c, keys + half, b, dst, (size_t)half, o->size);
    double t2 = now_s();
    if (r >= 0) {
      t_one[r] = t1 - t0;
      t_two[r] = t2 - t1;
    }
  }
  if (!fail) {
    double am, al, ah, bm, bl, bh;
    stats(t_one, o->reps, &am, &al, &ah);
    stats(t_two, o->reps, &bm, &bl, &bh);
    printf(
        "size=%lluKiB batch=%d over 2 servers, reps=%d  one call (groups in parallel) %.3f ms [%.3f..%.3f]  "
        "two calls in a row %.3f ms [%.3f..%.3f]  ratio %.2f\n",
        (unsigned long long)(o->size >> 10), half * 2, o->reps, am * 1e3, al * 1e3, ah * 1e3, bm * 1e3,
        bl * 1e3, bh * 1e3, am / bm);
  }
  free(n1);
  free(n2);
  free(keys);
  free(b);
  free(dst);
  free(t_one);
  free(t_two);
  ecs_client_close(c);
  return fail;
}

/* Put batches of n fresh objects with replicas 1 and with replicas K, in
 * turns (which goes first alternates rep by rep, so drift in the machine's
 * load falls on both alike); prints each one's median [p10..p90] and the
 * ratio of the medians. */
static int cmd_putbench(const opts_t *o) {
  opts_t o1 = *o, ok = *o;
  o1.replicas = 1;
  ok.replicas = o->replicas > 1 ? o->replicas : 2;
  ecs_client_t *c[2] = {connect_or_die(&o1), connect_or_die(&ok)};
  uint8_t *data = malloc(o->size * (uint64_t)o->n);
  ecs_key_t *keys = calloc((size_t)o->n, sizeof *keys);
  ecs_tensor_t *ts = calloc((size_t)o->n, sizeof *ts);
  int *st = calloc((size_t)o->n, sizeof *st);
  char(*names)[64] = calloc((size_t)o->n, 64);
  double *t[2] = {calloc((size_t)o->reps, sizeof(double)), calloc((size_t)o->reps, sizeof(double))};
  if (!data || !keys || !ts || !st || !names || !t[0] || !t[1])
    return 1;
  for (int i = 0; i < o->n; i++) {
    ts[i].data = data + (uint64_t)i * o->size;
    ts[i].nbytes = o->size;
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = o->size;
  }
  int fail = 0;
  size_t copies[2] = {0, 0};
  for (int r = -1; r < o->reps; r++) { /* rep -1 warms both clients' connections up */
    for (int k = 0; k < 2; k++) {
      int w = (r & 1) ? 1 - k : k;
      for (int i = 0; i < o->n; i++) {
        snprintf(names[i], 64, "%.30s-r%d-%d-%d", o->prefix, w, r, i);
        keys[i] = (ecs_key_t){names[i], strlen(names[i])};
        pattern(names[i], data + (uint64_t)i * o->size, o->size);
      }
      double t0 = now_s();
      int rc = ecs_put_batch(c[w], keys, ts, (size_t)o->n, st);
      double dt = now_s() - t0;
      size_t stored = 0, wanted = 0;
      ecs_client_put_copies(c[w], &stored, &wanted);
      for (int i = 0; i < o->n; i++)
        fail += rc != ECS_OK || st[i] != ECS_OK;
      if (r >= 0) {
        t[w][r] = dt;
        copies[w] += stored;
      }
    }
  }
  double med[2], lo[2], hi[2];
  for (int w = 0; w < 2; w++)
    stats(t[w], o->reps, &med[w], &lo[w], &hi[w]);
  printf(
      "put batch of %d x %llu B, %d reps: replicas 1: %.2f ms [%.2f..%.2f] (%zu copies); replicas %d: %.2f "
      "ms [%.2f..%.2f] (%zu copies); ratio %.2f; failed items %d\n",
      o->n, (unsigned long long)o->size, o->reps, med[0] * 1e3, lo[0] * 1e3, hi[0] * 1e3, copies[0],
      ok.replicas, med[1] * 1e3, lo[1] * 1e3, hi[1] * 1e3, copies[1], med[1] / med[0], fail);
  free(data);
  free(keys);
  free(ts);
  free(st);
  free(names);
  free(t[0]);
  free(t[1]);
  ecs_client_close(c[0]);
  ecs_client_close(c[1]);
  return fail ? 1 : 0;
}

static uint64_t parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k')
    v <<= 10;
  else if (*end == 'M' || *end == 'm')
    v <<= 20;
  return v;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fprintf(stderr, "usage: ecs-mh-driver put|getloop|holders|rawserve|bench [options] (see the source)\n");
    return 2;
  }
  opts_t o = {.ns = "test",
              .n = 16,
              .size = 4096,
              .rounds = 10,
              .interval_ms = 200,
              .reps = 20,
              .timeout_ms = 3000,
              .batches = "1,32",
              .verify = 1,
              .replicas = 1};
  static const struct option lo[] = {
      {"redis", 1, 0, 'r'},       {"ns", 1, 0, 's'},        {"prefix", 1, 0, 'p'},     {"prefix2", 1, 0, 'q'},
      {"placement", 1, 0, 'P'},   {"transport", 1, 0, 't'}, {"ctl", 1, 0, 'c'},        {"listen", 1, 0, 'l'},
      {"raw", 1, 0, 'w'},         {"n", 1, 0, 'n'},         {"size", 1, 0, 'z'},       {"rounds", 1, 0, 'R'},
      {"interval-ms", 1, 0, 'i'}, {"reps", 1, 0, 'e'},      {"timeout-ms", 1, 0, 'T'}, {"batches", 1, 0, 'b'},
      {"verify", 1, 0, 'v'},      {"replicas", 1, 0, 'K'},  {"secs", 1, 0, 'S'},       {0, 0, 0, 0}};
  int ch;
  optind = 2;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
    case 'r': o.redis = optarg; break;
    case 's': o.ns = optarg; break;
    case 'p': o.prefix = optarg; break;
    case 'q': o.prefix2 = optarg; break;
    case 'P': o.placement = optarg; break;
    case 't': o.transport = optarg; break;
    case 'c': o.ctl = optarg; break;
    case 'l': o.listen = optarg; break;
    case 'w': o.raw = optarg; break;
    case 'n': o.n = atoi(optarg); break;
    case 'z': o.size = parse_size(optarg); break;
    case 'R': o.rounds = atoi(optarg); break;
    case 'i': o.interval_ms = atoi(optarg); break;
    case 'e': o.reps = atoi(optarg); break;
    case 'T': o.timeout_ms = atoi(optarg); break;
    case 'b': o.batches = optarg; break;
    case 'v': o.verify = atoi(optarg) != 0; break;
    case 'K': o.replicas = atoi(optarg); break;
    case 'S': o.secs = atoi(optarg); break;
    default: return 2;
    }
  }
  /* every count and size from the command line is bounded before use */
  if (o.n < 1 || o.n > 100000 || o.size > (64ull << 20) || o.reps < 1 || o.reps > 100000 || o.rounds < 0 ||
      o.interval_ms < 0 || o.timeout_ms < 1 || o.secs < 0 || o.secs > 3600 || o.replicas < 1 ||
      o.replicas > ECS_MAX_REPLICAS || (uint64_t)o.n * o.size > (1ull << 30)) {
    fprintf(stderr, "ecs-mh-driver: option out of range\n");
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "rawserve"))
    return o.listen ? cmd_rawserve(&o) : 2;
  if (!o.redis) {
    fprintf(stderr, "ecs-mh-driver: --redis is required\n");
    return 2;
  }
  if (!strcmp(cmd, "put") && o.prefix)
    return cmd_put(&o);
  if (!strcmp(cmd, "getloop") && o.ctl)
    return cmd_getloop(&o);
  if (!strcmp(cmd, "holders") && o.prefix)
    return cmd_holders(&o);
  if (!strcmp(cmd, "spread") && o.prefix && o.prefix2)
    return cmd_spread(&o);
  if (!strcmp(cmd, "bench") && o.prefix && o.raw)
    return cmd_bench(&o);
  if (!strcmp(cmd, "rateloop") && o.prefix)
    return cmd_rateloop(&o);
  if (!strcmp(cmd, "putbench") && o.prefix)
    return cmd_putbench(&o);
  fprintf(stderr, "ecs-mh-driver: unknown command or missing option\n");
  return 2;
}
