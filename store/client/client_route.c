/*
 * libecstore client: where a batch's items go, and running it there.
 *
 * A key's server is its hash over a configured servers list, or, with
 * discovery, the holders Redis lists for it (nearest first).  A batch is
 * split into one share per server; the shares run within one deadline,
 * on threads of their own when the kind of call allows it; a read tries
 * an item's other copies (replicas) when the nearest one missed or failed.
 * The calls themselves (client.c) say what a share does through an
 * ecs_cli_batch_kind_t (client_priv.h).
 */
#include "ecstore/ecstore.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "store/client/client_priv.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "store/redis/meta.h"

typedef ecs_cli_srv_t srv_t;
typedef ecs_cli_batch_kind_t batch_kind_t;

/* The server an object lives on, with a configured servers list. */
size_t ecs__cli_route(const ecs_client_t *c, const ecs_key_t *k) {
  if (c->nsrv == 1)
    return 0;
  return (size_t)(XXH3_64bits(k->data, k->len) % c->nsrv);
}

/* Items of a batch that go to server si, as indices into the caller's
 * arrays.  idx must hold n entries. */
void ecs__cli_suspect(ecs_cli_srv_t *s, int rc) {
  s->down_rc = rc;
  uint64_t ms = ECS_CLI_DOWN_MS;
  for (unsigned k = 1; k < s->fails && ms < ECS_CLI_DOWN_MAX_MS; k++)
    ms *= 2;
  if (ms > ECS_CLI_DOWN_MAX_MS)
    ms = ECS_CLI_DOWN_MAX_MS;
  s->fails++;
  s->down_until = ecs_now_ms() + ms;
  /* tell the others; and marks of it count afresh once this runs out */
  s->publish = ECS_CLI_PUB_MARK;
  s->pub_ttl_ms = (int)ms;
  s->mark_since = 0;
  s->mark_until = 0;
  s->trust_until = 0;
}

/* It answered: whatever suspicion there was (its own, or marks) is over,
 * marks of it are ignored for a while, and a mark this or another client
 * left is withdrawn. */
static void cli_answered(ecs_cli_srv_t *s) {
  uint64_t now = ecs_now_ms();
  int was = s->fails > 0 || s->mark_since != 0;
  s->fails = 0;
  s->down_until = 0;
  s->mark_until = 0;
  s->mark_since = 0;
  if (was) {
    s->trust_until = now + ECS_CLI_TRUST_MS;
    s->publish = ECS_CLI_PUB_CLEAR;
  }
}

void ecs__cli_follow_mark(ecs_cli_srv_t *s, uint64_t mark_ms, uint64_t now, uint64_t refresh_ms) {
  if (mark_ms == 0 || now < s->trust_until) {
    /* no mark (or it answered us lately): nothing to follow; a mark that
     * comes back later is followed afresh */
    s->mark_until = 0;
    s->mark_since = 0;
    return;
  }
  if (s->mark_since == 0)
    s->mark_since = now;
  /* until the next refresh can see whether it was renewed, within the cap */
  uint64_t until = now + mark_ms + refresh_ms, cap = s->mark_since + ECS_CLI_MARK_MAX_MS;
  /* past the cap, marks no longer hold it: the next call that needs it is
   * the probe, and its outcome decides (ecs__cli_suspect or cli_answered) */
  s->mark_until = until < cap ? until : cap;
}

/* Publishes what the batch's shares found out (the calling thread, after
 * the join: the Redis handle is not shared with the share threads).
 * Fire-and-forget: nothing here waits for Redis. */
static void cli_publish(ecs_client_t *c, ecs_cli_srv_t *s) {
  int what = s->publish;
  s->publish = ECS_CLI_PUB_NONE;
  if (what == ECS_CLI_PUB_NONE || !c->discover || !c->meta || !s->reg_id[0])
    return;
  /* the mark outlives the back-off by one deadline: the probe that renews
   * it (or clears it) may take that long, and a gap between two marks
   * would send every other client to probe it meanwhile */
  int ttl = s->pub_ttl_ms + c->cfg.timeout_ms;
  if (what == ECS_CLI_PUB_MARK)
    (void)ecs_meta_mark_suspect(c->meta, s->reg_id, s->reg_epoch, ttl);
  else
    (void)ecs_meta_clear_suspect(c->meta, s->reg_id);
}

/* A holder that refused or timed out is suspect for a while (issue 24: a
 * cut-off holder cost every call that touched it a connect timeout or its
 * whole deadline): with discovery its items are answered at once, without
 * a packet, as if it had failed again (misses for gets, which then try
 * their other copies; per-item statuses for remove and exists).  When the
 * suspicion runs out, the next call that needs it is the probe: one
 * share, which clears it or renews it for twice as long.  A handle is used
 * by one thread at a time and a call sends one share per server, so there
 * is one probe at a time. */
static void fail_suspect(ecs_client_t *c, size_t n, const batch_kind_t *kind, void *arg, const size_t *where,
                         size_t si) {
  ecs_cli_srv_t *s = &c->srv[si];
  uint64_t now = ecs_now_ms();
  if (!c->discover || kind->miss_when_gone == ECS_CLI_GONE_ERROR || !ecs__cli_is_suspect(s, now))
    return;
  /* own failure: as it failed; only others' marks: as a time-out (for
   * remove and exists: it may still hold the item) */
  int rc = s->down_until > now ? s->down_rc : ECS_ETIMEDOUT;
  int st = kind->miss_when_gone == ECS_CLI_GONE_ITEM && rc == ECS_ETIMEDOUT ? ECS_ETIMEDOUT : ECS_ENOTFOUND;
  for (size_t i = 0; i < n; i++)
    if (where[i] == si && kind->status(arg, i) == ECS_OK)
      kind->fail(arg, i, st);
}

static size_t pick(const size_t *where, size_t n, const batch_kind_t *kind, void *arg, size_t si,
                   size_t *idx) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (kind->status(arg, i) == ECS_OK && where[i] == si)
      idx[m++] = i;
  return m;
}

/* Where each item still OK is: by key hash over the servers list, or,
 * with discovery, where Redis says its copies are (an item with no live
 * holder is a miss: fail(ECS_ENOTFOUND)).  where must hold n *
 * ECS_CLI_MAX_COPIES entries: item i's servers, nearest first, from
 * where[i * ECS_CLI_MAX_COPIES], then ECS_CLI_NOWHERE.  An error is
 * Redis's, for the whole batch: every item still OK is given it. */
uint64_t ecs__cli_redis_until(const ecs_client_t *c) {
  uint64_t now = ecs_now_ms(), end = ecs__cli_deadline(c);
  uint64_t left = end > now ? (end - now) / 2 : 1; /* the servers keep the other half */
  if (left == 0)
    left = 1;
  return now + (left < ECS_CLI_REDIS_TIMEOUT_MS ? left : ECS_CLI_REDIS_TIMEOUT_MS);
}

void ecs__cli_redis_budget(ecs_client_t *c) {
  if (!c->meta)
    return;
  uint64_t now = ecs_now_ms(), until = ecs__cli_redis_until(c);
  /* each step at most the budget, and the whole of the Redis part too: a
   * reconnect's steps (sentinels, AUTH, SELECT, ROLE, SCRIPT LOAD) share
   * it with the command (review finding C1) */
  ecs_meta_set_timeout(c->meta, until > now ? (int)(until - now) : 1);
  ecs_meta_set_deadline(c->meta, until);
}

int ecs__cli_locate(ecs_client_t *c, const ecs_key_t *keys, size_t n, const batch_kind_t *kind, void *arg,
                    size_t *where) {
  if (!c->discover) {
    for (size_t i = 0; i < n * ECS_CLI_MAX_COPIES; i++)
      where[i] = ECS_CLI_NOWHERE;
    for (size_t i = 0; i < n; i++)
      if (kind->status(arg, i) == ECS_OK)
        where[i * ECS_CLI_MAX_COPIES] = ecs__cli_route(c, &keys[i]);
    return ECS_OK;
  }
  ecs__place_refresh(c, 0); /* a failure keeps the servers we knew */
  c->errmsg[0] = '\0';
  int *ok = malloc((n ? n : 1) * sizeof *ok);
  if (!ok)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++)
    ok[i] = kind->status(arg, i);
  int rc = ecs__place_locate(c, keys, n, ok, where);
  for (size_t i = 0; i < n; i++)
    if (ok[i] == ECS_OK && (rc != ECS_OK || where[i * ECS_CLI_MAX_COPIES] == ECS_CLI_NOWHERE))
      kind->fail(arg, i, rc != ECS_OK ? rc : ECS_ENOTFOUND);
  free(ok);
  return rc;
}

/* One server's share of a batch, run by ecs__cli_run_batch on the caller's thread
 * or on a thread of its own. */
typedef struct share_job {
  ecs_client_t *c;          /* the client, or a worker copy of it */
  srv_t *s;                 /* the server */
  size_t *idx;              /* its items */
  size_t m;                 /* their count */
  const batch_kind_t *kind; /* what to do */
  void *arg;                /* the call's arrays */
  uint64_t deadline;        /* the call's deadline */
  int rc;                   /* out: 0, or the error that failed the share */
  pthread_t tid;            /* its thread, when it has one */
  int threaded;             /* 1 when tid runs it */
} share_job_t;

/* Sends a server's items ECS_PROTO_MAX_ITEMS at a time.  A connection that
 * turns out stale (the server restarted since the last call) is re-opened
 * and the share sent once more: every request is idempotent (a removal
 * retried after it took effect reports ENOTFOUND).  When a share fails as
 * a whole, fail() gives its items, and the server's remaining ones, that
 * error; with discovery, a get's or view's items on a server that cannot
 * be reached are misses instead (the object went with its server). */
static void share_run(share_job_t *j) {
  ecs_client_t *c = j->c;
  j->rc = ECS_OK;
  for (size_t off = 0; off < j->m; off += ECS_PROTO_MAX_ITEMS) {
    size_t k = j->m - off < ECS_PROTO_MAX_ITEMS ? j->m - off : ECS_PROTO_MAX_ITEMS;
    int reused = j->s->fd >= 0;
    int rc = j->kind->share(c, j->s, j->idx + off, k, j->arg, j->deadline);
    if (rc == ECS_ECONN && reused)
      rc = j->kind->share(c, j->s, j->idx + off, k, j->arg, j->deadline);
    if (rc) {
      int gone = c->discover && (rc == ECS_ECONN || rc == ECS_ETIMEDOUT);
      int miss = gone && j->kind->miss_when_gone != ECS_CLI_GONE_ERROR;
      int item = miss ? ECS_ENOTFOUND : rc;
      if (miss && j->kind->miss_when_gone == ECS_CLI_GONE_ITEM && rc == ECS_ETIMEDOUT)
        item = ECS_ETIMEDOUT;
      for (size_t q = off; q < j->m; q++)
        j->kind->fail(j->arg, j->idx[q], item);
      if (gone)
        ecs__cli_suspect(j->s, rc);
      if (!miss)
        j->rc = rc;
      return;
    }
  }
  cli_answered(j->s);
}

static void *share_thread(void *p) {
  share_job_t *j = p;
  share_run(j);
  return NULL;
}

/* A copy of c for a worker thread: the same servers and settings, its own
 * request, reply and error buffers (every path keeps its per-call state
 * there); s is the server it may touch, in the real client. */
static ecs_client_t *worker_of(const ecs_client_t *c) {
  ecs_client_t *w = malloc(sizeof *w);
  if (!w)
    return NULL;
  *w = *c;
  w->rmeta = NULL;
  w->rmeta_cap = 0;
  ecs_wbuf_init(&w->w);
  w->errmsg[0] = '\0';
  return w;
}

static void worker_free(ecs_client_t *w) {
  if (!w)
    return;
  free(w->rmeta);
  ecs_wbuf_free(&w->w);
  free(w);
}

/* Runs a batch whose items have their first status (the checks made here)
 * server by server, within one deadline: kind->share gets each server's
 * share of the items still OK (where[i]: item i's server).  The first
 * error that failed a share is returned; other servers still run.
 *
 * With kind->parallel and more than one server in the batch, each server's
 * share runs on a thread of its own (the first on the caller's), so a
 * batch spread over several hosts costs the slowest host, not the sum.
 * Threads rather than one poll loop: every path (tcp, shm, RDMA) is a
 * sequence of blocking, deadline-bounded exchanges on its own connection,
 * which a thread runs unchanged; a thread per server costs tens of
 * microseconds against transfers of megabytes.  RDMA shares stay on the
 * caller's thread (its device context and registered buffers are shared). */
static int run_batch_until(ecs_client_t *c, size_t n, const batch_kind_t *kind, void *arg,
                           const size_t *where, uint64_t deadline) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx);
  share_job_t *jobs = calloc(c->nsrv ? c->nsrv : 1, sizeof *jobs);
  if (!idx || !jobs) {
    free(idx);
    free(jobs);
    return ECS_ENOMEM;
  }
  size_t nj = 0, used = 0;
  for (size_t si = 0; si < c->nsrv; si++) {
    fail_suspect(c, n, kind, arg, where, si);
    size_t m = pick(where, n, kind, arg, si, idx + used);
    if (m == 0)
      continue;
    jobs[nj++] = (share_job_t){
        .c = c, .s = &c->srv[si], .idx = idx + used, .m = m, .kind = kind, .arg = arg, .deadline = deadline};
    used += m;
  }
  int par = kind->parallel && nj > 1 && !c->rdma;
  /* Every copy is made before the first thread starts: a copy reads the
   * whole of c, srv[] included, which a running share writes to. */
  for (size_t k = 1; par && k < nj; k++)
    jobs[k].c = worker_of(c);
  for (size_t k = 1; par && k < nj; k++) {
    share_job_t *j = &jobs[k];
    if (j->c && pthread_create(&j->tid, NULL, share_thread, j) == 0) {
      j->threaded = 1;
      continue;
    }
    worker_free(j->c); /* no thread: run it here, after the others */
    j->c = c;
  }
  for (size_t k = 0; k < nj; k++)
    if (!jobs[k].threaded)
      share_run(&jobs[k]);
  int ret = ECS_OK;
  for (size_t k = 0; k < nj; k++) {
    share_job_t *j = &jobs[k];
    if (j->threaded) {
      pthread_join(j->tid, NULL);
      if (j->rc && !c->errmsg[0])
        snprintf(c->errmsg, sizeof c->errmsg, "%s", j->c->errmsg);
      if (j->c->next_req > c->next_req)
        c->next_req = j->c->next_req;
      worker_free(j->c);
    }
    if (j->rc && ret == ECS_OK)
      ret = j->rc;
    cli_publish(c, j->s);
  }
  free(jobs);
  free(idx);
  return ret;
}

int ecs__cli_run_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, const batch_kind_t *kind, void *arg,
                       const size_t *where) {
  (void)keys;
  return run_batch_until(c, n, kind, arg, where, ecs__cli_deadline(c));
}

/* An item status worth another copy: a miss there (evicted, or its server
 * gone), bytes that failed their checksum, or a server that failed. */
static int try_other_copy(int st) {
  return st == ECS_ENOTFOUND || st == ECS_ECHECKSUM || st == ECS_ECONN || st == ECS_ETIMEDOUT;
}

/* A located batch (where: ecs__cli_locate's n * ECS_CLI_MAX_COPIES servers) read
 * from the nearest copy of each item; an item whose copy failed or was a
 * miss goes to its next copy, round after round, within one deadline.
 * The return is the first whole-share error that some item still
 * carries at the end (ECS_OK when every such item was served by another
 * copy). */
int ecs__cli_run_nearest(ecs_client_t *c, size_t n, const batch_kind_t *kind, void *arg,
                         const size_t *where) {
  uint64_t deadline = ecs__cli_deadline(c);
  size_t *cur = malloc((n ? n : 1) * sizeof *cur);
  if (!cur)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++)
    cur[i] = where[i * ECS_CLI_MAX_COPIES];
  int ret = run_batch_until(c, n, kind, arg, cur, deadline);
  int first = ret;
  for (size_t r = 1; r < ECS_CLI_MAX_COPIES && ecs_now_ms() < deadline; r++) {
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
      size_t next = where[i * ECS_CLI_MAX_COPIES + r];
      cur[i] = ECS_CLI_NOWHERE;
      if (next == ECS_CLI_NOWHERE || !try_other_copy(kind->status(arg, i)))
        continue;
      kind->again(arg, i);
      cur[i] = next;
      more++;
    }
    if (!more)
      break;
    int rc = run_batch_until(c, n, kind, arg, cur, deadline);
    if (rc && !first)
      first = rc;
  }
  free(cur);
  ret = ECS_OK;
  for (size_t i = 0; i < n && first; i++)
    if (kind->status(arg, i) == first)
      ret = first;
  return ret;
}
