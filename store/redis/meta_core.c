/*
 * Redis metadata: the blocking link, open / close and tick
 * (store/redis/meta.h; the other pieces are listed in meta_internal.h).
 *
 * The link itself (connect, deadlines, the error mapping) is store/redis/rds.h,
 * shared with the connector.  Every command goes through ecs__meta_append()
 * and ecs__meta_reply() over it.  Any I/O error, timeout or protocol error
 * takes the link down, and with it the handle: the write queue is dropped
 * and a re-sync owed, because a pipeline interrupted half-way leaves Redis
 * in an unknown state that only a full re-sync repairs.  Error replies
 * (-ERR ...) leave the link up.
 *
 * Keys are binary: every command is sent with explicit lengths.
 */
#include "store/redis/meta_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/net.h"

void ecs__meta_seterr(ecs_meta_t *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->errstr, sizeof m->errstr, fmt, ap);
  va_end(ap);
}

/* Printable ASCII without spaces, 1..max bytes (meta_internal.h). */
int ecs__meta_check_name(const char *s, size_t max) {
  if (s == NULL)
    return -1;
  size_t len = strlen(s);
  if (len == 0 || len > max)
    return -1;
  for (size_t i = 0; i < len; i++)
    if (s[i] <= ' ' || s[i] >= 0x7f)
      return -1;
  return 0;
}

/* ---- link ------------------------------------------------------------- */

void ecs__meta_queue_clear(ecs_meta_t *m) {
  for (size_t i = 0; i < m->qn; i++)
    free(m->q[i].argv);
  m->qn = 0;
}

/* Takes the link down: whatever was in flight is lost, so a re-sync is owed. */
static void meta_down(ecs_meta_t *m) {
  ecs__rds_close(&m->link);
  m->sha[0] = '\0';
  ecs__meta_queue_clear(m);
  m->resync_owed = 1;
  m->sweeping = 0;
  m->hb_valid = 0;
}

/* A failed link call: its message, and the handle down with the link (a
 * failure that dropped the link lost whatever was in flight). */
static int meta_link_fail(ecs_meta_t *m, int rc) {
  ecs__meta_seterr(m, "%s", ecs__rds_errmsg(&m->link));
  if (!ecs__rds_up(&m->link))
    meta_down(m);
  return rc;
}

/* Not connected: ECS_ECONN, like every other kind of unreachable Redis. */
int ecs__meta_not_connected(ecs_meta_t *m) {
  if (m->errstr[0] == '\0')
    ecs__meta_seterr(m, "not connected");
  return ECS_ECONN;
}

/* Queues one command on the link, which must be up. */
int ecs__meta_append(ecs_meta_t *m, int argc, const char **argv, const size_t *lens) {
  if (!ecs__rds_up(&m->link))
    return ecs__meta_not_connected(m);
  int rc = ecs__rds_append(&m->link, argc, argv, lens);
  return rc == ECS_OK ? ECS_OK : meta_link_fail(m, rc);
}

/*
 * Reads the next reply, waiting at most until deadline (monotonic ms).  On
 * failure the link is down and *out is NULL.  An error reply is a reply.
 * The caller frees the reply.
 */
int ecs__meta_reply(ecs_meta_t *m, redisReply **out, uint64_t deadline) {
  *out = NULL;
  if (!ecs__rds_up(&m->link))
    return ecs__meta_not_connected(m);
  int rc = ecs__rds_reply_any(&m->link, deadline, out);
  return rc == ECS_OK ? ECS_OK : meta_link_fail(m, rc);
}

void ecs_meta_set_timeout(ecs_meta_t *m, int ms) {
  if (m == NULL)
    return;
  m->timeout_ms = ms > 0 ? ms : 1;
  m->link.timeout_ms = m->timeout_ms;
  m->link.connect_timeout_ms = m->timeout_ms;
}

void ecs_meta_set_deadline(ecs_meta_t *m, uint64_t until_ms) {
  if (m != NULL)
    ecs__rds_set_until(&m->link, until_ms);
}

uint64_t ecs__meta_deadline(const ecs_meta_t *m) {
  uint64_t d = ecs_now_ms() + (uint64_t)m->timeout_ms;
  return m->link.until != 0 && m->link.until < d ? m->link.until : d;
}

/* One command, one reply.  An error reply is returned as a reply. */
int ecs__meta_cmd(ecs_meta_t *m, redisReply **out, int argc, const char **argv, const size_t *lens) {
  *out = NULL;
  int rc = ecs__meta_append(m, argc, argv, lens);
  return rc == ECS_OK ? ecs__meta_reply(m, out, ecs__meta_deadline(m)) : rc;
}

/* ecs__meta_cmd() for NUL-terminated arguments. */
int ecs__meta_cmdv(ecs_meta_t *m, redisReply **out, int argc, const char **argv) {
  size_t lens[16];
  if (argc > 16)
    return ECS_EINVAL;
  for (int i = 0; i < argc; i++)
    lens[i] = strlen(argv[i]);
  return ecs__meta_cmd(m, out, argc, argv, lens);
}

/* A reply that is an error: records the message and returns ECS_EREDIS. */
int ecs__meta_reply_err(ecs_meta_t *m, const redisReply *r, const char *what) {
  if (r == NULL || r->type != REDIS_REPLY_ERROR)
    return ECS_OK;
  ecs__meta_seterr(m, "%s: %.*s", what, (int)r->len, r->str);
  return ECS_EREDIS;
}

int ecs__meta_load_script(ecs_meta_t *m) {
  const char *argv[] = {"SCRIPT", "LOAD", ecs__meta_check_lua};
  redisReply *r;
  int rc = ecs__meta_cmdv(m, &r, 3, argv);
  if (rc != ECS_OK)
    return rc;
  if (r->type == REDIS_REPLY_STRING && r->len == 40) {
    memcpy(m->sha, r->str, 40);
    m->sha[40] = '\0';
  } else {
    rc = ecs__meta_reply_err(m, r, "SCRIPT LOAD");
    if (rc == ECS_OK) {
      ecs__meta_seterr(m, "SCRIPT LOAD: unexpected reply");
      rc = ECS_EREDIS;
    }
  }
  freeReplyObject(r);
  return rc;
}

/* Connects (bounded by timeout_ms), SELECTs the db and loads the script. */
int ecs__meta_connect(ecs_meta_t *m) {
  if (ecs__rds_up(&m->link))
    return ECS_OK;
  int rc = ecs__rds_connect(&m->link);
  if (rc != ECS_OK) {
    ecs__meta_seterr(m, "%s", ecs__rds_errmsg(&m->link));
    return rc;
  }
  rc = ecs__meta_load_script(m);
  if (rc != ECS_OK) {
    meta_down(m);
    return rc;
  }
  m->link.used = 0; /* only a caller's reply makes the link "used" */
  m->errstr[0] = '\0';
  return ECS_OK;
}

/* Clients reconnect on demand; servers only in tick(), which re-syncs. */
int ecs__meta_ensure_link(ecs_meta_t *m) {
  if (ecs__rds_up(&m->link))
    return ECS_OK;
  if (m->server)
    return ecs__meta_not_connected(m);
  return ecs__meta_connect(m);
}

/* ---- open / close ----------------------------------------------------- */

void ecs_meta_opts_init(ecs_meta_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->timeout_ms = META_DEFAULT_TIMEOUT_MS;
  o->heartbeat_ttl_s = META_DEFAULT_TTL_S;
  o->reconnect_ms = META_DEFAULT_RECONNECT_MS;
}

/* Escapes the glob characters of s for a SCAN MATCH pattern. */
static void meta_glob_escape(char *out, size_t cap, const char *s) {
  size_t o = 0;
  for (; *s != '\0' && o + 3 < cap; s++) {
    if (strchr("*?[]\\", *s) != NULL)
      out[o++] = '\\';
    out[o++] = *s;
  }
  out[o] = '\0';
}

int ecs_meta_open(const ecs_meta_opts_t *o, ecs_meta_t **out) {
  if (out == NULL)
    return ECS_EINVAL;
  *out = NULL;
  /* no braces: the namespace is the keys' Redis Cluster hash tag */
  if (o == NULL || ecs__meta_check_name(o->ns, META_NS_MAX) != 0 || strpbrk(o->ns, "{}") != NULL)
    return ECS_EINVAL;
  ecs_meta_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return ECS_ENOMEM;
  int tmo = o->timeout_ms > 0 ? o->timeout_ms : META_DEFAULT_TIMEOUT_MS;
  if (ecs__rds_init(&m->link, o->redis_url, tmo, tmo) != ECS_OK)
    goto out_inval;
  ecs__rds_set_until(&m->link, o->connect_until_ms); /* the open's connect: within the caller's call */
  snprintf(m->ns, sizeof m->ns, "%s", o->ns);
  m->no_marks = o->no_marks != 0;
  if (o->node_id != NULL) {
    if (ecs__meta_check_name(o->node_id, sizeof m->node_id - 1) != 0 || o->epoch == 0)
      goto out_inval;
    if (o->addr != NULL && strlen(o->addr) >= sizeof m->addr)
      goto out_inval;
    m->server = 1;
    m->want_reg = 1;
    snprintf(m->node_id, sizeof m->node_id, "%s", o->node_id);
    snprintf(m->addr, sizeof m->addr, "%s", o->addr ? o->addr : "");
    m->pool_size = o->pool_size;
    m->epoch = o->epoch;
    m->started_ms = ecs_wall_ms();
  }
  m->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : META_DEFAULT_TIMEOUT_MS;
  /* the registry TTL: in ms when given so (--registry-ttl-ms), never under
   * META_MIN_TTL_MS (a heartbeat every ttl/3 must have time to arrive) */
  m->ttl_ms = o->heartbeat_ttl_ms > 0  ? o->heartbeat_ttl_ms
              : o->heartbeat_ttl_s > 0 ? o->heartbeat_ttl_s * 1000
                                       : META_DEFAULT_TTL_S * 1000;
  if (m->ttl_ms < META_MIN_TTL_MS)
    m->ttl_ms = META_MIN_TTL_MS;
  m->reconnect_ms = o->reconnect_ms > 0 ? o->reconnect_ms : META_DEFAULT_RECONNECT_MS;
  /* "{ns}" is a Redis Cluster hash tag: a namespace's keys share one slot,
   * so the check script's keys (records and registry) are on one node */
  m->obj_pfx_len = (size_t)snprintf(m->obj_pfx, sizeof m->obj_pfx, "ecs:{%s}:obj:", m->ns);
  snprintf(m->node_pfx, sizeof m->node_pfx, "ecs:{%s}:node:", m->ns);
  snprintf(m->node_key, sizeof m->node_key, "ecs:{%s}:node:%s", m->ns, m->node_id);
  snprintf(m->nodes_key, sizeof m->nodes_key, "ecs:{%s}:nodes", m->ns);
  snprintf(m->sus_pfx, sizeof m->sus_pfx, "ecs:{%s}:suspect:", m->ns);
  ecs__rds_set_route(&m->link, m->nodes_key); /* Redis Cluster: the namespace's slot */
  char esc[2 * META_NS_MAX + 1];
  meta_glob_escape(esc, sizeof esc, m->ns);
  snprintf(m->match, sizeof m->match, "ecs:{%s}:obj:*", esc);
  int rc = ecs__meta_connect(m);
  ecs__rds_set_until(&m->link, 0);
  if (rc == ECS_ENOMEM) {
    ecs_meta_close(m);
    return rc;
  }
  /* A server starts with a sweep too: it clears what an earlier process
   * with this node id left behind (stale by its epoch). */
  m->resync_owed = m->server;
  *out = m;
  return ECS_OK;

out_inval:
  free(m);
  return ECS_EINVAL;
}

void ecs_meta_close(ecs_meta_t *m) {
  if (m == NULL)
    return;
  if (m->async)
    ecs__rdsa_close(&m->alink, ECS_ECANCELED);
  ecs__rds_close(&m->link);
  ecs__meta_queue_clear(m);
  free(m->q);
  free(m->dq);
  free(m);
}

int ecs_meta_is_up(const ecs_meta_t *m) {
  if (m != NULL && m->async)
    return ecs__rdsa_up(&m->alink);
  return m != NULL && ecs__rds_up(&m->link);
}

const char *ecs_meta_errstr(const ecs_meta_t *m) {
  return m ? m->errstr : "";
}

int ecs_meta_resync_pending(const ecs_meta_t *m) {
  return m != NULL && m->server && (m->resync_owed || m->sweeping);
}

int ecs_meta_tick(ecs_meta_t *m, uint64_t now_ms, const ecs_meta_resync_t *rs) {
  if (m == NULL)
    return ECS_EINVAL;
  if (!m->server)
    return ecs__meta_ensure_link(m);
  if (m->async)
    return ecs__meta_tick_async(m, now_ms, rs);
  if (!m->want_reg)
    return ecs__rds_up(&m->link) ? ECS_OK : ECS_ENOTCONN;
  int rc;
  if (!ecs__rds_up(&m->link)) {
    if (m->rc_valid && now_ms - m->last_rc_ms < (uint64_t)m->reconnect_ms)
      return ECS_ENOTCONN;
    m->rc_valid = 1;
    m->last_rc_ms = now_ms;
    rc = ecs__meta_connect(m);
    if (rc != ECS_OK)
      return rc;
    m->resync_owed = 1;
    m->sweeping = 0;
    rc = ecs_meta_register(m);
    if (rc != ECS_OK)
      return rc;
    m->hb_valid = 1;
    m->last_hb_ms = now_ms;
  }
  /* A re-sync about to start checks the registry first, so that it never
   * publishes under an entry that has expired. */
  int starting = m->resync_owed && !m->sweeping && rs != NULL;
  if (starting || !m->hb_valid || now_ms - m->last_hb_ms >= ecs__meta_hb_period_ms(m)) {
    rc = ecs__meta_heartbeat(m);
    if (rc != ECS_OK)
      return rc;
    m->hb_valid = 1;
    m->last_hb_ms = now_ms;
  }
  if ((m->resync_owed || m->sweeping) && rs != NULL) {
    rc = ecs__meta_resync(m, rs);
    if (rc != ECS_OK)
      return rc;
  }
  return ecs__rds_up(&m->link) ? ECS_OK : ECS_ENOTCONN;
}
