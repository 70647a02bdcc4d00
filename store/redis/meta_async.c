/*
 * Redis metadata: the asynchronous mode (store/redis/meta.h).  Attached to
 * the server's loop: the link's up / down callbacks, the asynchronous
 * registry entry and heartbeat, event, kick, poll and tick.
 */
#include "store/redis/meta_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/net.h"

/* ---- server: the asynchronous mode ------------------------------------ */

/*
 * Attached to the server's loop, the handle never waits: records, deletes,
 * the registry, the heartbeat and the re-sync sweep are commands on alink
 * whose replies arrive as callbacks from the loop.  What each reply means
 * is the same as in the blocking code (meta_registry.c, meta_write.c,
 * meta_resync.c); the differences are who waits (nobody) and how a
 * deadline is noticed (ecs_meta_poll()).
 */

/* Every command of the asynchronous mode goes through here: queued
 * eviction deletes leave first, so that no later command overtakes them
 * (a put of a key evicted just before must find its delete done, not
 * have its fresh record deleted after it). */
int ecs__meta_acmd(ecs_meta_t *m, ecs__rdsa_fn fn, void *ctx, int argc, const char **argv,
                   const size_t *lens) {
  ecs__meta_dq_flush(m);
  return ecs__rdsa_command(&m->alink, fn, ctx, argc, argv, lens);
}

/* SCRIPT LOAD's reply: from now on deletes go as EVALSHA. */
static void meta_del_loaded(void *ctx, int rc, redisReply *reply) {
  ecs_meta_t *m = ctx;
  if (rc == ECS_OK && reply->type == REDIS_REPLY_STRING && reply->len == 40) {
    memcpy(m->del_sha, reply->str, 40);
    m->del_sha[40] = '\0';
  }
}

/* Registry entry: HSET + EXPIRE + SADD, as ecs_meta_register. */
static void meta_register_async(ecs_meta_t *m) {
  char port[16] = "0", pool[24], epoch[24], started[24], ttl[16];
  const char *colon = strrchr(m->addr, ':');
  if (colon != NULL)
    snprintf(port, sizeof port, "%s", colon + 1);
  snprintf(pool, sizeof pool, "%llu", (unsigned long long)m->pool_size);
  snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)m->epoch);
  snprintf(started, sizeof started, "%llu", (unsigned long long)m->started_ms);
  snprintf(ttl, sizeof ttl, "%d", m->ttl_ms);
  char fb[24]; /* free bytes, for clients placing puts by load */
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)(m->free_bytes ? m->free_bytes : m->pool_size));
  const char *hset[] = {"HSET", m->node_key, "addr", m->addr,   "port",  port,   "pool",
                        pool,   "epoch",     epoch,  "started", started, "free", fb};
  const char *expire[] = {"PEXPIRE", m->node_key, ttl};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  ecs__meta_async_write(m, 14, hset, NULL);
  ecs__meta_async_write(m, 3, expire, NULL);
  ecs__meta_async_write(m, 3, sadd, NULL);
}

static void meta_hb_expire_done(void *ctx, int rc, redisReply *r) {
  ecs_meta_t *m = ctx;
  m->hb_expire_ok = rc == ECS_OK && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

static void meta_hb_epoch_done(void *ctx, int rc, redisReply *r) {
  ecs_meta_t *m = ctx;
  m->hb_epoch_ok = rc == ECS_OK && ecs__meta_entry_ours(m, r);
}

/* The heartbeat's last reply: the entry is ours (and an owed re-sync may
 * start), or it was lost (register again, re-sync). */
static void meta_hb_done(void *ctx, int rc, redisReply *r) {
  ecs_meta_t *m = ctx;
  (void)r;
  m->hb_inflight = 0;
  if (!ecs__rdsa_up(&m->alink))
    return; /* the drop owes a re-sync already */
  if (rc != ECS_OK || !m->hb_expire_ok || !m->hb_epoch_ok) {
    ecs__meta_seterr(m, "registry entry lost; re-registering");
    m->resync_owed = 1;
    meta_register_async(m);
    return;
  }
  if (m->resync_owed && !m->sweeping)
    ecs__meta_sweep_start(m);
}

static void meta_heartbeat_async(ecs_meta_t *m) {
  char ttl[16];
  snprintf(ttl, sizeof ttl, "%d", m->ttl_ms);
  const char *expire[] = {"PEXPIRE", m->node_key, ttl};
  const char *hget[] = {"HMGET", m->node_key, "epoch", "addr"};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  /* free bytes, for clients placing puts by load; sent first, so that on a
   * lost entry the EXPIRE below still gives what it creates a TTL, and the
   * epoch check re-registers it whole */
  char fb[24];
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)m->free_bytes);
  const char *hset[] = {"HSET", m->node_key, "free", fb};
  m->hb_expire_ok = m->hb_epoch_ok = 0;
  ecs__meta_async_write(m, 4, hset, NULL);
  if (ecs__meta_acmd(m, meta_hb_expire_done, m, 3, expire, NULL) != ECS_OK ||
      ecs__meta_acmd(m, meta_hb_epoch_done, m, 4, hget, NULL) != ECS_OK ||
      ecs__meta_acmd(m, meta_hb_done, m, 3, sadd, NULL) != ECS_OK)
    return; /* the link is going down: nothing in flight to wait for */
  m->hb_inflight = 1;
}

/* The link is up (the handshake answered): register again, and owe a
 * re-sync, which starts once a heartbeat has found the entry ours. */
static void meta_async_up(void *ctx) {
  ecs_meta_t *m = ctx;
  m->errstr[0] = '\0';
  m->resync_owed = 1;
  m->sweeping = 0;
  const char *load[] = {"SCRIPT", "LOAD", ecs__meta_del_lua};
  m->del_sha[0] = '\0'; /* EVAL until this answers (a new node may not know the script) */
  (void)ecs__meta_acmd(m, meta_del_loaded, m, 3, load, NULL);
  if (m->want_reg)
    meta_register_async(m);
  m->hb_valid = 0; /* the next tick sends a heartbeat */
}

/* The link dropped: what was in flight is lost (its callbacks fail next). */
static void meta_async_down(void *ctx, int rc) {
  ecs_meta_t *m = ctx;
  (void)rc;
  ecs__meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
  free(m->dq); /* lost with the link: the re-sync covers them */
  m->dq = NULL;
  m->dq_cap = 0;
  m->resync_owed = 1;
  m->sweeping = 0;
  m->sweep_busy = 0;
  m->hb_inflight = 0;
  m->hb_valid = 0;
}

int ecs_meta_attach_loop(ecs_meta_t *m, int epfd) {
  if (m == NULL || !m->server || epfd < 0 || m->async)
    return ECS_EINVAL;
  char url[1024];
  if (m->link.url[0]) /* the configured URL: credentials, Sentinel */
    snprintf(url, sizeof url, "%s", m->link.url);
  else if (strchr(m->link.host, ':') != NULL)
    snprintf(url, sizeof url, "[%s]:%d/%d", m->link.host, m->link.port, m->link.db);
  else
    snprintf(url, sizeof url, "%s:%d/%d", m->link.host, m->link.port, m->link.db);
  int rc = ecs__rdsa_init(&m->alink, url, m->timeout_ms, epfd, meta_async_up, meta_async_down, m);
  if (rc != ECS_OK)
    return rc;
  ecs__rdsa_set_route(&m->alink, m->nodes_key);
  ecs__rdsa_set_auth(&m->alink, m->link.user, m->link.pass); /* resolved by the blocking link */
  ecs__rds_close(&m->link);                                  /* the blocking link rests until unregister */
  ecs__meta_queue_clear(m);
  m->async = 1;
  m->resync_owed = 1;
  m->sweeping = 0;
  m->rc_valid = 1;
  m->last_rc_ms = ecs_now_ms();
  /* Not up yet, but records may be sent already: they follow the
   * handshake.  A connect that cannot even start is retried by tick. */
  if (ecs__rdsa_connect(&m->alink) != ECS_OK)
    ecs__meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
  return ECS_OK;
}

int ecs_meta_owns(const ecs_meta_t *m, const void *p) {
  return m != NULL && m->async && ecs__rdsa_owns(&m->alink, p);
}

void ecs_meta_event(ecs_meta_t *m, uint32_t events) {
  if (m != NULL && m->async)
    ecs__rdsa_event(&m->alink, events);
}

void ecs_meta_kick(ecs_meta_t *m) {
  if (m != NULL && m->async)
    ecs__rdsa_kick(&m->alink);
}

int ecs_meta_poll(ecs_meta_t *m, uint64_t now_ms) {
  if (m == NULL || !m->async)
    return -1;
  ecs__meta_dq_flush(m); /* deletes queued outside a flush (a corrupt object dropped) */
  return ecs__rdsa_poll(&m->alink, now_ms);
}

/* ecs_meta_tick in the asynchronous mode: starts work, never waits. */
int ecs__meta_tick_async(ecs_meta_t *m, uint64_t now_ms, const ecs_meta_resync_t *rs) {
  if (rs != NULL)
    m->rs = *rs;
  if (!m->want_reg)
    return ecs__rdsa_up(&m->alink) ? ECS_OK : ECS_ENOTCONN;
  if (m->alink.state == ECS_RDSA_DOWN) {
    /* a cluster redirection is no outage: reconnect at once */
    if (m->rc_valid && !m->alink.redirected && now_ms - m->last_rc_ms < (uint64_t)m->reconnect_ms)
      return ECS_ENOTCONN;
    m->rc_valid = 1;
    m->last_rc_ms = now_ms;
    int rc = ecs__rdsa_connect(&m->alink);
    if (rc != ECS_OK)
      ecs__meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
    return ECS_ENOTCONN;
  }
  if (!ecs__rdsa_up(&m->alink))
    return ECS_ENOTCONN;
  int starting = m->resync_owed && !m->sweeping && rs != NULL;
  if (!m->hb_inflight && (starting || !m->hb_valid || now_ms - m->last_hb_ms >= ecs__meta_hb_period_ms(m))) {
    meta_heartbeat_async(m);
    m->hb_valid = 1;
    m->last_hb_ms = now_ms;
  }
  return ECS_OK;
}
