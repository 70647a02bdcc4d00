/*
 * test_pipeline_attack: hostile pipelining peers against a real
 * ecstore-server and a real redis-server (frozen with SIGSTOP where a
 * request must stay parked).  What must hold:
 *   - a peer that pipelines requests whose replies park (REMOVEs awaiting
 *     their deletes) and never reads a reply is dropped within
 *     --io-timeout-ms, like one that never reads a get's reply (its parked
 *     replies are answered, then stall on its full socket; the old server
 *     kept such a connection forever);
 *   - an honest peer whose get waits behind a put parked for Redis is not
 *     dropped as "stalled" when Redis is slower than --io-timeout-ms: the
 *     wait is the server's, not the peer's (the old server dropped it);
 *   - a slow reader with puts and gets in flight behind a frozen Redis gets
 *     every reply in request order and every byte right;
 *   - a peer that hangs up (close or reset) at any point of a pipeline with
 *     parked replies leaves the server serving, leak-free;
 *   - a get's pool references, held behind a parked put, survive an
 *     eviction that needs the whole pool: its bytes are right;
 *   - put / remove / upsert / exists of one key on one connection, parked
 *     behind a frozen Redis: answered in order, and Redis ends with the
 *     last version's record;
 *   - many pipelining connections at once, Redis frozen at first so that
 *     loop 0 answers their parked puts in one burst while their owners
 *     read and send (run with --threads 4 and under TSan as well);
 *   - a key evicted and put again in one request (one delete script call
 *     for the flush) keeps its new record, also through a NOSCRIPT retry
 *     after SCRIPT FLUSH; a record another node holds keeps its entry;
 *   - SIGTERM with replies parked behind a still-frozen Redis: a clean
 *     exit (ASan: the parked replies and their waits are freed);
 *   - a peer whose socket always holds its next request does not starve
 *     the other connections of its loop (the old server served all 50000
 *     of its queued requests before another client's STAT);
 *   - a framing error (a REMOVE short of its items, one delete already in
 *     flight) behind a parked put: the put's reply, then EPROTO, then the
 *     close; the abandoned wait is freed by its late acknowledgement.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/core/checksum.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "support/fixture.h"
#include "support/pipe.h"
#include "support/raw.h"

#define KIB 1024u
#define MIB (1024u * KIB)
#define IO_MS 15000
#define CLIENT_MS 20000

static void put_seed(ecs_client_t *c, const char *key, uint32_t seed, size_t n) {
  uint8_t *a = malloc(n);
  assert_non_null(a);
  ecs_ts_fill(a, n, seed);
  assert_int_equal(ecs_ts_put1(c, key, a, n, ECS_DTYPE_U8), ECS_OK);
  free(a);
}

/* ---- 1: a peer that pipelines and never reads is dropped ------------- */

/* REMOVEs of 4096 keys each, one of them stored (its delete is awaited,
 * so the request parks) and the rest absent: each reply is 16 KiB of
 * statuses for 12 KiB of request, so the replies, answered at once, pile
 * up unread in the socket buffers while the peer goes on sending.  The
 * server must drop the peer within --io-timeout-ms, as it drops one that
 * never reads a get's reply (test_deadlines). */
#define WIDE 4096
#define NREM 400

static void test_never_reads_parked_replies_dropped(void **state) {
  (void)state;
  const char *extra[] = {"--io-timeout-ms", "500", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  for (int q = 0; q < NREM; q++) {
    char k[24];
    snprintf(k, sizeof k, "e-%d", q);
    put_seed(e.c, k, (uint32_t)q, 8);
  }
  uint32_t base = ecs_ts_stat0(e.c).connections;
  int fd = ecs_pipe_open(&e);
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  for (int q = 0; q < NREM; q++) {
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    char k[24];
    snprintf(k, sizeof k, "e-%d", q);
    ecs_proto_key_write(&w, k, (uint16_t)strlen(k));
    for (int i = 1; i < WIDE; i++)
      ecs_proto_key_write(&w, "x", 1);
    ecs_pipe_req(&out, ECS_OP_REMOVE, 500u + (uint32_t)q, WIDE, &w, NULL, 0);
    ecs_wbuf_free(&w);
  }
  assert_int_equal(out.err, ECS_OK);
  ecs_pipe_sender_t sd = {.fd = fd, .out = &out};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, ecs_pipe_send_run, &sd), 0);
  /* never read: the server must drop us (allow for load: 20x the
   * timeout).  Reading would unblock the server: STAT's count tells. */
  uint64_t t0 = ecs_now_ms();
  uint32_t conns = base + 1;
  while (conns > base && ecs_now_ms() - t0 < 10000) {
    usleep(50000);
    conns = ecs_ts_stat0(e.c).connections;
  }
  shutdown(fd, SHUT_RDWR); /* ends the sender either way */
  pthread_join(th, NULL);
  if (conns > base)
    fail_msg("a peer that never reads its replies was still connected after %llu ms",
             (unsigned long long)(ecs_now_ms() - t0));
  /* and it served on */
  uint8_t b[64];
  put_seed(e.c, "after-wide", 7, sizeof b);
  assert_int_equal(ecs_ts_get1(e.c, "after-wide", b, sizeof b, NULL), ECS_OK);
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 2: a get behind a put parked longer than --io-timeout-ms -------- */

static void test_get_behind_slow_redis_not_dropped(void **state) {
  (void)state;
  const char *extra[] = {"--io-timeout-ms", "400", "--redis-timeout-ms", "2000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  put_seed(e.c, "base", 11, 64 * KIB);
  int fd = ecs_pipe_open(&e);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  ecs_pipe_put(&out, 600, "slow-put", 12, 4 * KIB, 0);
  ecs_pipe_get(&out, 601, "base", 64 * KIB);
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  /* the peer reads at once and waits: the server, not the peer, is slow
   * (Redis answers nothing for 2 s); it must not be dropped as stalled */
  assert_int_equal(ecs_pipe_reply(fd, ECS_OP_PUT, 600, 0, 0), ECS_EREDIS);
  assert_int_equal(ecs_pipe_reply(fd, ECS_OP_GET, 601, 11, 64 * KIB), ECS_OK);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 3: a slow reader with puts and gets behind a frozen Redis ------- */

#define MIX 40
#define OBJ (64 * KIB)

static void test_slow_reader_frozen_redis(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "10000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  put_seed(e.c, "base", 21, OBJ);
  /* (no tiny SO_RCVBUF here: on loopback a receive window below one
   * segment stalls TCP itself for seconds, whatever the server does) */
  int fd = ecs_pipe_open(&e);
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  uint8_t ops[3 * MIX];
  uint32_t seeds[3 * MIX];
  int nreq = 0;
  for (int i = 0; i < MIX; i++) {
    char k[16];
    snprintf(k, sizeof k, "sr-%d", i);
    ecs_pipe_put(&out, 1000u + (uint32_t)nreq, k, 2000u + (uint32_t)i, OBJ, 0);
    ops[nreq] = ECS_OP_PUT;
    seeds[nreq++] = 0;
    ecs_pipe_get(&out, 1000u + (uint32_t)nreq, "base", OBJ);
    ops[nreq] = ECS_OP_GET;
    seeds[nreq++] = 21;
    ecs_pipe_get(&out, 1000u + (uint32_t)nreq, k, OBJ);
    ops[nreq] = ECS_OP_GET;
    seeds[nreq++] = 2000u + (uint32_t)i;
  }
  assert_int_equal(out.err, ECS_OK);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_pipe_sender_t sd = {.fd = fd, .out = &out};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, ecs_pipe_send_run, &sd), 0);
  usleep(300000); /* nothing read: the first put parked, its get waits */
  uint8_t *b = malloc(OBJ);
  assert_int_equal(ecs_ts_get1(e.c, "base", b, OBJ, NULL), ECS_OK); /* others are served */
  free(b);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  usleep(200000); /* replies answered, piling up unread in our tiny buffer */
  for (int q = 0; q < nreq; q++)
    assert_int_equal(ecs_pipe_reply(fd, ops[q], 1000u + (uint32_t)q, seeds[q], OBJ), ECS_OK);
  pthread_join(th, NULL);
  assert_int_equal(sd.rc, ECS_OK);
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 4: hang-ups at every point of a pipeline ------------------------- */

/* A pipeline: put, get, put, remove, upsert, get (keys per round).  The
 * peer sends a prefix of it cut at each request's start, inside its
 * header, inside its records and inside its payload, then closes (or
 * resets) with replies parked behind a frozen Redis. */
static void hang_stream(ecs_wbuf_t *out, size_t *cuts, int *ncut, int round) {
  char k0[32], k1[32];
  snprintf(k0, sizeof k0, "hang-%d-a", round);
  snprintf(k1, sizeof k1, "hang-%d-b", round);
  size_t start[8];
  int n = 0;
  start[n++] = out->len;
  ecs_pipe_put(out, 1, k0, 31, 16 * KIB, 0);
  start[n++] = out->len;
  ecs_pipe_get(out, 2, "base", OBJ);
  start[n++] = out->len;
  ecs_pipe_put(out, 3, k1, 32, 16 * KIB, 0);
  start[n++] = out->len;
  ecs_pipe_key(out, ECS_OP_REMOVE, 4, k0);
  start[n++] = out->len;
  ecs_pipe_put(out, 5, k1, 33, 16 * KIB, ECS_PUT_F_UPSERT);
  start[n++] = out->len;
  ecs_pipe_get(out, 6, k1, 16 * KIB);
  start[n] = out->len;
  *ncut = 0;
  for (int i = 0; i < n; i++) {
    size_t len = start[i + 1] - start[i];
    cuts[(*ncut)++] = start[i];
    cuts[(*ncut)++] = start[i] + 10; /* inside the header */
    if (len > ECS_PROTO_HDR_SIZE + 8)
      cuts[(*ncut)++] = start[i] + ECS_PROTO_HDR_SIZE + 8; /* inside the records */
    if (len > 4 * KIB)
      cuts[(*ncut)++] = start[i] + len - 1000; /* inside the payload */
  }
  cuts[(*ncut)++] = start[n]; /* everything */
}

static void test_hangup_everywhere(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "3000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  put_seed(e.c, "base", 41, OBJ);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  int round = 0;
  for (int reset = 0; reset < 2; reset++) {
    ecs_wbuf_t probe;
    ecs_wbuf_init(&probe);
    size_t cuts[40];
    int ncut;
    hang_stream(&probe, cuts, &ncut, 0);
    ecs_wbuf_free(&probe);
    for (int ci = 0; ci < ncut; ci++, round++) {
      ecs_wbuf_t out;
      ecs_wbuf_init(&out);
      size_t c2[40];
      int n2;
      hang_stream(&out, c2, &n2, round);
      int fd = ecs_pipe_open(&e);
      if (c2[ci] > 0)
        assert_int_equal(ecs_ts_raw_send(fd, out.p, c2[ci]), ECS_OK);
      usleep(20000); /* the server reads what came, parks what it can */
      if (reset) {
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
      }
      close(fd);
      ecs_wbuf_free(&out);
    }
  }
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  /* the server serves on, and every hung-up connection is gone */
  uint8_t b[OBJ / 16];
  int ok = 0;
  for (int i = 0; i < 100 && !ok; i++) {
    ok = ecs_ts_put1(e.c, "after", b, sizeof b, ECS_DTYPE_U8) == ECS_OK;
    if (!ok)
      usleep(100000);
  }
  assert_true(ok);
  uint32_t conns = 0;
  for (int i = 0; i < 100; i++) {
    conns = ecs_ts_stat0(e.c).connections;
    if (conns <= 2)
      break;
    usleep(50000);
  }
  assert_true(conns <= 2);                   /* e.c and e.cr */
  assert_int_equal(ecs_ts_env_close(&e), 0); /* clean exit: nothing leaked (ASan) */
}

/* ---- 5: a get's references behind a parked put, under eviction -------- */

static void test_get_refs_survive_eviction(void **state) {
  (void)state;
  const char *extra[] = {
      "--pool-size", "16M", "--high-watermark", "1.0", "--low-watermark", "0.9", "--redis-timeout-ms",
      "10000",       NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  put_seed(e.c, "victim", 51, 4 * MIB);
  int fd = ecs_pipe_open(&e);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  ecs_pipe_put(&out, 700, "parker", 52, 4 * KIB, 0);
  ecs_pipe_get(&out, 701, "victim", 4 * MIB);
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  for (int i = 0; i < 200 && !ecs_pipe_stored(e.c, "parker"); i++)
    usleep(10000);
  usleep(100000); /* the get is read and holds victim's block, behind the parked put */
  /* another peer fills the pool: everything evictable goes */
  int fd2 = ecs_pipe_open(&e);
  ecs_wbuf_t out2;
  ecs_wbuf_init(&out2);
  for (uint32_t i = 0; i < 4; i++) {
    char k[16];
    snprintf(k, sizeof k, "filler-%u", i);
    ecs_pipe_put(&out2, 800 + i, k, 60 + i, 4 * MIB - 64 * KIB, 0);
  }
  ecs_pipe_sender_t sd = {.fd = fd2, .out = &out2};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, ecs_pipe_send_run, &sd), 0);
  usleep(300000);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  assert_int_equal(ecs_pipe_reply(fd, ECS_OP_PUT, 700, 0, 0), ECS_OK);
  assert_int_equal(ecs_pipe_reply(fd, ECS_OP_GET, 701, 51, 4 * MIB), ECS_OK); /* the right bytes */
  pthread_join(th, NULL);
  assert_int_equal(sd.rc, ECS_OK);
  for (uint32_t i = 0; i < 4; i++) {
    int st = ecs_pipe_reply(fd2, ECS_OP_PUT, 800 + i, 0, 0);
    assert_true(st == ECS_OK || st == ECS_ENOSPC);
  }
  ecs_wbuf_free(&out);
  ecs_wbuf_free(&out2);
  close(fd);
  close(fd2);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 6: put / remove / upsert / exists of one key on one connection --- */

static void test_one_key_mix(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "10000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  int fd = ecs_pipe_open(&e);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  const size_t n = 8 * KIB;
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  struct {
    uint8_t op;
    int want;
    uint32_t seed;
  } q[16];
  int nq = 0;
#define Q(o, w, s) (q[nq].op = (o), q[nq].want = (w), q[nq].seed = (s), nq++)
  ecs_pipe_put(&out, 1u + (uint32_t)nq, "k", 71, n, 0), Q(ECS_OP_PUT, ECS_OK, 0);
  ecs_pipe_get(&out, 1u + (uint32_t)nq, "k", n), Q(ECS_OP_GET, ECS_OK, 71);
  ecs_pipe_key(&out, ECS_OP_REMOVE, 1u + (uint32_t)nq, "k"), Q(ECS_OP_REMOVE, ECS_OK, 0);
  ecs_pipe_get(&out, 1u + (uint32_t)nq, "k", n), Q(ECS_OP_GET, ECS_ENOTFOUND, 0);
  ecs_pipe_put(&out, 1u + (uint32_t)nq, "k", 72, n, 0), Q(ECS_OP_PUT, ECS_OK, 0);
  ecs_pipe_put(&out, 1u + (uint32_t)nq, "k", 73, n, 0), Q(ECS_OP_PUT, ECS_ECONFLICT, 0);
  ecs_pipe_put(&out, 1u + (uint32_t)nq, "k", 73, n, ECS_PUT_F_UPSERT), Q(ECS_OP_PUT, ECS_OK, 0);
  ecs_pipe_get(&out, 1u + (uint32_t)nq, "k", n), Q(ECS_OP_GET, ECS_OK, 73);
  ecs_pipe_key(&out, ECS_OP_EXISTS, 1u + (uint32_t)nq, "k"), Q(ECS_OP_EXISTS, ECS_OK, 0);
  ecs_pipe_put(&out, 1u + (uint32_t)nq, "k2", 74, n, 0), Q(ECS_OP_PUT, ECS_OK, 0);
  ecs_pipe_key(&out, ECS_OP_REMOVE, 1u + (uint32_t)nq, "k2"), Q(ECS_OP_REMOVE, ECS_OK, 0);
  ecs_pipe_key(&out, ECS_OP_REMOVE, 1u + (uint32_t)nq, "k2"), Q(ECS_OP_REMOVE, ECS_ENOTFOUND, 0);
  ecs_pipe_put(&out, 1u + (uint32_t)nq, "k2", 75, n, 0), Q(ECS_OP_PUT, ECS_OK, 0);
#undef Q
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  usleep(300000); /* all of it run, the Redis commands queued behind the freeze */
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  for (int i = 0; i < nq; i++)
    assert_int_equal(ecs_pipe_reply(fd, q[i].op, 1u + (uint32_t)i, q[i].seed, n), q[i].want);
  /* Redis holds the last version of each: k's record has the upsert's sum */
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  assert_int_equal(ecs_ts_redis_exists(r, "k"), 1);
  assert_int_equal(ecs_ts_redis_exists(r, "k2"), 1);
  uint8_t *a = malloc(n);
  ecs_ts_fill(a, n, 73);
  char want[24];
  snprintf(want, sizeof want, "%016llx", (unsigned long long)ecs_checksum(a, n));
  free(a);
  redisReply *rep = redisCommand(r, "HGET ecs:{test}:obj:k csum");
  assert_non_null(rep);
  assert_int_equal(rep->type, REDIS_REPLY_STRING);
  assert_string_equal(rep->str, want);
  freeReplyObject(rep);
  redisFree(r);
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 7: many pipelining connections at once --------------------------- */

#define NCONN 8
#define PER 20

typedef struct peer {
  const ecs_ts_env_t *e;
  int idx;
  int ok;
} peer_t;

static void *peer_run(void *p) {
  peer_t *pr = p;
  int fd = -1;
  if (ecs_ts_raw_open(ecs_pipe_port(pr->e), "test", &fd) != ECS_OK)
    return NULL;
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  for (int i = 0; i < PER; i++) {
    char k[32], prev[32];
    snprintf(k, sizeof k, "mc-%d-%d", pr->idx, i);
    snprintf(prev, sizeof prev, "mc-%d-%d", pr->idx, i / 2);
    ecs_pipe_put(&out, (uint32_t)(3 * i), k, (uint32_t)(pr->idx * 1000 + i), 16 * KIB, 0);
    ecs_pipe_get(&out, (uint32_t)(3 * i + 1), k, 16 * KIB);
    ecs_pipe_key(&out, ECS_OP_EXISTS, (uint32_t)(3 * i + 2), prev);
  }
  ecs_pipe_sender_t sd = {.fd = fd, .out = &out};
  pthread_t th;
  if (pthread_create(&th, NULL, ecs_pipe_send_run, &sd) == 0) {
    int ok = 1;
    for (int i = 0; i < PER && ok; i++) {
      ok = ecs_pipe_reply_ok(fd, ECS_OP_PUT, (uint32_t)(3 * i), 0, 0);
      ok = ok &&
           ecs_pipe_reply_ok(fd, ECS_OP_GET, (uint32_t)(3 * i + 1), (uint32_t)(pr->idx * 1000 + i), 16 * KIB);
      ok = ok && ecs_pipe_reply_ok(fd, ECS_OP_EXISTS, (uint32_t)(3 * i + 2), 0, 0);
    }
    pthread_join(th, NULL);
    pr->ok = ok && sd.rc == ECS_OK;
  }
  ecs_wbuf_free(&out);
  close(fd);
  return NULL;
}

static void test_many_connections(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "10000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  peer_t pr[NCONN];
  pthread_t th[NCONN];
  /* Redis frozen at first: every connection parks its first puts, and
   * loop 0 answers them all at once when it thaws, while their owners
   * (other loops with --threads 4) read and send */
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  for (int i = 0; i < NCONN; i++) {
    pr[i] = (peer_t){.e = &e, .idx = i};
    assert_int_equal(pthread_create(&th[i], NULL, peer_run, &pr[i]), 0);
  }
  usleep(300000);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  for (int i = 0; i < NCONN; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < NCONN; i++)
    assert_true(pr[i].ok);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 8: a key evicted and put again in the same request ---------------- */

/* One PUT of two items into a full pool: the first evicts k_a (the
 * oldest), the second is k_a again and evicts k_b.  Both deletes leave in
 * the request's one script call, before k_a's new record: k_a's record
 * must survive, k_b's go.  Then the same after SCRIPT FLUSH (the NOSCRIPT
 * retry must not delete the new record either).  A record another node
 * also holds (an h: field of its own) keeps that holder's entry. */
static void put2_add(ecs_wbuf_t *out, uint32_t id, const char *k0, uint32_t s0, const char *k1, uint32_t s1,
                     size_t n) {
  uint8_t *a = malloc(2 * n);
  assert_non_null(a);
  ecs_ts_fill(a, n, s0);
  ecs_ts_fill(a + n, n, s1);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  const char *k[2] = {k0, k1};
  for (int i = 0; i < 2; i++) {
    ecs_put_item_t it = {.key = (const uint8_t *)k[i],
                         .key_len = (uint16_t)strlen(k[i]),
                         .nbytes = n,
                         .raw_nbytes = n,
                         .checksum = ecs_checksum(a + (size_t)i * n, n)};
    it.desc.dtype = ECS_DTYPE_U8;
    it.desc.ndim = 1;
    it.desc.shape[0] = n;
    ecs_proto_put_item_write(&w, &it);
  }
  ecs_pipe_req(out, ECS_OP_PUT, id, 2, &w, a, 2 * n);
  ecs_wbuf_free(&w);
  free(a);
}

/* Waits (3 s at most) until HEXISTS of field in key's record is want. */
static long long field_settles(redisContext *r, const char *key, const char *field, long long want) {
  long long v = -1;
  for (int i = 0; i < 60; i++) {
    redisReply *rep = redisCommand(r, "HEXISTS ecs:{test}:obj:%s %s", key, field);
    v = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    freeReplyObject(rep);
    if (v == want)
      break;
    usleep(50000);
  }
  return v;
}

/* Prints what Redis holds for key and the calls it has run, for a failure
 * that needs explaining. */
static void dump_redis(redisContext *r, const char *key) {
  redisReply *a = redisCommand(r, "HGETALL ecs:{test}:obj:%s", key);
  fprintf(stderr, "HGETALL %s:", key);
  for (size_t i = 0; a && a->type == REDIS_REPLY_ARRAY && i < a->elements; i++)
    fprintf(stderr, " %s", a->element[i]->str ? a->element[i]->str : "?");
  fprintf(stderr, "\n");
  freeReplyObject(a);
  redisReply *b = redisCommand(r, "INFO commandstats");
  if (b && b->type == REDIS_REPLY_STRING)
    fprintf(stderr, "%s\n", b->str);
  freeReplyObject(b);
}

/* Puts k0 (evicting the oldest) and k1 (= the oldest, put again) in one
 * request over fd; both answered OK. */
static void evict_and_reput(int fd, uint32_t id, const char *k0, uint32_t s0, const char *k1, uint32_t s1) {
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  put2_add(&out, id, k0, s0, k1, s1, 4 * MIB);
  assert_int_equal(out.err, ECS_OK);
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  uint8_t hb[ECS_PROTO_HDR_SIZE], meta[16];
  assert_int_equal(ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + IO_MS), ECS_OK);
  ecs_hdr_t h;
  assert_int_equal(ecs_proto_hdr_decode(hb, UINT64_MAX, &h), ECS_OK);
  assert_int_equal(h.req_id, id);
  assert_int_equal(h.count, 2);
  assert_true(h.meta_len <= sizeof meta);
  assert_int_equal(ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + IO_MS), ECS_OK);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  for (int i = 0; i < 2; i++) {
    int32_t st;
    assert_int_equal(ecs_proto_status_read(&r, &st), ECS_OK);
    assert_int_equal(st, ECS_OK);
  }
  ecs_wbuf_free(&out);
}

static void test_evict_and_reput_one_request(void **state) {
  (void)state;
  int mport = ecs_ts_free_port();
  char mlisten[32];
  snprintf(mlisten, sizeof mlisten, "127.0.0.1:%d", mport);
  const char *extra[] = {
      "--pool-size", "16M", "--high-watermark", "1", "--low-watermark", "1", "--metrics-listen",
      mlisten,       NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  char me[80];
  snprintf(me, sizeof me, "h:%s", e.servers); /* the node id: its listen address */
  for (int i = 0; i < 4; i++) {               /* fills the pool */
    char k[16];
    snprintf(k, sizeof k, "full-%d", i);
    put_seed(e.c, k, 90u + (uint32_t)i, 4 * MIB);
  }
  assert_int_equal(field_settles(r, "full-3", me, 1), 1);
  /* The start-up re-sync sweep must be through first: it rightly drops a
   * holder entry whose node is not registered, as the made-up one below
   * (under a CPU hog it ran after it, 6 times in a row). */
  for (int i = 0; i < 200 && ecs_ts_metric(mport, "ecstore_redis_resync_pending") != 0; i++)
    usleep(50000);
  assert_true(ecs_ts_metric(mport, "ecstore_redis_resync_pending") == 0);
  /* full-1 is also held by another node: its entry must stay */
  freeReplyObject(redisCommand(r, "HSET ecs:{test}:obj:full-1 h:other-node 1"));
  int fd = ecs_pipe_open(&e);
  uint64_t ev0 = ecs_ts_stat0(e.c).evictions;
  evict_and_reput(fd, 1, "new-0", 95, "full-0", 90); /* evicts full-0 and full-1 */
  assert_int_equal(ecs_ts_stat0(e.c).evictions - ev0, 2);
  assert_int_equal(field_settles(r, "full-1", me, 0), 0); /* our entry went... */
  if (field_settles(r, "full-1", "h:other-node", 1) != 1) /* say what Redis holds and ran */
    dump_redis(r, "full-1");
  assert_int_equal(field_settles(r, "full-1", "h:other-node", 1), 1); /* ...the other holder's stayed */
  assert_int_equal(ecs_ts_redis_exists(r, "full-0"), 1);              /* put again: its new record stays */
  assert_int_equal(field_settles(r, "full-0", me, 1), 1);
  /* Redis forgets the delete script: the retry deletes only what we do
   * not hold again */
  freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
  evict_and_reput(fd, 2, "new-1", 96, "full-2", 92); /* evicts full-2 and full-3 */
  assert_int_equal(field_settles(r, "full-3", me, 0), 0);
  assert_int_equal(ecs_ts_redis_exists(r, "full-3"), 0);
  usleep(200000); /* a late, wrong retry would land by now */
  assert_int_equal(ecs_ts_redis_exists(r, "full-2"), 1);
  assert_int_equal(field_settles(r, "full-2", me, 1), 1);
  assert_int_equal(ecs_ts_redis_exists(r, "full-0"), 1);
  uint8_t *b = malloc(4 * MIB), *want = malloc(4 * MIB);
  assert_int_equal(ecs_ts_get1(e.c, "full-2", b, 4 * MIB, NULL), ECS_OK);
  ecs_ts_fill(want, 4 * MIB, 92);
  assert_memory_equal(b, want, 4 * MIB);
  free(b);
  free(want);
  close(fd);
  redisFree(r);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 9: the server stops with replies parked behind a frozen Redis ---- */

static void test_stop_with_parked(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "2000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  put_seed(e.c, "base", 81, OBJ);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  int fd[3];
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  for (uint32_t i = 0; i < 10; i++) { /* 8 parked, a get built behind them, one unread */
    char k[16];
    snprintf(k, sizeof k, "stop-%u", i);
    ecs_pipe_put(&out, i, k, 82 + i, 16 * KIB, 0);
    if (i == 2)
      ecs_pipe_get(&out, 100, "base", OBJ);
  }
  for (int i = 0; i < 3; i++) {
    fd[i] = ecs_pipe_open(&e);
    /* the third stops in the middle of a payload */
    size_t n = i < 2 ? out.len : ECS_PROTO_HDR_SIZE + 200;
    assert_int_equal(ecs_ts_raw_send(fd[i], out.p, n), ECS_OK);
  }
  for (int i = 0; i < 200 && !ecs_pipe_stored(e.c, "stop-1"); i++)
    usleep(10000);
  usleep(100000);
  /* SIGTERM with Redis still frozen (the fixture continues it with the
   * server's signal): a clean exit, nothing leaked (ASan), within 5 s */
  int st = ecs_ts_env_close(&e);
  for (int i = 0; i < 3; i++)
    close(fd[i]);
  ecs_wbuf_free(&out);
  assert_int_equal(st, 0);
}

/* ---- 10: one pipelining peer cannot starve its loop's other peers ----- */

/* A peer A has a long run of requests (gets of an absent key) waiting in
 * its socket, and drains the replies, so that neither reading nor
 * writing ever blocks the server on it.  Served request after request in
 * one readiness event, A would hold its loop (with --threads 1 every
 * other connection, the Redis link and the timers) until its whole run is
 * done: a STAT sent meanwhile by another client would see every one of
 * A's misses counted.  Served fairly, the STAT is answered after a few of
 * them.  The server is stopped (SIGSTOP) while both are queued, so that
 * both are ready when it goes on: what is measured is the order of
 * service, not a time. */
#define FLOOD 50000

typedef struct flood {
  int fd;
  const ecs_wbuf_t *out;
  int rc;
} flood_t;

static void *flood_recv(void *p) {
  flood_t *f = p;
  static uint8_t buf[1 << 16];
  for (;;) {
    ssize_t n = recv(f->fd, buf, sizeof buf, 0);
    if (n > 0)
      continue;
    if (n < 0 && errno == EINTR)
      continue;
    return NULL; /* closed (or the receive timeout: the flood is over) */
  }
}

typedef struct stat_call {
  ecs_client_t *c;
  ecs_server_stat_t st;
} stat_call_t;

static void *stat_run(void *p) {
  stat_call_t *sc = p;
  sc->st = ecs_ts_stat0(sc->c);
  return NULL;
}

static void test_flood_does_not_starve_others(void **state) {
  (void)state;
  const char *extra[] = {"--threads", "1", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  ecs_client_t *victim = ecs_ts_client(e.servers, NULL, NULL, 10000);
  assert_non_null(victim);
  uint64_t m0 = ecs_ts_stat0(victim).misses;
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  for (uint32_t i = 0; i < FLOOD; i++)
    ecs_pipe_get(&out, i, "absent", 16);
  assert_int_equal(out.err, ECS_OK);
  flood_t f = {.fd = ecs_pipe_open(&e), .out = &out};
  struct timeval tv = {2, 0};
  setsockopt(f.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  assert_int_equal(ecs_ts_signal(&e.server, SIGSTOP), 0);
  ecs_pipe_sender_t sd = {.fd = f.fd, .out = &out};
  pthread_t ts, tr, tv_;
  assert_int_equal(pthread_create(&ts, NULL, ecs_pipe_send_run, &sd), 0);
  assert_int_equal(pthread_create(&tr, NULL, flood_recv, &f), 0);
  usleep(200000); /* A's run is in its socket... */
  stat_call_t sc = {.c = victim};
  assert_int_equal(pthread_create(&tv_, NULL, stat_run, &sc), 0);
  usleep(200000); /* ...and then the victim's STAT */
  assert_int_equal(ecs_ts_signal(&e.server, SIGCONT), 0);
  pthread_join(tv_, NULL);
  pthread_join(ts, NULL);
  uint64_t all = 0; /* and then all of A's are served */
  for (int i = 0; i < 300 && all < FLOOD; i++) {
    all = ecs_ts_stat0(victim).misses - m0;
    if (all < FLOOD)
      usleep(50000);
  }
  shutdown(f.fd, SHUT_RDWR);
  pthread_join(tr, NULL);
  close(f.fd);
  uint64_t before = sc.st.misses - m0;
  fprintf(stderr, "A's requests served before the victim's STAT: %llu of %d\n", (unsigned long long)before,
          FLOOD);
  assert_int_equal(sd.rc, ECS_OK);
  assert_true(before < FLOOD / 2);
  assert_int_equal(all, FLOOD);
  ecs_wbuf_free(&out);
  ecs_client_close(victim);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 11: a framing error behind parked replies ------------------------- */

/* Behind a put parked on a frozen Redis: a REMOVE whose first key is
 * stored (its delete goes out, awaited) and whose second item is missing
 * (the request claims 2).  The remove's wait is abandoned with a delete in
 * flight; the EPROTO reply leaves after the put's, then the server
 * closes; the late delete acknowledgement frees the wait (ASan). */
static void test_bad_request_behind_parked(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "10000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  put_seed(e.c, "doomed", 111, 4 * KIB);
  int fd = ecs_pipe_open(&e);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_wbuf_t out, w;
  ecs_wbuf_init(&out);
  ecs_wbuf_init(&w);
  ecs_pipe_put(&out, 1, "parked-b", 112, 4 * KIB, 0);
  ecs_proto_key_write(&w, "doomed", 6);
  ecs_pipe_req(&out, ECS_OP_REMOVE, 2, 2, &w, NULL, 0); /* claims 2 keys, holds 1 */
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  usleep(300000);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  assert_int_equal(ecs_pipe_reply(fd, ECS_OP_PUT, 1, 0, 0), ECS_OK);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  assert_int_equal(ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + IO_MS), ECS_OK);
  ecs_hdr_t h;
  assert_int_equal(ecs_proto_hdr_decode(hb, UINT64_MAX, &h), ECS_OK);
  assert_int_equal(h.req_id, 2);
  assert_int_equal(h.status, ECS_EPROTO);
  assert_true(ecs_ts_raw_wait_close(fd, 5000) >= 0); /* then it closes */
  close(fd);
  assert_false(ecs_pipe_stored(e.c, "doomed")); /* the first key was removed */
  ecs_wbuf_free(&w);
  ecs_wbuf_free(&out);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_never_reads_parked_replies_dropped),
      cmocka_unit_test(test_get_behind_slow_redis_not_dropped),
      cmocka_unit_test(test_slow_reader_frozen_redis),
      cmocka_unit_test(test_hangup_everywhere),
      cmocka_unit_test(test_get_refs_survive_eviction),
      cmocka_unit_test(test_one_key_mix),
      cmocka_unit_test(test_many_connections),
      cmocka_unit_test(test_evict_and_reput_one_request),
      cmocka_unit_test(test_stop_with_parked),
      cmocka_unit_test(test_flood_does_not_starve_others),
      cmocka_unit_test(test_bad_request_behind_parked),
  };
  return cmocka_run_group_tests_name("pipeline_attack", tests, NULL, NULL) ? 1 : 0;
}
