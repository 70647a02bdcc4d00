/*
 * Redis metadata: the node registry (store/redis/meta.h).  Register, the
 * blocking heartbeat, the nodes listing and unregister; the asynchronous
 * heartbeat is meta_async.c.
 */
#include "store/redis/meta_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/net.h"

/* ---- server: registry ------------------------------------------------- */

int ecs_meta_register(ecs_meta_t *m) {
  if (m == NULL || !m->server)
    return ECS_EINVAL;
  m->want_reg = 1;
  int rc = ecs__meta_connect(m);
  if (rc != ECS_OK)
    return rc;
  char port[16] = "0", pool[24], epoch[24], started[24], ttl[16];
  const char *colon = strrchr(m->addr, ':');
  if (colon != NULL)
    snprintf(port, sizeof port, "%s", colon + 1);
  snprintf(pool, sizeof pool, "%llu", (unsigned long long)m->pool_size);
  snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)m->epoch);
  snprintf(started, sizeof started, "%llu", (unsigned long long)m->started_ms);
  snprintf(ttl, sizeof ttl, "%d", m->ttl_ms);
  char fb[24];
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)(m->free_bytes ? m->free_bytes : m->pool_size));
  const char *hset[] = {"HSET", m->node_key, "addr", m->addr,   "port",  port,   "pool",
                        pool,   "epoch",     epoch,  "started", started, "free", fb};
  const char *expire[] = {"PEXPIRE", m->node_key, ttl};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  const char **cmds[] = {hset, expire, sadd};
  const int argcs[] = {14, 3, 3};
  for (int i = 0; i < 3; i++) {
    size_t lens[14];
    for (int j = 0; j < argcs[i]; j++)
      lens[j] = strlen(cmds[i][j]);
    rc = ecs__meta_append(m, argcs[i], cmds[i], lens);
    if (rc != ECS_OK)
      return rc;
  }
  uint64_t deadline = ecs__meta_deadline(m);
  for (int i = 0; i < 3; i++) {
    redisReply *r;
    int e = ecs__meta_reply(m, &r, deadline);
    if (e != ECS_OK)
      return e;
    e = ecs__meta_reply_err(m, r, "register");
    freeReplyObject(r);
    if (e != ECS_OK && rc == ECS_OK)
      rc = e;
  }
  return rc;
}

int ecs__meta_entry_ours(const ecs_meta_t *m, const redisReply *r) {
  char epoch[24];
  int n = snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)m->epoch);
  size_t al = strlen(m->addr);
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
    return 0;
  const redisReply *e = r->element[0], *a = r->element[1];
  return e->type == REDIS_REPLY_STRING && e->len == (size_t)n && memcmp(e->str, epoch, (size_t)n) == 0 &&
         a->type == REDIS_REPLY_STRING && a->len == al && memcmp(a->str, m->addr, al) == 0;
}

/* Heartbeat: refresh the TTL, check that the entry is still ours, and keep
 * the id in the nodes set (ecs_meta_nodes() tidies out dead ids). */
int ecs__meta_heartbeat(ecs_meta_t *m) {
  char ttl[16];
  snprintf(ttl, sizeof ttl, "%d", m->ttl_ms);
  const char *expire[] = {"PEXPIRE", m->node_key, ttl};
  const char *hget[] = {"HMGET", m->node_key, "epoch", "addr"};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  char fb[24]; /* free bytes, for clients placing puts by load (HSET on a lost entry is harmless:
                  the check below registers again) */
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)m->free_bytes);
  const char *hset[] = {"HSET", m->node_key, "free", fb};
  size_t el[] = {7, strlen(m->node_key), strlen(ttl)};
  size_t hl[] = {5, strlen(m->node_key), 5, 4};
  size_t sl[] = {4, strlen(m->nodes_key), strlen(m->node_id)};
  size_t fl[] = {4, strlen(m->node_key), 4, strlen(fb)};
  int arc = ecs__meta_append(m, 3, expire, el);
  if (arc == ECS_OK)
    arc = ecs__meta_append(m, 4, hget, hl);
  if (arc == ECS_OK)
    arc = ecs__meta_append(m, 3, sadd, sl);
  if (arc == ECS_OK)
    arc = ecs__meta_append(m, 4, hset, fl);
  if (arc != ECS_OK)
    return arc;
  uint64_t deadline = ecs__meta_deadline(m);
  redisReply *r1, *r2, *r3, *r4;
  int rc = ecs__meta_reply(m, &r1, deadline);
  if (rc != ECS_OK)
    return rc;
  rc = ecs__meta_reply(m, &r2, deadline);
  if (rc != ECS_OK) {
    freeReplyObject(r1);
    return rc;
  }
  rc = ecs__meta_reply(m, &r3, deadline);
  if (rc == ECS_OK && (rc = ecs__meta_reply(m, &r4, deadline)) != ECS_OK)
    freeReplyObject(r3);
  if (rc != ECS_OK) {
    freeReplyObject(r1);
    freeReplyObject(r2);
    return rc;
  }
  freeReplyObject(r3);
  freeReplyObject(r4);
  int ours = r1->type == REDIS_REPLY_INTEGER && r1->integer == 1 && ecs__meta_entry_ours(m, r2);
  rc = ecs__meta_reply_err(m, r1, "heartbeat");
  if (rc == ECS_OK)
    rc = ecs__meta_reply_err(m, r2, "heartbeat");
  freeReplyObject(r1);
  freeReplyObject(r2);
  if (rc != ECS_OK)
    return rc;
  if (!ours) {
    /* Redis lost the entry (restarted empty, or it expired while we could
     * not reach it) and readers may have deleted our records: register
     * again and publish everything again. */
    ecs__meta_seterr(m, "registry entry lost; re-registering");
    m->resync_owed = 1;
    m->sweeping = 0;
    return ecs_meta_register(m);
  }
  return ECS_OK;
}

void ecs_meta_set_free(ecs_meta_t *m, uint64_t free_bytes) {
  if (m != NULL)
    m->free_bytes = free_bytes;
}

int ecs_meta_nodes(ecs_meta_t *m, ecs_meta_node_t *out, size_t max, size_t *n) {
  if (m == NULL || n == NULL || (max > 0 && out == NULL))
    return ECS_EINVAL;
  *n = 0;
  int rc = ecs__meta_ensure_link(m);
  if (rc != ECS_OK)
    return rc;
  const char *smembers[] = {"SMEMBERS", m->nodes_key};
  redisReply *set;
  rc = ecs__meta_cmdv(m, &set, 2, smembers);
  if (rc != ECS_OK)
    return rc;
  rc = ecs__meta_reply_err(m, set, "SMEMBERS");
  if (rc == ECS_OK && set->type != REDIS_REPLY_ARRAY) {
    ecs__meta_seterr(m, "SMEMBERS: unexpected reply");
    rc = ECS_EREDIS;
  }
  if (rc != ECS_OK) {
    freeReplyObject(set);
    return rc;
  }
  /* One pipeline: HMGET each member's entry. */
  size_t cnt = 0;
  for (size_t i = 0; i < set->elements; i++) {
    const redisReply *id = set->element[i];
    if (id->type != REDIS_REPLY_STRING || id->len == 0 || id->len >= sizeof out->node_id)
      continue;
    char key[sizeof m->node_pfx + sizeof out->node_id];
    size_t pl = strlen(m->node_pfx);
    memcpy(key, m->node_pfx, pl);
    memcpy(key + pl, id->str, id->len);
    const char *argv[] = {"HMGET", key, "addr", "epoch", "pool", "free"};
    size_t lens[] = {5, pl + id->len, 4, 5, 4, 4};
    rc = ecs__meta_append(m, 6, argv, lens);
    if (rc == ECS_OK && !m->no_marks) /* and its suspicion mark (meta_suspect.c), in the same round trip */
      rc = ecs__meta_suspect_append(m, id->str, id->len);
    if (rc != ECS_OK) {
      freeReplyObject(set);
      return rc;
    }
    cnt++;
  }
  uint64_t deadline = ecs__meta_deadline(m);
  size_t k = 0, ndead = 0;
  const char **dead = malloc((set->elements + 2) * sizeof *dead);
  size_t *deadl = malloc((set->elements + 2) * sizeof *deadl);
  if (dead != NULL && deadl != NULL) {
    dead[0] = "SREM";
    deadl[0] = 4;
    dead[1] = m->nodes_key;
    deadl[1] = strlen(m->nodes_key);
  }
  for (size_t i = 0; i < set->elements && cnt > 0; i++) {
    const redisReply *id = set->element[i];
    if (id->type != REDIS_REPLY_STRING || id->len == 0 || id->len >= sizeof out->node_id)
      continue;
    cnt--;
    redisReply *r;
    int e = ecs__meta_reply(m, &r, deadline);
    if (e != ECS_OK) {
      free(dead);
      free(deadl);
      freeReplyObject(set);
      *n = 0;
      return e;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 4 && r->element[0]->type == REDIS_REPLY_NIL &&
        r->element[1]->type == REDIS_REPLY_NIL && dead != NULL && deadl != NULL) {
      dead[2 + ndead] = id->str; /* its entry expired: the node died */
      deadl[2 + ndead] = id->len;
      ndead++;
    }
    uint64_t epoch = 0, pool = 0, sus = 0;
    int parsed = r->type == REDIS_REPLY_ARRAY && r->elements == 4 && META_FIELD(r, 0) && META_FIELD(r, 1) &&
                 META_FIELD(r, 2) && r->element[0]->len < sizeof out->addr &&
                 ecs__rds_parse_u64(r->element[1]->str, r->element[1]->len, &epoch) == 0 &&
                 ecs__rds_parse_u64(r->element[2]->str, r->element[2]->len, &pool) == 0;
    e = m->no_marks ? ECS_OK : ecs__meta_suspect_read(m, parsed ? epoch : 0, deadline, &sus);
    if (e != ECS_OK) {
      freeReplyObject(r);
      free(dead);
      free(deadl);
      freeReplyObject(set);
      *n = 0;
      return e;
    }
    if (parsed && k < max) {
      ecs_meta_node_t *nd = &out[k++];
      memset(nd, 0, sizeof *nd);
      memcpy(nd->node_id, id->str, id->len);
      memcpy(nd->addr, r->element[0]->str, r->element[0]->len);
      nd->epoch = epoch;
      nd->pool_size = pool;
      nd->suspect_ms = sus;
      /* free: absent from an older server's entry; then the whole pool, a bound */
      if (!META_FIELD(r, 3) ||
          ecs__rds_parse_u64(r->element[3]->str, r->element[3]->len, &nd->free_bytes) != 0 ||
          nd->free_bytes > pool)
        nd->free_bytes = pool;
    }
    freeReplyObject(r);
  }
  /* Tidy the set; a node that registers again is added back (register and
   * every heartbeat SADD). */
  if (ndead > 0) {
    redisReply *r;
    if (ecs__meta_cmd(m, &r, (int)(ndead + 2), dead, deadl) == ECS_OK)
      freeReplyObject(r);
  }
  free(dead);
  free(deadl);
  freeReplyObject(set);
  *n = k;
  return ECS_OK;
}

/* Caps the blocking link's waits (connect and each reply) at what is left
 * until `until`, never above their configured values; 0 once nothing is
 * left. */
static int meta_cap_waits(ecs_meta_t *m, uint64_t until, int tmo, int ctmo) {
  uint64_t now = ecs_now_ms();
  if (now >= until)
    return 0;
  int left = until - now > (uint64_t)INT32_MAX ? INT32_MAX : (int)(until - now);
  m->timeout_ms = left < tmo ? left : tmo;
  m->link.timeout_ms = m->timeout_ms;
  m->link.connect_timeout_ms = left < ctmo ? left : ctmo;
  return 1;
}

static int meta_unregister_by(ecs_meta_t *m, uint64_t until, int tmo, int ctmo) {
  if (!meta_cap_waits(m, until, tmo, ctmo))
    return ECS_ETIMEDOUT;
  int rc = ecs__meta_connect(m);
  if (rc != ECS_OK)
    return rc;
  /* Registry first: from then on every record of ours is stale for readers,
   * and the sweep below deletes them (the check script deletes stale ones). */
  const char *del[] = {"DEL", m->node_key};
  const char *srem[] = {"SREM", m->nodes_key, m->node_id};
  redisReply *r;
  if (!meta_cap_waits(m, until, tmo, ctmo))
    return ECS_ETIMEDOUT;
  rc = ecs__meta_cmdv(m, &r, 2, del);
  if (rc != ECS_OK)
    return rc;
  rc = ecs__meta_reply_err(m, r, "unregister");
  freeReplyObject(r);
  if (rc != ECS_OK)
    return rc;
  if (!meta_cap_waits(m, until, tmo, ctmo))
    return ECS_ETIMEDOUT;
  rc = ecs__meta_cmdv(m, &r, 3, srem);
  if (rc != ECS_OK)
    return rc;
  freeReplyObject(r);
  snprintf(m->cursor, sizeof m->cursor, "0");
  m->sweeping = 0;
  for (;;) {
    int done;
    if (!meta_cap_waits(m, until, tmo, ctmo))
      return ECS_ETIMEDOUT;
    rc = ecs__meta_sweep_step(m, NULL, &done);
    if (rc != ECS_OK || done)
      break;
  }
  if (rc == ECS_OK)
    m->resync_owed = 0;
  return rc;
}

int ecs_meta_unregister(ecs_meta_t *m, int budget_ms) {
  if (m == NULL || !m->server)
    return ECS_EINVAL;
  m->want_reg = 0;
  ecs__meta_queue_clear(m);
  if (m->async) { /* the rest is a bounded wait on the blocking link */
    ecs__rdsa_close(&m->alink, ECS_ECANCELED);
    m->async = 0;
  }
  int tmo = m->timeout_ms, ctmo = m->link.connect_timeout_ms, ltmo = m->link.timeout_ms;
  uint64_t until = ecs_now_ms() + (uint64_t)(budget_ms > 0 ? budget_ms : 0);
  int rc = meta_unregister_by(m, until, tmo, ctmo);
  m->timeout_ms = tmo;
  m->link.connect_timeout_ms = ctmo;
  m->link.timeout_ms = ltmo;
  return rc;
}
