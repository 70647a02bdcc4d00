/*
 * The P -> D KV handoff: worker registration in Redis, request manifests,
 * and KV blocks through the connector's backend.
 *
 * Redis keys (namespace ns):
 *   ecs:<ns>:kv:inst:<id>           "role=R tp_size=T"       one per instance
 *   ecs:<ns>:kv:w:<id>:<dp>:<tp>    "role=R dp=D tp=P tp_size=T addr=A"
 *   ecs:<ns>:kv:workers             set of "<id>:<dp>:<tp>"
 *   ecs:<ns>:kv:req:<request>       list of one manifest: "ok N" | "abort WHY"
 * Blocks: backend keys "kv:<request>:<i>".
 *
 * Registration is one Lua script, so the compare and the set are atomic:
 * equal values succeed again (idempotent), different ones are refused with
 * what is stored.  Decode waits for a manifest with BRPOPLPUSH of the list
 * onto itself: Redis blocks the call until the element exists or the
 * timeout passes (no polling) and the element stays for other readers.
 *
 * Every call works on a session (one Redis link and one backend handle)
 * taken from a small idle pool, so concurrent calls do not queue behind a
 * blocking wait and no call creates a connection per transfer.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ec_connector/conn_internal.h"
#include "store/core/log.h"
#include "store/core/net.h"

#define KV_MAX_IDLE 4
#define KV_REQ_MAX 128

static const char reg_lua[] = "local i = redis.call('GET', KEYS[1])\n"
                              "if i and i ~= ARGV[1] then return {1, i} end\n"
                              "local w = redis.call('GET', KEYS[2])\n"
                              "if w and w ~= ARGV[2] then return {2, w} end\n"
                              "redis.call('SET', KEYS[1], ARGV[1])\n"
                              "redis.call('SET', KEYS[2], ARGV[2])\n"
                              "redis.call('SADD', KEYS[3], ARGV[3])\n"
                              "return {0, ''}\n";

static const char unreg_lua[] = "if redis.call('DEL', KEYS[2]) == 0 then return 0 end\n"
                                "redis.call('SREM', KEYS[3], ARGV[1])\n"
                                "for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do\n"
                                "  if string.sub(m, 1, #ARGV[2]) == ARGV[2] then return 1 end\n"
                                "end\n"
                                "redis.call('DEL', KEYS[1])\n"
                                "return 1\n";

static const char manifest_lua[] = "redis.call('DEL', KEYS[1])\n"
                                   "redis.call('RPUSH', KEYS[1], ARGV[1])\n"
                                   "redis.call('EXPIRE', KEYS[1], ARGV[2])\n"
                                   "return 1\n";

__attribute__((format(printf, 3, 4))) static int why(char *reason, size_t cap, const char *fmt, ...) {
  if (reason && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, cap, fmt, ap);
    va_end(ap);
  }
  return 0;
}

const char *ecs_kv_role_name(int role) {
  return role == ECS_KV_PREFILL ? "prefill" : role == ECS_KV_DECODE ? "decode" : "?";
}

int ecs_kv_role_parse(const char *s, int *role) {
  if (s && !strcmp(s, "prefill"))
    *role = ECS_KV_PREFILL;
  else if (s && !strcmp(s, "decode"))
    *role = ECS_KV_DECODE;
  else
    return ECS_EINVAL;
  return ECS_OK;
}

/* ------------------------------------------------------------------ */
/* sessions and retries                                                 */

static void sess_free(ecs_ec_conn_t *c, ecs__kv_sess_t *s) {
  ecs__rds_close(&s->r);
  if (s->h)
    c->ops->close(s->h);
  free(s);
}

static int sess_get(ecs_ec_conn_t *c, ecs__kv_sess_t **out, char *reason, size_t cap) {
  *out = NULL;
  if (c == NULL)
    return ECS_EINVAL;
  pthread_mutex_lock(&c->kv_mu);
  ecs__kv_sess_t *s = c->kv_idle;
  if (s) {
    c->kv_idle = s->next;
    c->kv_nidle--;
  }
  pthread_mutex_unlock(&c->kv_mu);
  if (s == NULL) {
    s = calloc(1, sizeof *s);
    if (s == NULL)
      return ECS_ENOMEM;
    int rc = ecs__rds_init(&s->r, c->cfg.redis_url, c->cfg.connect_timeout_ms, c->cfg.timeout_ms);
    if (rc != ECS_OK) {
      why(reason, cap, "KV handoff needs redis_url: %s", ecs__rds_errmsg(&s->r));
      free(s);
      return rc;
    }
  }
  *out = s;
  return ECS_OK;
}

static void sess_put(ecs_ec_conn_t *c, ecs__kv_sess_t *s) {
  pthread_mutex_lock(&c->kv_mu);
  if (c->kv_nidle < KV_MAX_IDLE) {
    s->next = c->kv_idle;
    c->kv_idle = s;
    c->kv_nidle++;
    s = NULL;
  }
  pthread_mutex_unlock(&c->kv_mu);
  if (s)
    sess_free(c, s);
}

void ecs__kv_shutdown(ecs_ec_conn_t *c) {
  pthread_mutex_lock(&c->kv_mu);
  ecs__kv_sess_t *s = c->kv_idle;
  c->kv_idle = NULL;
  c->kv_nidle = 0;
  pthread_mutex_unlock(&c->kv_mu);
  while (s) {
    ecs__kv_sess_t *next = s->next;
    sess_free(c, s);
    s = next;
  }
}

static int sess_data(ecs_ec_conn_t *c, ecs__kv_sess_t *s, char *reason, size_t cap) {
  if (s->h)
    return ECS_OK;
  char err[256] = "";
  int rc = c->ops->open(&c->cfg, ECS__EC_H_DATA, &s->h, err, sizeof err);
  if (rc != ECS_OK)
    why(reason, cap, "KV backend %s: %s", c->ops->name, err);
  return rc;
}

static int transient(int rc) {
  return rc == ECS_ECONN || rc == ECS_ETIMEDOUT;
}

static void backoff(const ecs_ec_conn_t *c, int attempt) {
  uint64_t ms = (uint64_t)c->cfg.retry_backoff_ms << (attempt < 10 ? attempt : 10);
  if (ms > 1000)
    ms = 1000;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* One command, retried with bounded backoff while the error is transient. */
static int kv_cmd(ecs_ec_conn_t *c, ecs__kv_sess_t *s, redisReply **out, int argc, const char **argv,
                  const size_t *lens) {
  int rc;
  for (int attempt = 0;; attempt++) {
    rc = ecs__rds_cmd(&s->r, out, argc, argv, lens);
    if (rc == ECS_OK || !transient(rc) || attempt >= c->cfg.lookup_retries)
      return rc;
    ECS_LOG_D("ec_connector kv: %s, retry %d", ecs__rds_errmsg(&s->r), attempt + 1);
    backoff(c, attempt);
  }
}

/* ------------------------------------------------------------------ */
/* registration                                                         */

static int id_ok(const char *s, size_t max) {
  size_t n = s ? strnlen(s, max) : 0;
  if (n == 0 || n >= max)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
          ch == '_' || ch == '-'))
      return 0;
  }
  return 1;
}

static int worker_check(const ecs_kv_worker_t *w, char *reason, size_t cap) {
  if (w == NULL)
    return why(reason, cap, "no worker given"), ECS_EINVAL;
  if (!id_ok(w->instance_id, ECS_KV_ID_MAX))
    return why(reason, cap, "instance_id must be 1..%d characters of [A-Za-z0-9._-]", ECS_KV_ID_MAX - 1),
           ECS_EINVAL;
  if (w->role != ECS_KV_PREFILL && w->role != ECS_KV_DECODE)
    return why(reason, cap, "role must be prefill or decode"), ECS_EINVAL;
  if (w->tp_size < 1 || w->tp_rank < 0 || w->tp_rank >= w->tp_size || w->dp_rank < 0)
    return why(reason, cap, "ranks out of range: dp_rank %d, tp_rank %d, tp_size %d", w->dp_rank, w->tp_rank,
               w->tp_size),
           ECS_EINVAL;
  size_t al = strnlen(w->address, ECS_KV_ADDR_MAX);
  if (al == 0 || al >= ECS_KV_ADDR_MAX || strpbrk(w->address, " \t\r\n") != NULL)
    return why(reason, cap, "address must be 1..%d characters without spaces", ECS_KV_ADDR_MAX - 1),
           ECS_EINVAL;
  return ECS_OK;
}

typedef struct kv_keys {
  char inst[256], worker[300], workers[200], member[128];
} kv_keys_t;

static void make_keys(const ecs_ec_conn_t *c, const char *id, int dp, int tp, kv_keys_t *k) {
  snprintf(k->inst, sizeof k->inst, "ecs:{%s}:kv:inst:%s", c->cfg.ns, id);
  snprintf(k->worker, sizeof k->worker, "ecs:{%s}:kv:w:%s:%d:%d", c->cfg.ns, id, dp, tp);
  snprintf(k->workers, sizeof k->workers, "ecs:{%s}:kv:workers", c->cfg.ns);
  snprintf(k->member, sizeof k->member, "%s:%d:%d", id, dp, tp);
}

static int parse_worker(const char *id, const char *v, ecs_kv_worker_t *w) {
  char role[16];
  memset(w, 0, sizeof *w);
  if (sscanf(v, "role=%15s dp=%d tp=%d tp_size=%d addr=%159s", role, &w->dp_rank, &w->tp_rank, &w->tp_size,
             w->address) != 5 ||
      ecs_kv_role_parse(role, &w->role) != ECS_OK)
    return ECS_EPROTO;
  snprintf(w->instance_id, sizeof w->instance_id, "%s", id);
  return ECS_OK;
}

int ecs_kv_register(ecs_ec_conn_t *c, const ecs_kv_worker_t *w, char *reason, size_t cap) {
  why(reason, cap, "%s", "");
  int rc = worker_check(w, reason, cap);
  if (rc != ECS_OK)
    return rc;
  ecs__kv_sess_t *s;
  if ((rc = sess_get(c, &s, reason, cap)) != ECS_OK)
    return rc;
  kv_keys_t k;
  make_keys(c, w->instance_id, w->dp_rank, w->tp_rank, &k);
  char iv[64], wv[300];
  snprintf(iv, sizeof iv, "role=%s tp_size=%d", ecs_kv_role_name(w->role), w->tp_size);
  snprintf(wv, sizeof wv, "role=%s dp=%d tp=%d tp_size=%d addr=%s", ecs_kv_role_name(w->role), w->dp_rank,
           w->tp_rank, w->tp_size, w->address);
  const char *argv[] = {"EVAL", reg_lua, "3", k.inst, k.worker, k.workers, iv, wv, k.member};
  redisReply *rep = NULL;
  rc = kv_cmd(c, s, &rep, 9, argv, NULL);
  if (rc != ECS_OK) {
    why(reason, cap, "register %s: %s", k.member, ecs__rds_errmsg(&s->r));
  } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
             rep->element[0]->type != REDIS_REPLY_INTEGER) {
    rc = ECS_EPROTO;
    why(reason, cap, "register %s: unexpected reply from Redis", k.member);
  } else if (rep->element[0]->integer == 1) {
    rc = ECS_ECONFLICT;
    why(reason, cap, "instance %s is registered as \"%s\"; this worker says \"%s\"", w->instance_id,
        rep->element[1]->str, iv);
  } else if (rep->element[0]->integer == 2) {
    rc = ECS_ECONFLICT;
    why(reason, cap, "worker %s (dp %d, tp %d) is registered as \"%s\"; this registration says \"%s\"",
        w->instance_id, w->dp_rank, w->tp_rank, rep->element[1]->str, wv);
  }
  if (rep)
    freeReplyObject(rep);
  sess_put(c, s);
  return rc;
}

int ecs_kv_unregister(ecs_ec_conn_t *c, const ecs_kv_worker_t *w, char *reason, size_t cap) {
  why(reason, cap, "%s", "");
  int rc = worker_check(w, reason, cap);
  if (rc != ECS_OK)
    return rc;
  ecs__kv_sess_t *s;
  if ((rc = sess_get(c, &s, reason, cap)) != ECS_OK)
    return rc;
  kv_keys_t k;
  make_keys(c, w->instance_id, w->dp_rank, w->tp_rank, &k);
  char pfx[ECS_KV_ID_MAX + 2];
  snprintf(pfx, sizeof pfx, "%s:", w->instance_id);
  const char *argv[] = {"EVAL", unreg_lua, "3", k.inst, k.worker, k.workers, k.member, pfx};
  redisReply *rep = NULL;
  rc = kv_cmd(c, s, &rep, 8, argv, NULL);
  if (rc != ECS_OK)
    why(reason, cap, "unregister %s: %s", k.member, ecs__rds_errmsg(&s->r));
  else if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)
    rc = ECS_ENOTFOUND, why(reason, cap, "worker %s is not registered", k.member);
  if (rep)
    freeReplyObject(rep);
  sess_put(c, s);
  return rc;
}

/* GET of a key: ECS_OK with *val (malloc'd), ECS_ENOTFOUND, or an error. */
static int kv_get(ecs_ec_conn_t *c, ecs__kv_sess_t *s, const char *key, char **val) {
  const char *argv[] = {"GET", key};
  redisReply *rep;
  *val = NULL;
  int rc = kv_cmd(c, s, &rep, 2, argv, NULL);
  if (rc != ECS_OK)
    return rc;
  if (rep->type == REDIS_REPLY_STRING)
    *val = strndup(rep->str, rep->len);
  else
    rc = rep->type == REDIS_REPLY_NIL ? ECS_ENOTFOUND : ECS_EPROTO;
  freeReplyObject(rep);
  if (rc == ECS_OK && *val == NULL)
    rc = ECS_ENOMEM;
  return rc;
}

int ecs_kv_lookup(ecs_ec_conn_t *c, const ecs_kv_worker_t *self, const char *instance_id, int dp_rank,
                  int tp_rank, ecs_kv_worker_t *out, char *reason, size_t cap) {
  why(reason, cap, "%s", "");
  if (out == NULL || !id_ok(instance_id, ECS_KV_ID_MAX))
    return why(reason, cap, "lookup: bad instance id or no output"), ECS_EINVAL;
  memset(out, 0, sizeof *out);
  ecs__kv_sess_t *s;
  int rc = sess_get(c, &s, reason, cap);
  if (rc != ECS_OK)
    return rc;
  kv_keys_t k;
  make_keys(c, instance_id, dp_rank, tp_rank, &k);
  char *iv = NULL, *wv = NULL;
  char role[16];
  int tp_size = 0, irole = 0;
  rc = kv_get(c, s, k.inst, &iv);
  if (rc == ECS_ENOTFOUND) {
    why(reason, cap, "instance %s is not registered", instance_id);
  } else if (rc != ECS_OK) {
    why(reason, cap, "lookup %s: %s", instance_id, ecs__rds_errmsg(&s->r));
  } else if (sscanf(iv, "role=%15s tp_size=%d", role, &tp_size) != 2 || ecs_kv_role_parse(role, &irole)) {
    rc = ECS_EPROTO;
    why(reason, cap, "instance %s: unreadable record \"%.80s\"", instance_id, iv);
  } else if (self && self->tp_size != tp_size) {
    rc = ECS_EINVAL;
    why(reason, cap,
        "tp size mismatch: %s instance %s has tp_size %d, %s worker %s has tp_size %d; "
        "prefill and decode must use the same tensor-parallel size",
        role, instance_id, tp_size, ecs_kv_role_name(self->role), self->instance_id, self->tp_size);
  } else if (dp_rank < 0 || tp_rank < 0 || tp_rank >= tp_size) {
    rc = ECS_EINVAL;
    why(reason, cap, "instance %s has tp_size %d: no tp rank %d (dp rank %d)", instance_id, tp_size, tp_rank,
        dp_rank);
  } else {
    rc = kv_get(c, s, k.worker, &wv);
    if (rc == ECS_ENOTFOUND)
      why(reason, cap, "instance %s has no worker at dp rank %d, tp rank %d", instance_id, dp_rank, tp_rank);
    else if (rc != ECS_OK)
      why(reason, cap, "lookup %s: %s", k.member, ecs__rds_errmsg(&s->r));
    else if (parse_worker(instance_id, wv, out) != ECS_OK)
      rc = ECS_EPROTO, why(reason, cap, "worker %s: unreadable record \"%.80s\"", k.member, wv);
  }
  free(iv);
  free(wv);
  sess_put(c, s);
  return rc;
}

int ecs_kv_list(ecs_ec_conn_t *c, int role, ecs_kv_worker_t *out, size_t cap, size_t *n, char *reason,
                size_t rcap) {
  why(reason, rcap, "%s", "");
  if (n)
    *n = 0;
  if (n == NULL || (cap && out == NULL))
    return ECS_EINVAL;
  ecs__kv_sess_t *s;
  int rc = sess_get(c, &s, reason, rcap);
  if (rc != ECS_OK)
    return rc;
  kv_keys_t k;
  make_keys(c, "x", 0, 0, &k);
  const char *argv[] = {"SMEMBERS", k.workers};
  redisReply *rep = NULL;
  rc = kv_cmd(c, s, &rep, 2, argv, NULL);
  if (rc != ECS_OK) {
    why(reason, rcap, "list workers: %s", ecs__rds_errmsg(&s->r));
  } else if (rep->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < rep->elements && *n < cap && rc == ECS_OK; i++) {
      char id[ECS_KV_ID_MAX];
      int dp, tp;
      const char *m = rep->element[i]->str;
      const char *colon = m ? strchr(m, ':') : NULL;
      if (colon == NULL || (size_t)(colon - m) >= sizeof id || sscanf(colon, ":%d:%d", &dp, &tp) != 2)
        continue;
      memcpy(id, m, (size_t)(colon - m));
      id[colon - m] = '\0';
      kv_keys_t wk;
      make_keys(c, id, dp, tp, &wk);
      char *wv = NULL;
      int r = kv_get(c, s, wk.worker, &wv);
      if (r == ECS_OK && parse_worker(id, wv, &out[*n]) == ECS_OK && (role == 0 || out[*n].role == role))
        (*n)++;
      else if (r != ECS_OK && r != ECS_ENOTFOUND)
        rc = r, why(reason, rcap, "list workers: %s", ecs__rds_errmsg(&s->r));
      free(wv);
    }
  }
  if (rep)
    freeReplyObject(rep);
  sess_put(c, s);
  return rc;
}

/* ------------------------------------------------------------------ */
/* publish / fetch                                                      */

static int req_ok(const char *r) {
  size_t n = r ? strnlen(r, KV_REQ_MAX + 1) : 0;
  if (n == 0 || n > KV_REQ_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)r[i] <= ' ' || r[i] == 0x7f)
      return 0;
  return 1;
}

static void block_key(const char *req, size_t i, char *out, size_t cap) {
  snprintf(out, cap, "kv:%s:%zu", req, i);
}

static int manifest(ecs_ec_conn_t *c, ecs__kv_sess_t *s, const char *req, const char *msg) {
  char key[300], ttl[24];
  snprintf(key, sizeof key, "ecs:{%s}:kv:req:%s", c->cfg.ns, req);
  snprintf(ttl, sizeof ttl, "%d", c->cfg.kv_ttl_s);
  const char *argv[] = {"EVAL", manifest_lua, "1", key, msg, ttl};
  redisReply *rep = NULL;
  int rc = kv_cmd(c, s, &rep, 6, argv, NULL);
  if (rep)
    freeReplyObject(rep);
  return rc;
}

int ecs_kv_abort(ecs_ec_conn_t *c, const char *request_id, const char *reason_in) {
  if (!req_ok(request_id))
    return ECS_EINVAL;
  ecs__kv_sess_t *s;
  int rc = sess_get(c, &s, NULL, 0);
  if (rc != ECS_OK)
    return rc;
  char msg[ECS_KV_REASON_MAX + 8];
  snprintf(msg, sizeof msg, "abort %s", reason_in && reason_in[0] ? reason_in : "aborted by prefill");
  rc = manifest(c, s, request_id, msg);
  if (rc != ECS_OK)
    ECS_LOG_E("ec_connector kv: abort %s: %s", request_id, ecs__rds_errmsg(&s->r));
  sess_put(c, s);
  return rc;
}

int ecs_kv_publish(ecs_ec_conn_t *c, const char *request_id, const ecs_tensor_t *blocks, size_t n,
                   char *reason, size_t cap) {
  char local[ECS_KV_REASON_MAX];
  if (reason == NULL || cap == 0) {
    reason = local;
    cap = sizeof local;
  }
  why(reason, cap, "%s", "");
  if (!req_ok(request_id))
    return why(reason, cap, "request id must be 1..%d printable characters", KV_REQ_MAX), ECS_EINVAL;
  if (n > 0 && blocks == NULL)
    return why(reason, cap, "no blocks"), ECS_EINVAL;
  ecs__kv_sess_t *s;
  int rc = sess_get(c, &s, reason, cap);
  if (rc == ECS_OK)
    rc = sess_data(c, s, reason, cap);
  if (rc != ECS_OK) {
    if (s)
      sess_put(c, s);
    return rc;
  }
  size_t batch = (size_t)c->cfg.batch_size;
  char(*names)[KV_REQ_MAX + 32] = calloc(batch, sizeof *names);
  ecs_key_t *keys = calloc(batch, sizeof *keys);
  int *st = calloc(batch, sizeof *st);
  if (!names || !keys || !st) {
    rc = ECS_ENOMEM;
    why(reason, cap, "out of memory");
  }
  for (size_t i = 0; i < n && rc == ECS_OK; i += batch) {
    size_t k = n - i < batch ? n - i : batch;
    for (size_t j = 0; j < k; j++) {
      block_key(request_id, i + j, names[j], sizeof names[j]);
      keys[j].data = names[j];
      keys[j].len = strlen(names[j]);
      st[j] = 1;
    }
    int brc = c->ops->put(s->h, keys, blocks + i, k, st);
    for (size_t j = 0; j < k && rc == ECS_OK; j++) {
      int e = st[j] == 1 ? (brc ? brc : ECS_EIO) : st[j];
      if (e != ECS_OK) {
        rc = e;
        why(reason, cap, "request %s: storing KV block %zu of %zu failed: %s%s%s", request_id, i + j, n,
            ecs_strerror(e), brc ? ": " : "", brc ? c->ops->errmsg(s->h) : "");
      }
    }
  }
  free(names);
  free(keys);
  free(st);
  char msg[ECS_KV_REASON_MAX + 8];
  if (rc == ECS_OK) {
    snprintf(msg, sizeof msg, "ok %zu", n);
    rc = manifest(c, s, request_id, msg);
    if (rc != ECS_OK)
      why(reason, cap, "request %s: publishing the manifest failed: %s", request_id, ecs__rds_errmsg(&s->r));
  } else {
    /* tell decode now rather than let it time out */
    snprintf(msg, sizeof msg, "abort %s", reason);
    if (manifest(c, s, request_id, msg) != ECS_OK)
      ECS_LOG_E("ec_connector kv: request %s: could not publish the abort: %s", request_id,
                ecs__rds_errmsg(&s->r));
  }
  sess_put(c, s);
  return rc;
}

/* Blocks on the manifest list until it has an element or the deadline. */
static int wait_manifest(ecs_ec_conn_t *c, ecs__kv_sess_t *s, const char *req, uint64_t deadline, char *msg,
                         size_t cap) {
  char key[300];
  snprintf(key, sizeof key, "ecs:{%s}:kv:req:%s", c->cfg.ns, req);
  int rc = ECS_ETIMEDOUT;
  for (int attempt = 0;; attempt++) {
    uint64_t now = ecs_now_ms();
    if (now >= deadline)
      return ECS_ETIMEDOUT;
    char secs[32];
    /* 0 would mean "forever" to Redis: never send it */
    snprintf(secs, sizeof secs, "%.3f", (double)(deadline - now < 1 ? 1 : deadline - now) / 1000.0);
    const char *argv[] = {"BRPOPLPUSH", key, key, secs};
    redisReply *rep = NULL;
    rc = ecs__rds_append(&s->r, 4, argv, NULL);
    if (rc == ECS_OK)
      rc = ecs__rds_reply(&s->r, deadline + (uint64_t)c->cfg.timeout_ms, &rep);
    if (rc == ECS_OK) {
      if (rep->type == REDIS_REPLY_STRING)
        snprintf(msg, cap, "%.*s", (int)rep->len, rep->str);
      else
        rc = rep->type == REDIS_REPLY_NIL ? ECS_ETIMEDOUT : ECS_EPROTO;
      freeReplyObject(rep);
      return rc;
    }
    if (!transient(rc) || attempt >= c->cfg.lookup_retries)
      return rc;
    backoff(c, attempt);
  }
}

int ecs_kv_fetch(ecs_ec_conn_t *c, const char *request_id, int timeout_ms, ecs_get_buf_t *bufs, size_t cap,
                 size_t *nblocks, char *reason, size_t rcap) {
  char local[ECS_KV_REASON_MAX];
  if (reason == NULL || rcap == 0) {
    reason = local;
    rcap = sizeof local;
  }
  why(reason, rcap, "%s", "");
  if (nblocks)
    *nblocks = 0;
  if (c == NULL || !req_ok(request_id) || (cap && bufs == NULL))
    return why(reason, rcap, "fetch: bad request id or buffers"), ECS_EINVAL;
  uint64_t t0 = ecs_now_ms();
  uint64_t deadline = t0 + (uint64_t)(timeout_ms < 0 ? c->cfg.timeout_ms : timeout_ms);
  ecs__kv_sess_t *s;
  int rc = sess_get(c, &s, reason, rcap);
  if (rc == ECS_OK)
    rc = sess_data(c, s, reason, rcap);
  if (rc != ECS_OK) {
    if (s)
      sess_put(c, s);
    return rc;
  }
  char msg[ECS_KV_REASON_MAX + 16];
  size_t n = 0;
  rc = wait_manifest(c, s, request_id, deadline, msg, sizeof msg);
  if (rc == ECS_ETIMEDOUT) {
    why(reason, rcap, "request %s aborted: prefill did not publish its KV within %llu ms", request_id,
        (unsigned long long)(deadline - t0));
  } else if (rc != ECS_OK) {
    why(reason, rcap, "request %s aborted: waiting for its KV: %s", request_id, ecs__rds_errmsg(&s->r));
  } else if (strncmp(msg, "abort ", 6) == 0) {
    rc = ECS_ECANCELED;
    why(reason, rcap, "request %s aborted by prefill: %s", request_id, msg + 6);
  } else if (sscanf(msg, "ok %zu", &n) != 1) {
    rc = ECS_EPROTO;
    why(reason, rcap, "request %s aborted: unreadable manifest \"%.60s\"", request_id, msg);
  } else if (n > cap) {
    rc = ECS_EBUFSMALL;
    why(reason, rcap, "request %s aborted: %zu KV blocks published, room for %zu", request_id, n, cap);
  }
  size_t batch = c->cfg.batch_size < 64 ? (size_t)c->cfg.batch_size : 64; /* stack arrays below */
  for (size_t i = 0; i < n && rc == ECS_OK; i += batch) {
    size_t k = n - i < batch ? n - i : batch;
    char names[64][KV_REQ_MAX + 32];
    ecs_key_t keys[64];
    for (size_t j = 0; j < k; j++) {
      block_key(request_id, i + j, names[j], sizeof names[j]);
      keys[j].data = names[j];
      keys[j].len = strlen(names[j]);
      bufs[i + j].status = 1;
    }
    int brc = c->ops->get(s->h, keys, bufs + i, k);
    for (size_t j = 0; j < k && rc == ECS_OK; j++) {
      int e = bufs[i + j].status == 1 ? (brc ? brc : ECS_EIO) : bufs[i + j].status;
      bufs[i + j].status = e;
      if (e != ECS_OK) {
        rc = e;
        why(reason, rcap, "request %s aborted: KV block %zu of %zu: %s%s%s", request_id, i + j, n,
            ecs_strerror(e), brc ? ": " : "", brc ? c->ops->errmsg(s->h) : "");
      }
    }
  }
  if (rc == ECS_OK && nblocks)
    *nblocks = n;
  if (rc != ECS_OK)
    ECS_LOG_W("ec_connector kv: %s", reason);
  sess_put(c, s);
  return rc;
}

int ecs_kv_release(ecs_ec_conn_t *c, const char *request_id, size_t nblocks) {
  if (!req_ok(request_id))
    return ECS_EINVAL;
  ecs__kv_sess_t *s;
  int rc = sess_get(c, &s, NULL, 0);
  if (rc == ECS_OK)
    rc = sess_data(c, s, NULL, 0);
  if (rc != ECS_OK) {
    if (s)
      sess_put(c, s);
    return rc;
  }
  for (size_t i = 0; i < nblocks && rc == ECS_OK; i++) {
    char name[KV_REQ_MAX + 32];
    block_key(request_id, i, name, sizeof name);
    ecs_key_t k = {name, strlen(name)};
    int st;
    rc = c->ops->remove(s->h, &k, 1, &st);
  }
  char key[300];
  snprintf(key, sizeof key, "ecs:{%s}:kv:req:%s", c->cfg.ns, request_id);
  const char *argv[] = {"DEL", key};
  redisReply *rep = NULL;
  int r2 = kv_cmd(c, s, &rep, 2, argv, NULL);
  if (rep)
    freeReplyObject(rep);
  sess_put(c, s);
  return rc != ECS_OK ? rc : r2;
}
