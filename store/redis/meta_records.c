/*
 * Redis metadata: object records and the node registry (store/redis/meta.h).
 *
 * The schema, the staleness rule and the re-sync after an outage are
 * described in docs/redis-schema.md; this file is the only code that reads
 * or writes those keys.
 *
 * The link itself (connect, deadlines, the error mapping) is store/redis/rds.h,
 * shared with the connector.  Every command goes through meta_append() and
 * meta_reply() over it.  Any I/O error, timeout or protocol error takes the
 * link down, and with it the handle: the write queue is dropped and a
 * re-sync owed, because a pipeline interrupted half-way leaves Redis in an
 * unknown state that only a full re-sync repairs.  Error replies (-ERR ...)
 * leave the link up.
 *
 * Keys are binary: every command is sent with explicit lengths.
 */
#include "store/redis/meta.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "ecstore/error.h"
#include "store/core/net.h"
#include "store/redis/rds.h"

#define META_DEFAULT_TIMEOUT_MS 500
#define META_DEFAULT_TTL_S 10
#define META_DEFAULT_RECONNECT_MS 1000
#define META_NS_MAX 64            /* namespace bytes */
#define META_CHUNK 1000           /* keys per script call; a batch pipelines its chunks */
#define META_QUEUE_AUTOFLUSH 4096 /* queued commands that trigger a flush from queue_put */
#define META_SCAN_COUNT "1000"    /* SCAN COUNT hint per re-sync step */
#define META_SCAN_STEPS 64        /* SCAN calls per tick while re-syncing */
#define META_REC_FIELDS 10        /* fields of an object record */
#define META_REC_ARGC 24          /* HSET, the key, the fields and this node's holder entry */
#define META_KEY_MAX 400          /* "ecs:" ns ":obj:" key, with room to spare */

/*
 * The read check, run by exists_batch, lookup_batch and the re-sync sweep.
 * A record lists every node holding a copy in its fields "h:{node}" (value:
 * that node's epoch when it wrote; replicas, docs/redis-schema.md); a
 * record written before holders were listed has only "node" and "epoch",
 * which then name its one holder.  For each record: missing -> 0; each
 * holder whose registry entry is missing or carries another epoch is
 * dropped (its "h:" field deleted); none left live -> the record is
 * deleted, -1; else live: 1 (mode "e"), the record's ten fields followed
 * by node, epoch of every live holder (mode "l"), or 1 when the caller's
 * node ARGV[3] is a live holder and 2 when only others are (mode "s").  A
 * key of another type (someone else's garbage) counts as missing, so that
 * it cannot fail the whole batch.
 * Registry epochs are cached per node for the duration of one call.
 * exists (mode "e") first tries the common case in two cheap calls: the
 * last writer ("node") is live and still a holder; only otherwise is the
 * whole record read.
 */
static const char meta_check_lua[] =
    "local pfx, mode, me = ARGV[1], ARGV[2], ARGV[3]\n"
    "local cache, out = {}, {}\n"
    "local names = {'node', 'epoch', 'off', 'len', 'raw_len', 'dtype', 'shape', 'csum', 'codec', 't'}\n"
    "local byte, sub = string.byte, string.sub\n"
    "local function regepoch(id)\n"
    "  local ne = cache[id]\n"
    "  if ne == nil then\n"
    "    ne = redis.call('HGET', pfx .. id, 'epoch')\n"
    "    cache[id] = ne\n"
    "  end\n"
    "  return ne\n"
    "end\n"
    "local function check(k)\n"
    "  if mode == 'e' then\n"
    "    local q = redis.pcall('HMGET', k, 'node', 'epoch')\n"
    "    if not q.err and q[1] and q[2] and regepoch(q[1]) == q[2] and\n"
    "       redis.call('HEXISTS', k, 'h:' .. q[1]) == 1 then\n"
    "      return 1\n"
    "    end\n"
    "  end\n"
    "  local r = redis.pcall('HGETALL', k)\n"
    "  if r.err or #r == 0 then return 0 end\n"
    "  local f, live, nh, mine = {}, {}, 0, false\n"
    "  for j = 1, #r, 2 do\n"
    "    local name, v = r[j], r[j + 1]\n"
    "    if byte(name, 1) == 104 and byte(name, 2) == 58 then\n"
    "      nh = nh + 1\n"
    "      local id = sub(name, 3)\n"
    "      if regepoch(id) == v then\n"
    "        live[#live + 1] = id\n"
    "        live[#live + 1] = v\n"
    "        if id == me then mine = true end\n"
    "      else\n"
    "        redis.call('HDEL', k, name)\n"
    "      end\n"
    "    else\n"
    "      f[name] = v\n"
    "    end\n"
    "  end\n"
    "  if nh == 0 then\n"
    "    if not f.node and not f.epoch then return 0 end\n"
    "    if f.node and f.epoch and regepoch(f.node) == f.epoch then\n"
    "      live[1] = f.node\n"
    "      live[2] = f.epoch\n"
    "      mine = f.node == me\n"
    "    end\n"
    "  end\n"
    "  if #live == 0 then\n"
    "    redis.call('DEL', k)\n"
    "    return -1\n"
    "  end\n"
    "  if mode == 'l' then\n"
    "    local res = {}\n"
    "    for j, n in ipairs(names) do res[j] = f[n] or false end\n"
    "    for j = 1, #live do res[10 + j] = live[j] end\n"
    "    return res\n"
    "  elseif mode == 's' then\n"
    "    if mine then return 1 end\n"
    "    return 2\n"
    "  end\n"
    "  return 1\n"
    "end\n"
    "for i = 1, #KEYS do out[i] = check(KEYS[i]) end\n"
    "return out\n";

/* Record deletes on behalf of one holder, for every key of KEYS (a flush's
 * worth of evictions goes in one call; a namespace's keys share the {ns}
 * hash tag, so they are one Redis Cluster slot).  Per key: drops its "h:"
 * field, and the whole record only when no other holder is listed (a
 * record without holder fields, written before replicas, goes only if
 * "node" still names this node).  Another node may hold a copy, or have
 * published the same content key since: its entry must stay.  A key of
 * another type (someone else's garbage) is left alone, as the check
 * script leaves it, so that it cannot fail the keys after it.  Returns
 * the number of records deleted. */
static const char meta_del_lua[] =
    "local n, me = 0, 'h:' .. ARGV[1]\n"
    "for _, k in ipairs(KEYS) do\n"
    "  local had = redis.pcall('HDEL', k, me)\n"
    "  if type(had) == 'number' then\n"
    "    local other = false\n"
    "    for _, f in ipairs(redis.call('HKEYS', k)) do\n"
    "      if string.sub(f, 1, 2) == 'h:' then\n"
    "        other = true\n"
    "        break\n"
    "      end\n"
    "    end\n"
    "    if not other and (had == 1 or redis.call('HGET', k, 'node') == ARGV[1]) then\n"
    "      n = n + redis.call('DEL', k)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return n\n";

/* A queued command: argv and lengths point into the same allocation. */
typedef struct meta_cmd {
  int argc;          /* number of arguments */
  const char **argv; /* argument bytes (not NUL-terminated) */
  size_t *lens;      /* argument lengths */
} meta_cmd_t;

struct ecs_meta {
  char ns[META_NS_MAX + 1]; /* namespace */
  char node_id[64];         /* server: this node ("" for clients) */
  char addr[128];           /* server: advertised "HOST:PORT" */
  uint64_t pool_size;       /* server: pool bytes */
  uint64_t free_bytes;      /* server: pool bytes free, published with each heartbeat */
  uint64_t epoch;           /* server: this process's epoch */
  uint64_t started_ms;      /* server: wall-clock ms at open, for the registry */
  int timeout_ms;           /* bound on each call */
  int ttl_s;                /* registry TTL */
  int reconnect_ms;         /* least time between reconnects in tick() */
  int server;               /* node_id given: writes records and a registry entry */

  ecs__rds_t link; /* the Redis link (store/redis/rds.h): down until connected */
  char sha[41];    /* SHA1 of meta_check_lua, loaded on the link */

  char obj_pfx[META_NS_MAX + 16];   /* "ecs:{ns}:obj:" */
  size_t obj_pfx_len;               /* its length */
  char node_pfx[META_NS_MAX + 16];  /* "ecs:{ns}:node:" */
  char node_key[META_NS_MAX + 96];  /* "ecs:{ns}:node:{id}" */
  char nodes_key[META_NS_MAX + 16]; /* "ecs:{ns}:nodes" */
  char match[2 * META_NS_MAX + 16]; /* SCAN pattern for records, ns escaped */

  meta_cmd_t *q; /* queued writes */
  size_t qn;     /* queued count */
  size_t qcap;   /* queue capacity */
  int busy;      /* replies pending on c: queue_put must not auto-flush */

  int want_reg;        /* server: keep the registry entry (cleared by unregister) */
  int resync_owed;     /* records may be missing or wrong: sweep + publish owed */
  int sweeping;        /* a sweep is under way at cursor */
  char cursor[32];     /* SCAN cursor of the sweep */
  int hb_valid;        /* last_hb_ms is set */
  uint64_t last_hb_ms; /* caller's clock at the last heartbeat */
  int rc_valid;        /* last_rc_ms is set */
  uint64_t last_rc_ms; /* caller's clock at the last reconnect attempt */

  char errstr[128]; /* last Redis error */

  /* Server, asynchronous mode (ecs_meta_attach_loop): every command goes
   * over alink and nothing waits; the sync link above is used only before
   * the attach (open, the first register) and at shutdown (unregister). */
  int async;                /* attached to a loop: alink carries the traffic */
  ecs__rdsa_t alink;        /* the asynchronous link (store/redis/rds.h) */
  ecs_meta_resync_t rs;     /* the server's re-sync callbacks (copied in tick) */
  int hb_inflight;          /* a heartbeat's replies are awaited */
  int hb_expire_ok;         /* its EXPIRE found the entry */
  int hb_epoch_ok;          /* its HGET found our epoch */
  int sweep_busy;           /* a sweep step's replies are awaited */
  char del_sha[41];         /* SHA1 of meta_del_lua once SCRIPT LOAD answered ("": send the body) */
  struct meta_del_call *dq; /* eviction deletes not sent yet (one script call at the next flush) */
  size_t dq_cap;            /* bytes allocated for dq's keys */
};

__attribute__((format(printf, 2, 3))) static void meta_seterr(ecs_meta_t *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->errstr, sizeof m->errstr, fmt, ap);
  va_end(ap);
}

/* ---- parsing ---------------------------------------------------------- */

static int meta_parse_hex64(const char *s, size_t len, uint64_t *out) {
  if (len != 16)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    int c = s[i], d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return -1;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return 0;
}

/* "650,2048" (or "" for a scalar) into desc->shape/ndim. */
static int meta_parse_shape(const char *s, size_t len, ecs_tensor_desc_t *desc) {
  desc->ndim = 0;
  if (len == 0)
    return 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && s[i] != ',')
      continue;
    if (desc->ndim == ECS_MAX_DIMS || ecs__rds_parse_u64(s + start, i - start, &desc->shape[desc->ndim]) != 0)
      return -1;
    desc->ndim++;
    start = i + 1;
  }
  return 0;
}

static int meta_format_shape(const ecs_tensor_desc_t *desc, char *out, size_t cap) {
  size_t off = 0;
  out[0] = '\0';
  for (unsigned i = 0; i < desc->ndim; i++) {
    int n = snprintf(out + off, cap - off, "%s%llu", i ? "," : "", (unsigned long long)desc->shape[i]);
    if (n < 0 || (size_t)n >= cap - off)
      return -1;
    off += (size_t)n;
  }
  return (int)off;
}

/* Printable ASCII without spaces, 1..max bytes. */
static int meta_check_name(const char *s, size_t max) {
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

static void meta_queue_clear(ecs_meta_t *m) {
  for (size_t i = 0; i < m->qn; i++)
    free(m->q[i].argv);
  m->qn = 0;
}

/* Takes the link down: whatever was in flight is lost, so a re-sync is owed. */
static void meta_down(ecs_meta_t *m) {
  ecs__rds_close(&m->link);
  m->sha[0] = '\0';
  meta_queue_clear(m);
  m->resync_owed = 1;
  m->sweeping = 0;
  m->hb_valid = 0;
}

/* A failed link call: its message, and the handle down with the link (a
 * failure that dropped the link lost whatever was in flight). */
static int meta_link_fail(ecs_meta_t *m, int rc) {
  meta_seterr(m, "%s", ecs__rds_errmsg(&m->link));
  if (!ecs__rds_up(&m->link))
    meta_down(m);
  return rc;
}

/* Not connected: ECS_ECONN, like every other kind of unreachable Redis. */
static int meta_not_connected(ecs_meta_t *m) {
  if (m->errstr[0] == '\0')
    meta_seterr(m, "not connected");
  return ECS_ECONN;
}

/* Queues one command on the link, which must be up. */
static int meta_append(ecs_meta_t *m, int argc, const char **argv, const size_t *lens) {
  if (!ecs__rds_up(&m->link))
    return meta_not_connected(m);
  int rc = ecs__rds_append(&m->link, argc, argv, lens);
  return rc == ECS_OK ? ECS_OK : meta_link_fail(m, rc);
}

/*
 * Reads the next reply, waiting at most until deadline (monotonic ms).  On
 * failure the link is down and *out is NULL.  An error reply is a reply.
 * The caller frees the reply.
 */
static int meta_reply(ecs_meta_t *m, redisReply **out, uint64_t deadline) {
  *out = NULL;
  if (!ecs__rds_up(&m->link))
    return meta_not_connected(m);
  int rc = ecs__rds_reply_any(&m->link, deadline, out);
  return rc == ECS_OK ? ECS_OK : meta_link_fail(m, rc);
}

static uint64_t meta_deadline(const ecs_meta_t *m) {
  return ecs_now_ms() + (uint64_t)m->timeout_ms;
}

/* One command, one reply.  An error reply is returned as a reply. */
static int meta_cmd(ecs_meta_t *m, redisReply **out, int argc, const char **argv, const size_t *lens) {
  *out = NULL;
  int rc = meta_append(m, argc, argv, lens);
  return rc == ECS_OK ? meta_reply(m, out, meta_deadline(m)) : rc;
}

/* meta_cmd() for NUL-terminated arguments. */
static int meta_cmdv(ecs_meta_t *m, redisReply **out, int argc, const char **argv) {
  size_t lens[16];
  if (argc > 16)
    return ECS_EINVAL;
  for (int i = 0; i < argc; i++)
    lens[i] = strlen(argv[i]);
  return meta_cmd(m, out, argc, argv, lens);
}

/* A reply that is an error: records the message and returns ECS_EREDIS. */
static int meta_reply_err(ecs_meta_t *m, const redisReply *r, const char *what) {
  if (r == NULL || r->type != REDIS_REPLY_ERROR)
    return ECS_OK;
  meta_seterr(m, "%s: %.*s", what, (int)r->len, r->str);
  return ECS_EREDIS;
}

static int meta_load_script(ecs_meta_t *m) {
  const char *argv[] = {"SCRIPT", "LOAD", meta_check_lua};
  redisReply *r;
  int rc = meta_cmdv(m, &r, 3, argv);
  if (rc != ECS_OK)
    return rc;
  if (r->type == REDIS_REPLY_STRING && r->len == 40) {
    memcpy(m->sha, r->str, 40);
    m->sha[40] = '\0';
  } else {
    rc = meta_reply_err(m, r, "SCRIPT LOAD");
    if (rc == ECS_OK) {
      meta_seterr(m, "SCRIPT LOAD: unexpected reply");
      rc = ECS_EREDIS;
    }
  }
  freeReplyObject(r);
  return rc;
}

/* Connects (bounded by timeout_ms), SELECTs the db and loads the script. */
static int meta_connect(ecs_meta_t *m) {
  if (ecs__rds_up(&m->link))
    return ECS_OK;
  int rc = ecs__rds_connect(&m->link);
  if (rc != ECS_OK) {
    meta_seterr(m, "%s", ecs__rds_errmsg(&m->link));
    return rc;
  }
  rc = meta_load_script(m);
  if (rc != ECS_OK) {
    meta_down(m);
    return rc;
  }
  m->link.used = 0; /* only a caller's reply makes the link "used" */
  m->errstr[0] = '\0';
  return ECS_OK;
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
  if (o == NULL || meta_check_name(o->ns, META_NS_MAX) != 0 || strpbrk(o->ns, "{}") != NULL)
    return ECS_EINVAL;
  ecs_meta_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return ECS_ENOMEM;
  int tmo = o->timeout_ms > 0 ? o->timeout_ms : META_DEFAULT_TIMEOUT_MS;
  if (ecs__rds_init(&m->link, o->redis_url, tmo, tmo) != ECS_OK)
    goto out_inval;
  snprintf(m->ns, sizeof m->ns, "%s", o->ns);
  if (o->node_id != NULL) {
    if (meta_check_name(o->node_id, sizeof m->node_id - 1) != 0 || o->epoch == 0)
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
  m->ttl_s = o->heartbeat_ttl_s > 0 ? o->heartbeat_ttl_s : META_DEFAULT_TTL_S;
  m->reconnect_ms = o->reconnect_ms > 0 ? o->reconnect_ms : META_DEFAULT_RECONNECT_MS;
  /* "{ns}" is a Redis Cluster hash tag: a namespace's keys share one slot,
   * so the check script's keys (records and registry) are on one node */
  m->obj_pfx_len = (size_t)snprintf(m->obj_pfx, sizeof m->obj_pfx, "ecs:{%s}:obj:", m->ns);
  snprintf(m->node_pfx, sizeof m->node_pfx, "ecs:{%s}:node:", m->ns);
  snprintf(m->node_key, sizeof m->node_key, "ecs:{%s}:node:%s", m->ns, m->node_id);
  snprintf(m->nodes_key, sizeof m->nodes_key, "ecs:{%s}:nodes", m->ns);
  ecs__rds_set_route(&m->link, m->nodes_key); /* Redis Cluster: the namespace's slot */
  char esc[2 * META_NS_MAX + 1];
  meta_glob_escape(esc, sizeof esc, m->ns);
  snprintf(m->match, sizeof m->match, "ecs:{%s}:obj:*", esc);
  int rc = meta_connect(m);
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
  meta_queue_clear(m);
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

/* ---- server: registry ------------------------------------------------- */

int ecs_meta_register(ecs_meta_t *m) {
  if (m == NULL || !m->server)
    return ECS_EINVAL;
  m->want_reg = 1;
  int rc = meta_connect(m);
  if (rc != ECS_OK)
    return rc;
  char port[16] = "0", pool[24], epoch[24], started[24], ttl[16];
  const char *colon = strrchr(m->addr, ':');
  if (colon != NULL)
    snprintf(port, sizeof port, "%s", colon + 1);
  snprintf(pool, sizeof pool, "%llu", (unsigned long long)m->pool_size);
  snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)m->epoch);
  snprintf(started, sizeof started, "%llu", (unsigned long long)m->started_ms);
  snprintf(ttl, sizeof ttl, "%d", m->ttl_s);
  char fb[24];
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)(m->free_bytes ? m->free_bytes : m->pool_size));
  const char *hset[] = {"HSET", m->node_key, "addr", m->addr,   "port",  port,   "pool",
                        pool,   "epoch",     epoch,  "started", started, "free", fb};
  const char *expire[] = {"EXPIRE", m->node_key, ttl};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  const char **cmds[] = {hset, expire, sadd};
  const int argcs[] = {14, 3, 3};
  for (int i = 0; i < 3; i++) {
    size_t lens[14];
    for (int j = 0; j < argcs[i]; j++)
      lens[j] = strlen(cmds[i][j]);
    rc = meta_append(m, argcs[i], cmds[i], lens);
    if (rc != ECS_OK)
      return rc;
  }
  uint64_t deadline = meta_deadline(m);
  for (int i = 0; i < 3; i++) {
    redisReply *r;
    int e = meta_reply(m, &r, deadline);
    if (e != ECS_OK)
      return e;
    e = meta_reply_err(m, r, "register");
    freeReplyObject(r);
    if (e != ECS_OK && rc == ECS_OK)
      rc = e;
  }
  return rc;
}

/* Heartbeat: refresh the TTL, check that the entry is still ours, and keep
 * the id in the nodes set (ecs_meta_nodes() tidies out dead ids). */
static int meta_heartbeat(ecs_meta_t *m) {
  char ttl[16];
  snprintf(ttl, sizeof ttl, "%d", m->ttl_s);
  const char *expire[] = {"EXPIRE", m->node_key, ttl};
  const char *hget[] = {"HGET", m->node_key, "epoch"};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  char fb[24]; /* free bytes, for clients placing puts by load (HSET on a lost entry is harmless:
                  the check below registers again) */
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)m->free_bytes);
  const char *hset[] = {"HSET", m->node_key, "free", fb};
  size_t el[] = {6, strlen(m->node_key), strlen(ttl)};
  size_t hl[] = {4, strlen(m->node_key), 5};
  size_t sl[] = {4, strlen(m->nodes_key), strlen(m->node_id)};
  size_t fl[] = {4, strlen(m->node_key), 4, strlen(fb)};
  int arc = meta_append(m, 3, expire, el);
  if (arc == ECS_OK)
    arc = meta_append(m, 3, hget, hl);
  if (arc == ECS_OK)
    arc = meta_append(m, 3, sadd, sl);
  if (arc == ECS_OK)
    arc = meta_append(m, 4, hset, fl);
  if (arc != ECS_OK)
    return arc;
  uint64_t deadline = meta_deadline(m);
  redisReply *r1, *r2, *r3, *r4;
  int rc = meta_reply(m, &r1, deadline);
  if (rc != ECS_OK)
    return rc;
  rc = meta_reply(m, &r2, deadline);
  if (rc != ECS_OK) {
    freeReplyObject(r1);
    return rc;
  }
  rc = meta_reply(m, &r3, deadline);
  if (rc == ECS_OK && (rc = meta_reply(m, &r4, deadline)) != ECS_OK)
    freeReplyObject(r3);
  if (rc != ECS_OK) {
    freeReplyObject(r1);
    freeReplyObject(r2);
    return rc;
  }
  freeReplyObject(r3);
  freeReplyObject(r4);
  char epoch[24];
  int n = snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)m->epoch);
  int ours = r1->type == REDIS_REPLY_INTEGER && r1->integer == 1 && r2->type == REDIS_REPLY_STRING &&
             r2->len == (size_t)n && memcmp(r2->str, epoch, (size_t)n) == 0;
  rc = meta_reply_err(m, r1, "heartbeat");
  if (rc == ECS_OK)
    rc = meta_reply_err(m, r2, "heartbeat");
  freeReplyObject(r1);
  freeReplyObject(r2);
  if (rc != ECS_OK)
    return rc;
  if (!ours) {
    /* Redis lost the entry (restarted empty, or it expired while we could
     * not reach it) and readers may have deleted our records: register
     * again and publish everything again. */
    meta_seterr(m, "registry entry lost; re-registering");
    m->resync_owed = 1;
    m->sweeping = 0;
    return ecs_meta_register(m);
  }
  return ECS_OK;
}

/* ---- server: write queue ---------------------------------------------- */

/* Queues a copy of argv; on allocation failure the write is lost, so a
 * re-sync is owed. */
static void meta_enqueue(ecs_meta_t *m, int argc, const char *const *argv, const size_t *lens) {
  if (m->qn == m->qcap) {
    size_t cap = m->qcap ? m->qcap * 2 : 64;
    meta_cmd_t *q = realloc(m->q, cap * sizeof *q);
    if (q == NULL) {
      m->resync_owed = 1;
      return;
    }
    m->q = q;
    m->qcap = cap;
  }
  size_t bytes = (size_t)argc * (sizeof(char *) + sizeof(size_t));
  for (int i = 0; i < argc; i++)
    bytes += lens[i];
  char *mem = malloc(bytes);
  if (mem == NULL) {
    m->resync_owed = 1;
    return;
  }
  meta_cmd_t *c = &m->q[m->qn++];
  c->argc = argc;
  c->argv = (const char **)(void *)mem;
  c->lens = (size_t *)(void *)(mem + (size_t)argc * sizeof(char *));
  char *p = mem + (size_t)argc * (sizeof(char *) + sizeof(size_t));
  for (int i = 0; i < argc; i++) {
    memcpy(p, argv[i], lens[i]);
    c->argv[i] = p;
    c->lens[i] = lens[i];
    p += lens[i];
  }
}

/* Keeps the queue bounded during a large publish_all(). */
static void meta_maybe_autoflush(ecs_meta_t *m) {
  if (m->qn >= META_QUEUE_AUTOFLUSH && !m->busy)
    (void)ecs_meta_flush(m);
}

/* "ecs:{ns}:obj:" + key into buf; returns its length. */
static size_t meta_obj_key(const ecs_meta_t *m, char *buf, const void *key, uint16_t key_len) {
  memcpy(buf, m->obj_pfx, m->obj_pfx_len);
  memcpy(buf + m->obj_pfx_len, key, key_len);
  return m->obj_pfx_len + key_len;
}

/* The HSET of one record, formatted into f (which argv points into). */
typedef struct meta_rec_fmt {
  char key[META_KEY_MAX], epoch[24], off[24], len[24], raw[24], dtype[8], shape[ECS_MAX_DIMS * 21 + 1],
      csum[17], codec[8], t[24];
  char holder[2 + 64];             /* "h:{node}": this node holds a copy (replicas) */
  const char *argv[META_REC_ARGC]; /* HSET key field value ... */
  size_t lens[META_REC_ARGC];      /* their lengths */
} meta_rec_fmt_t;

/* Formats rec's HSET; -1 for a record that cannot be written. */
static int meta_rec_format(const ecs_meta_t *m, const ecs_meta_rec_t *rec, meta_rec_fmt_t *f) {
  if (rec->key == NULL || rec->key_len == 0 || rec->key_len > ECS_MAX_KEY || rec->desc.ndim > ECS_MAX_DIMS)
    return -1;
  size_t klen = meta_obj_key(m, f->key, rec->key, rec->key_len);
  snprintf(f->epoch, sizeof f->epoch, "%llu", (unsigned long long)m->epoch);
  snprintf(f->off, sizeof f->off, "%llu", (unsigned long long)rec->off);
  snprintf(f->len, sizeof f->len, "%llu", (unsigned long long)rec->nbytes);
  snprintf(f->raw, sizeof f->raw, "%llu", (unsigned long long)rec->raw_nbytes);
  snprintf(f->dtype, sizeof f->dtype, "%u", (unsigned)rec->desc.dtype);
  if (meta_format_shape(&rec->desc, f->shape, sizeof f->shape) < 0)
    return -1;
  snprintf(f->csum, sizeof f->csum, "%016llx", (unsigned long long)rec->checksum);
  snprintf(f->codec, sizeof f->codec, "%u", (unsigned)rec->codec);
  snprintf(f->t, sizeof f->t, "%llu", (unsigned long long)(rec->t_ms ? rec->t_ms : ecs_wall_ms()));
  snprintf(f->holder, sizeof f->holder, "h:%s", m->node_id);
  const char *argv[] = {"HSET", f->key,  "node",    m->node_id, "epoch", f->epoch, "off",     f->off,
                        "len",  f->len,  "raw_len", f->raw,     "dtype", f->dtype, "shape",   f->shape,
                        "csum", f->csum, "codec",   f->codec,   "t",     f->t,     f->holder, f->epoch};
  _Static_assert(sizeof argv / sizeof argv[0] == META_REC_ARGC, "record argv");
  for (int i = 0; i < META_REC_ARGC; i++) { /* argv[1] is the binary key: never strlen it */
    f->argv[i] = argv[i];
    f->lens[i] = i == 1 ? klen : strlen(argv[i]);
  }
  return 0;
}

static void meta_async_write(ecs_meta_t *m, int argc, const char **argv, const size_t *lens);
static void meta_dq_flush(ecs_meta_t *m);

void ecs_meta_queue_put(ecs_meta_t *m, const ecs_meta_rec_t *rec) {
  if (m == NULL || !m->server || rec == NULL)
    return;
  meta_rec_fmt_t f;
  if (m->async) {
    if (meta_rec_format(m, rec, &f) == 0)
      meta_async_write(m, META_REC_ARGC, f.argv, f.lens);
    return;
  }
  if (!ecs__rds_up(&m->link))
    return; /* down: the re-sync after the reconnect publishes it */
  if (meta_rec_format(m, rec, &f) != 0)
    return;
  meta_enqueue(m, META_REC_ARGC, f.argv, f.lens);
  meta_maybe_autoflush(m);
}

static int meta_send_awaited(ecs_meta_t *m, int argc, const char **argv, const size_t *lens,
                             ecs_meta_done_fn done, void *ctx);

static int meta_del_now(ecs_meta_t *m, const char *k, size_t klen, ecs_meta_done_fn done, void *ctx);
static void meta_dq_add(ecs_meta_t *m, const char *k, size_t klen);

int ecs_meta_del_async(ecs_meta_t *m, const void *key, uint16_t key_len, ecs_meta_done_fn done, void *ctx) {
  if (m == NULL || !m->async || key == NULL || key_len == 0 || key_len > ECS_MAX_KEY || done == NULL)
    return ECS_EINVAL;
  char k[META_KEY_MAX];
  size_t klen = meta_obj_key(m, k, key, key_len);
  return meta_del_now(m, k, klen, done, ctx);
}

void ecs_meta_queue_del(ecs_meta_t *m, const void *key, uint16_t key_len) {
  if (m == NULL || !m->server || (!m->async && !ecs__rds_up(&m->link)) || key == NULL || key_len == 0 ||
      key_len > ECS_MAX_KEY)
    return;
  char k[META_KEY_MAX];
  size_t klen = meta_obj_key(m, k, key, key_len);
  if (m->async) { /* sent with the next flush, one script call for all */
    meta_dq_add(m, k, klen);
    return;
  }
  const char *argv[] = {"EVAL", meta_del_lua, "1", k, m->node_id};
  size_t lens[] = {4, sizeof meta_del_lua - 1, 1, klen, strlen(m->node_id)};
  meta_enqueue(m, 5, argv, lens);
  meta_maybe_autoflush(m);
}

int ecs_meta_flush(ecs_meta_t *m) {
  if (m == NULL || !m->server)
    return ECS_EINVAL;
  if (m->async) { /* commands leave with the loop's next write event */
    meta_dq_flush(m);
    return ecs__rdsa_up(&m->alink) ? ECS_OK : meta_not_connected(m);
  }
  if (!ecs__rds_up(&m->link)) {
    meta_queue_clear(m);
    return meta_not_connected(m);
  }
  if (m->qn == 0)
    return ECS_OK;
  for (size_t i = 0; i < m->qn; i++) {
    int rc = meta_append(m, m->q[i].argc, m->q[i].argv, m->q[i].lens);
    if (rc != ECS_OK)
      return rc; /* the link is down and the queue dropped */
  }
  size_t n = m->qn;
  meta_queue_clear(m);
  uint64_t deadline = meta_deadline(m);
  int rc = ECS_OK;
  m->busy = 1;
  for (size_t i = 0; i < n; i++) {
    redisReply *r;
    int e = meta_reply(m, &r, deadline);
    if (e != ECS_OK) {
      rc = e;
      break;
    }
    if (meta_reply_err(m, r, "flush") != ECS_OK) {
      /* A write failed (say WRONGTYPE or OOM): Redis may now name a
       * record we do not hold, or miss one; the sweep repairs both. */
      m->resync_owed = 1;
      rc = ECS_EREDIS;
    }
    freeReplyObject(r);
  }
  m->busy = 0;
  return rc;
}

/* ---- the check script: exists, lookup, sweep -------------------------- */

/*
 * Runs meta_check_lua in `mode` over keys[0..n) (each 1..ECS_MAX_KEY bytes,
 * already checked), as pipelined chunks of META_CHUNK keys: one round trip.
 * Calls each(ctx, i, element) for every key's result.  On failure nothing
 * has been passed to each() for sure, so callers reset their outputs.
 */
typedef void (*meta_each_fn)(void *ctx, size_t i, const redisReply *e);

typedef struct meta_batch {
  const uint8_t *const *keys; /* the caller's keys */
  const uint16_t *lens;       /* their lengths */
  const size_t *idx;          /* positions of the valid keys */
  size_t n;                   /* number of valid keys */
  char mode[2];               /* "e", "l" or "s" */
  char nk[24];                /* scratch: one chunk's key count */
  const char **argv;          /* scratch: one chunk's arguments */
  size_t *argl;               /* scratch: their lengths */
  char *kbuf;                 /* scratch: one chunk's Redis keys */
} meta_batch_t;

/* Builds chunk ci's argv with EVALSHA (or EVAL with the body); returns argc. */
static int meta_chunk_argv(ecs_meta_t *m, meta_batch_t *b, size_t ci, int eval) {
  size_t lo = ci * META_CHUNK, hi = lo + META_CHUNK < b->n ? lo + META_CHUNK : b->n;
  int a = 0;
  snprintf(b->nk, sizeof b->nk, "%zu", hi - lo);
  b->argv[a] = eval ? "EVAL" : "EVALSHA";
  b->argl[a] = strlen(b->argv[a]);
  a++;
  b->argv[a] = eval ? meta_check_lua : m->sha;
  b->argl[a] = eval ? sizeof meta_check_lua - 1 : strlen(m->sha);
  a++;
  b->argv[a] = b->nk;
  b->argl[a++] = strlen(b->nk);
  char *p = b->kbuf;
  for (size_t j = lo; j < hi; j++) {
    size_t i = b->idx[j];
    size_t kl = meta_obj_key(m, p, b->keys[i], b->lens[i]);
    b->argv[a] = p;
    b->argl[a++] = kl;
    p += kl;
  }
  b->argv[a] = m->node_pfx;
  b->argl[a++] = strlen(m->node_pfx);
  b->argv[a] = b->mode;
  b->argl[a++] = 1;
  b->argv[a] = m->node_id;
  b->argl[a++] = strlen(m->node_id);
  return a;
}

static int meta_is_noscript(const redisReply *r) {
  return r->type == REDIS_REPLY_ERROR && r->len >= 8 && memcmp(r->str, "NOSCRIPT", 8) == 0;
}

/* Checks one chunk's reply and hands its elements to each(). */
static int meta_chunk_done(ecs_meta_t *m, meta_batch_t *b, size_t ci, const redisReply *r, meta_each_fn each,
                           void *ctx) {
  size_t lo = ci * META_CHUNK, hi = lo + META_CHUNK < b->n ? lo + META_CHUNK : b->n;
  int rc = meta_reply_err(m, r, "check script");
  if (rc != ECS_OK)
    return rc;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != hi - lo) {
    meta_seterr(m, "check script: unexpected reply");
    return ECS_EREDIS;
  }
  for (size_t j = lo; j < hi; j++)
    each(ctx, b->idx[j], r->element[j - lo]);
  return ECS_OK;
}

static int meta_run_check(ecs_meta_t *m, meta_batch_t *b, meta_each_fn each, void *ctx) {
  size_t nchunks = (b->n + META_CHUNK - 1) / META_CHUNK;
  if (nchunks == 0)
    return ECS_OK;
  size_t cap = META_CHUNK < b->n ? META_CHUNK : b->n;
  b->argv = malloc((cap + 6) * sizeof *b->argv);
  b->argl = malloc((cap + 6) * sizeof *b->argl);
  b->kbuf = malloc(cap * (m->obj_pfx_len + ECS_MAX_KEY));
  char *noscript = calloc(nchunks, 1);
  int rc = ECS_OK;
  if (b->argv == NULL || b->argl == NULL || b->kbuf == NULL || noscript == NULL) {
    rc = ECS_ENOMEM;
    goto out;
  }
  for (size_t ci = 0; ci < nchunks; ci++) {
    int argc = meta_chunk_argv(m, b, ci, m->sha[0] == '\0');
    rc = meta_append(m, argc, b->argv, b->argl);
    if (rc != ECS_OK)
      goto out;
  }
  uint64_t deadline = meta_deadline(m);
  /* Read every reply before acting on any error, so that the link stays
   * in step.  A NOSCRIPT chunk (the script cache was flushed) is sent again
   * with the script's body once the pipeline is drained. */
  m->busy = 1;
  for (size_t ci = 0; ci < nchunks; ci++) {
    redisReply *r;
    int e = meta_reply(m, &r, deadline);
    if (e != ECS_OK) {
      rc = e;
      goto out;
    }
    if (meta_is_noscript(r))
      noscript[ci] = 1;
    else if (rc == ECS_OK)
      rc = meta_chunk_done(m, b, ci, r, each, ctx);
    freeReplyObject(r);
  }
  for (size_t ci = 0; ci < nchunks && rc == ECS_OK; ci++) {
    if (!noscript[ci])
      continue;
    redisReply *r;
    int argc = meta_chunk_argv(m, b, ci, 1);
    rc = meta_cmd(m, &r, argc, b->argv, b->argl);
    if (rc != ECS_OK)
      goto out;
    rc = meta_chunk_done(m, b, ci, r, each, ctx);
    freeReplyObject(r);
    if (m->sha[0] != '\0' && meta_load_script(m) != ECS_OK)
      m->sha[0] = '\0'; /* EVAL from now on (or the link is down) */
  }
out:
  m->busy = 0;
  free(noscript);
  free(b->argv);
  free(b->argl);
  free(b->kbuf);
  return rc;
}

/* The valid keys' positions (invalid ones are left out of the batch). */
static size_t *meta_valid_idx(const uint16_t *lens, size_t n, size_t *nvalid) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx);
  size_t k = 0;
  if (idx != NULL)
    for (size_t i = 0; i < n; i++)
      if (lens[i] >= 1 && lens[i] <= ECS_MAX_KEY)
        idx[k++] = i;
  *nvalid = k;
  return idx;
}

/* Clients reconnect on demand; servers only in tick(), which re-syncs. */
static int meta_ensure_link(ecs_meta_t *m) {
  if (ecs__rds_up(&m->link))
    return ECS_OK;
  if (m->server)
    return meta_not_connected(m);
  return meta_connect(m);
}

/* Runs a check batch; a client whose pooled link had gone stale (Redis
 * restarted: EOF or reset, not a timeout) retries once on a fresh one. */
static int meta_check_batch(ecs_meta_t *m, meta_batch_t *b, meta_each_fn each, void *ctx) {
  int rc = meta_ensure_link(m);
  if (rc != ECS_OK)
    return rc;
  int was_used = m->link.used;
  rc = meta_run_check(m, b, each, ctx);
  if (rc == ECS_ECONN && !ecs__rds_up(&m->link) && was_used && !m->server) {
    rc = meta_connect(m);
    if (rc == ECS_OK)
      rc = meta_run_check(m, b, each, ctx);
  }
  return rc;
}

static void meta_each_exists(void *ctx, size_t i, const redisReply *e) {
  int *exists = ctx;
  exists[i] = e->type == REDIS_REPLY_INTEGER && e->integer == 1;
}

int ecs_meta_exists_batch(ecs_meta_t *m, const uint8_t *const *keys, const uint16_t *lens, size_t n,
                          int *exists) {
  if (n > 0 && (exists == NULL || keys == NULL || lens == NULL))
    return ECS_EINVAL;
  for (size_t i = 0; i < n; i++)
    exists[i] = 0;
  if (m == NULL)
    return ECS_EINVAL;
  meta_batch_t b = {.keys = keys, .lens = lens, .mode = "e"};
  size_t *idx = meta_valid_idx(lens, n, &b.n);
  if (idx == NULL)
    return ECS_ENOMEM;
  b.idx = idx;
  int rc = b.n ? meta_check_batch(m, &b, meta_each_exists, exists) : ECS_OK;
  free(idx);
  if (rc != ECS_OK)
    for (size_t i = 0; i < n; i++)
      exists[i] = 0;
  return rc;
}

typedef struct meta_lookup_ctx {
  ecs_meta_rec_t *recs; /* the caller's records */
  int *status;          /* the caller's statuses */
} meta_lookup_ctx_t;

#define META_FIELD(e, j) ((e)->element[j]->type == REDIS_REPLY_STRING)

/* Parses the fields (node epoch off len raw_len dtype shape csum codec t)
 * and the live holders' (node, epoch) pairs after them (at least one;
 * beyond ECS_META_MAX_HOLDERS the rest are left out). */
static int meta_parse_rec(const redisReply *e, ecs_meta_rec_t *rec) {
  if (e->type != REDIS_REPLY_ARRAY || e->elements < META_REC_FIELDS + 2 ||
      (e->elements - META_REC_FIELDS) % 2 != 0)
    return -1;
  for (size_t j = 0; j < e->elements; j++)
    if (!META_FIELD(e, j))
      return -1;
  const redisReply *const *f = (const redisReply *const *)e->element;
  uint64_t dtype, codec;
  if (ecs__rds_parse_u64(f[2]->str, f[2]->len, &rec->off) ||
      ecs__rds_parse_u64(f[3]->str, f[3]->len, &rec->nbytes) ||
      ecs__rds_parse_u64(f[4]->str, f[4]->len, &rec->raw_nbytes) ||
      ecs__rds_parse_u64(f[5]->str, f[5]->len, &dtype) || dtype > 255 ||
      meta_parse_shape(f[6]->str, f[6]->len, &rec->desc) ||
      meta_parse_hex64(f[7]->str, f[7]->len, &rec->checksum) ||
      ecs__rds_parse_u64(f[8]->str, f[8]->len, &codec) || codec > 255 ||
      ecs__rds_parse_u64(f[9]->str, f[9]->len, &rec->t_ms))
    return -1;
  rec->desc.dtype = (uint8_t)dtype;
  rec->codec = (uint8_t)codec;
  rec->nholders = 0;
  for (size_t j = META_REC_FIELDS; j + 1 < e->elements; j += 2) {
    const redisReply *id = f[j], *ep = f[j + 1];
    if (rec->nholders == ECS_META_MAX_HOLDERS)
      break;
    ecs_meta_holder_t *h = &rec->holders[rec->nholders];
    if (id->len == 0 || id->len >= sizeof h->node_id || memchr(id->str, '\0', id->len) != NULL ||
        ecs__rds_parse_u64(ep->str, ep->len, &h->epoch))
      return -1;
    memcpy(h->node_id, id->str, id->len);
    h->node_id[id->len] = '\0';
    rec->nholders++;
  }
  /* node and epoch: the last writer ("node") while it is a live holder,
   * else the first live holder */
  size_t pick = 0;
  for (size_t h = 0; h < rec->nholders; h++)
    if (f[0]->len == strlen(rec->holders[h].node_id) &&
        !memcmp(f[0]->str, rec->holders[h].node_id, f[0]->len)) {
      pick = h;
      break;
    }
  memcpy(rec->node_id, rec->holders[pick].node_id, sizeof rec->node_id);
  rec->epoch = rec->holders[pick].epoch;
  return 0;
}

int ecs__meta_parse_rec(const struct redisReply *e, ecs_meta_rec_t *rec) {
  return meta_parse_rec(e, rec);
}

static void meta_each_lookup(void *ctx, size_t i, const redisReply *e) {
  meta_lookup_ctx_t *c = ctx;
  ecs_meta_rec_t *rec = &c->recs[i];
  if (e->type == REDIS_REPLY_INTEGER) {
    c->status[i] = e->integer == -1 ? ECS_ESTALE : ECS_ENOTFOUND;
    return;
  }
  /* A record that does not parse names nothing we could fetch: a miss. */
  c->status[i] = meta_parse_rec(e, rec) == 0 ? ECS_OK : ECS_ENOTFOUND;
  if (c->status[i] != ECS_OK) {
    const uint8_t *key = rec->key;
    uint16_t len = rec->key_len;
    memset(rec, 0, sizeof *rec);
    rec->key = key;
    rec->key_len = len;
  }
}

int ecs_meta_lookup_batch(ecs_meta_t *m, const uint8_t *const *keys, const uint16_t *lens, size_t n,
                          ecs_meta_rec_t *recs, int *status) {
  if (n > 0 && (recs == NULL || status == NULL || keys == NULL || lens == NULL))
    return ECS_EINVAL;
  for (size_t i = 0; i < n; i++) {
    memset(&recs[i], 0, sizeof recs[i]);
    recs[i].key = keys[i];
    recs[i].key_len = lens[i];
    status[i] = (lens[i] >= 1 && lens[i] <= ECS_MAX_KEY) ? ECS_ENOTFOUND : ECS_EKEY;
  }
  if (m == NULL)
    return ECS_EINVAL;
  meta_batch_t b = {.keys = keys, .lens = lens, .mode = "l"};
  size_t *idx = meta_valid_idx(lens, n, &b.n);
  if (idx == NULL)
    return ECS_ENOMEM;
  b.idx = idx;
  meta_lookup_ctx_t ctx = {recs, status};
  int rc = b.n ? meta_check_batch(m, &b, meta_each_lookup, &ctx) : ECS_OK;
  free(idx);
  if (rc != ECS_OK)
    for (size_t i = 0; i < n; i++) {
      memset(&recs[i], 0, sizeof recs[i]);
      recs[i].key = keys[i];
      recs[i].key_len = lens[i];
      if (status[i] != ECS_EKEY)
        status[i] = ECS_ENOTFOUND;
    }
  return rc;
}

void ecs_meta_set_free(ecs_meta_t *m, uint64_t free_bytes) {
  if (m != NULL)
    m->free_bytes = free_bytes;
}

int ecs_meta_nodes(ecs_meta_t *m, ecs_meta_node_t *out, size_t max, size_t *n) {
  if (m == NULL || n == NULL || (max > 0 && out == NULL))
    return ECS_EINVAL;
  *n = 0;
  int rc = meta_ensure_link(m);
  if (rc != ECS_OK)
    return rc;
  const char *smembers[] = {"SMEMBERS", m->nodes_key};
  redisReply *set;
  rc = meta_cmdv(m, &set, 2, smembers);
  if (rc != ECS_OK)
    return rc;
  rc = meta_reply_err(m, set, "SMEMBERS");
  if (rc == ECS_OK && set->type != REDIS_REPLY_ARRAY) {
    meta_seterr(m, "SMEMBERS: unexpected reply");
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
    rc = meta_append(m, 6, argv, lens);
    if (rc != ECS_OK) {
      freeReplyObject(set);
      return rc;
    }
    cnt++;
  }
  uint64_t deadline = meta_deadline(m);
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
    int e = meta_reply(m, &r, deadline);
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
    uint64_t epoch, pool;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 4 && META_FIELD(r, 0) && META_FIELD(r, 1) &&
        META_FIELD(r, 2) && r->element[0]->len < sizeof out->addr &&
        ecs__rds_parse_u64(r->element[1]->str, r->element[1]->len, &epoch) == 0 &&
        ecs__rds_parse_u64(r->element[2]->str, r->element[2]->len, &pool) == 0 && k < max) {
      ecs_meta_node_t *nd = &out[k++];
      memset(nd, 0, sizeof *nd);
      memcpy(nd->node_id, id->str, id->len);
      memcpy(nd->addr, r->element[0]->str, r->element[0]->len);
      nd->epoch = epoch;
      nd->pool_size = pool;
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
    if (meta_cmd(m, &r, (int)(ndead + 2), dead, deadl) == ECS_OK)
      freeReplyObject(r);
  }
  free(dead);
  free(deadl);
  freeReplyObject(set);
  *n = k;
  return ECS_OK;
}

/* ---- server: re-sync and shutdown ------------------------------------- */

typedef struct meta_sweep_ctx {
  ecs_meta_t *m;               /* the handle */
  const ecs_meta_resync_t *rs; /* has_key, or NULL: keep every live record of ours */
  const uint8_t *const *keys;  /* this step's keys (without the prefix) */
  const uint16_t *lens;        /* their lengths */
} meta_sweep_ctx_t;

static void meta_each_sweep(void *ctx, size_t i, const redisReply *e) {
  meta_sweep_ctx_t *c = ctx;
  /* 1: a live record of ours.  Stale ones (-1) the script deleted. */
  if (e->type == REDIS_REPLY_INTEGER && e->integer == 1 && c->rs != NULL && c->rs->has_key != NULL &&
      !c->rs->has_key(c->rs->ctx, c->keys[i], c->lens[i]))
    ecs_meta_queue_del(c->m, c->keys[i], c->lens[i]);
}

/*
 * One SCAN step over this namespace's records: the check script deletes the
 * stale ones (of any node) and reports which live ones are ours; those the
 * server no longer holds are deleted.  *done is set when the cursor is back
 * at 0.
 */
static int meta_sweep_step(ecs_meta_t *m, const ecs_meta_resync_t *rs, int *done) {
  const char *argv[] = {"SCAN", m->cursor, "MATCH", m->match, "COUNT", META_SCAN_COUNT};
  redisReply *r;
  *done = 0;
  int rc = meta_cmdv(m, &r, 6, argv);
  if (rc != ECS_OK)
    return rc;
  rc = meta_reply_err(m, r, "SCAN");
  if (rc == ECS_OK &&
      (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
       r->element[0]->len >= sizeof m->cursor || r->element[1]->type != REDIS_REPLY_ARRAY)) {
    meta_seterr(m, "SCAN: unexpected reply");
    rc = ECS_EREDIS;
  }
  if (rc != ECS_OK) {
    freeReplyObject(r);
    return rc;
  }
  const redisReply *list = r->element[1];
  const uint8_t **keys = malloc((list->elements ? list->elements : 1) * sizeof *keys);
  uint16_t *lens = malloc((list->elements ? list->elements : 1) * sizeof *lens);
  size_t nk = 0;
  if (keys == NULL || lens == NULL) {
    rc = ECS_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < list->elements; i++) {
    const redisReply *k = list->element[i];
    if (k->type != REDIS_REPLY_STRING || k->len <= m->obj_pfx_len || k->len - m->obj_pfx_len > ECS_MAX_KEY ||
        memcmp(k->str, m->obj_pfx, m->obj_pfx_len) != 0)
      continue;
    keys[nk] = (const uint8_t *)k->str + m->obj_pfx_len;
    lens[nk] = (uint16_t)(k->len - m->obj_pfx_len);
    nk++;
  }
  if (nk > 0) {
    meta_batch_t b = {.keys = keys, .lens = lens, .mode = "s"};
    size_t *idx = meta_valid_idx(lens, nk, &b.n);
    if (idx == NULL) {
      rc = ECS_ENOMEM;
      goto out;
    }
    b.idx = idx;
    meta_sweep_ctx_t ctx = {m, rs, keys, lens};
    rc = meta_run_check(m, &b, meta_each_sweep, &ctx);
    free(idx);
    if (rc == ECS_OK)
      rc = ecs_meta_flush(m);
  }
  if (rc == ECS_OK) {
    memcpy(m->cursor, r->element[0]->str, r->element[0]->len);
    m->cursor[r->element[0]->len] = '\0';
    *done = strcmp(m->cursor, "0") == 0;
  }
out:
  free(keys);
  free(lens);
  freeReplyObject(r);
  return rc;
}

/* Advances the owed re-sync by at most META_SCAN_STEPS SCAN calls; when
 * the sweep is complete, publishes everything. */
static int meta_resync(ecs_meta_t *m, const ecs_meta_resync_t *rs) {
  if (!m->sweeping) {
    m->sweeping = 1;
    m->resync_owed = 0;
    snprintf(m->cursor, sizeof m->cursor, "0");
  }
  for (int step = 0; step < META_SCAN_STEPS; step++) {
    int done, rc = meta_sweep_step(m, rs, &done);
    if (rc != ECS_OK)
      return rc;
    if (done) {
      m->sweeping = 0;
      if (m->resync_owed) /* a write failed during the sweep: start over */
        return ECS_OK;
      if (rs->publish_all != NULL)
        rs->publish_all(rs->ctx, m);
      return ecs_meta_flush(m);
    }
  }
  return ECS_OK;
}

/* ---- server: the asynchronous mode ------------------------------------ */

/*
 * Attached to the server's loop, the handle never waits: records, deletes,
 * the registry, the heartbeat and the re-sync sweep are commands on alink
 * whose replies arrive as callbacks from the loop.  What each reply means
 * is the same as in the blocking code above; the differences are who
 * waits (nobody) and how a deadline is noticed (ecs_meta_poll()).
 */

/* Every command of the asynchronous mode goes through here: queued
 * eviction deletes leave first, so that no later command overtakes them
 * (a put of a key evicted just before must find its delete done, not
 * have its fresh record deleted after it). */
static int meta_acmd(ecs_meta_t *m, ecs__rdsa_fn fn, void *ctx, int argc, const char **argv,
                     const size_t *lens) {
  meta_dq_flush(m);
  return ecs__rdsa_command(&m->alink, fn, ctx, argc, argv, lens);
}

/* A write whose reply only matters when it failed: an error reply (OOM,
 * WRONGTYPE) means Redis may now miss a record, so a re-sync is owed; a
 * dropped link owes one anyway (meta_async_down). */
static void meta_write_done(void *ctx, int rc, redisReply *reply) {
  ecs_meta_t *m = ctx;
  (void)reply;
  if (rc == ECS_EREDIS && ecs__rdsa_up(&m->alink)) {
    meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
    m->resync_owed = 1;
  }
}

/* Sends a write; when it cannot be sent, the re-sync will cover it. */
static void meta_async_write(ecs_meta_t *m, int argc, const char **argv, const size_t *lens) {
  if (meta_acmd(m, meta_write_done, m, argc, argv, lens) != ECS_OK)
    m->resync_owed = 1;
}

typedef struct meta_put_wait {
  ecs_meta_t *m;         /* the handle */
  ecs_meta_done_fn done; /* the caller's callback */
  void *ctx;             /* its argument */
} meta_put_wait_t;

static void meta_put_done(void *ctx, int rc, redisReply *reply) {
  meta_put_wait_t *w = ctx;
  meta_write_done(w->m, rc, reply);
  w->done(w->ctx, rc);
  free(w);
}

int ecs_meta_put_async(ecs_meta_t *m, const ecs_meta_rec_t *rec, ecs_meta_done_fn done, void *ctx) {
  if (m == NULL || !m->async || rec == NULL || done == NULL)
    return ECS_EINVAL;
  meta_rec_fmt_t f;
  if (meta_rec_format(m, rec, &f) != 0)
    return ECS_EINVAL;
  return meta_send_awaited(m, META_REC_ARGC, f.argv, f.lens, done, ctx);
}

/* Sends a write whose outcome the caller awaits through done. */
static int meta_send_awaited(ecs_meta_t *m, int argc, const char **argv, const size_t *lens,
                             ecs_meta_done_fn done, void *ctx) {
  meta_put_wait_t *w = malloc(sizeof *w);
  if (w == NULL)
    return ECS_ENOMEM;
  *w = (meta_put_wait_t){m, done, ctx};
  int rc = meta_acmd(m, meta_put_done, w, argc, argv, lens);
  if (rc != ECS_OK) {
    free(w);
    m->resync_owed = 1;
    if (m->errstr[0] == '\0')
      meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink)[0] ? ecs__rdsa_errmsg(&m->alink) : "not connected");
    return ECS_ENOTCONN;
  }
  return ECS_OK;
}

/* ---- record deletes: one script call per flush -------------------------- */

/*
 * A script call deleting the records of n keys (meta_del_lua).  Eviction
 * deletes queue up in m->dq until the next flush, or until any other
 * command leaves (meta_acmd), and go as one call: Redis runs the script
 * once for all of them instead of once per key.  A REMOVE's delete goes
 * at once, alone, and is awaited (done).
 */
typedef struct meta_del_call {
  ecs_meta_t *m;         /* the handle */
  ecs_meta_done_fn done; /* awaited (a REMOVE): the caller's callback, else NULL */
  void *ctx;             /* its argument */
  int retried;           /* sent again with the script's body after NOSCRIPT */
  size_t n;              /* keys */
  size_t len;            /* bytes of keys[] used */
  uint8_t keys[];        /* n times: a 2-byte length, then that Redis key */
} meta_del_call_t;

static void meta_del_done(void *ctx, int rc, redisReply *reply);

/* Sends call as one EVALSHA (EVAL with the body when eval is set or the
 * script's SHA is not known yet). */
static int meta_del_send(ecs_meta_t *m, meta_del_call_t *call, int eval) {
  size_t argc = call->n + 4;
  const char **argv = malloc(argc * sizeof *argv);
  size_t *lens = malloc(argc * sizeof *lens);
  if (argv == NULL || lens == NULL) {
    free(argv);
    free(lens);
    return ECS_ENOMEM;
  }
  char nk[24];
  snprintf(nk, sizeof nk, "%zu", call->n);
  eval |= m->del_sha[0] == '\0';
  argv[0] = eval ? "EVAL" : "EVALSHA";
  lens[0] = strlen(argv[0]);
  argv[1] = eval ? meta_del_lua : m->del_sha;
  lens[1] = eval ? sizeof meta_del_lua - 1 : strlen(m->del_sha);
  argv[2] = nk;
  lens[2] = strlen(nk);
  const uint8_t *p = call->keys;
  for (size_t i = 0; i < call->n; i++) {
    uint16_t kl;
    memcpy(&kl, p, sizeof kl);
    argv[3 + i] = (const char *)p + sizeof kl;
    lens[3 + i] = kl;
    p += sizeof kl + kl;
  }
  argv[argc - 1] = m->node_id;
  lens[argc - 1] = strlen(m->node_id);
  int rc = ecs__rdsa_command(&m->alink, meta_del_done, call, (int)argc, argv, lens);
  free(argv);
  free(lens);
  return rc;
}

/* Keeps in call only the keys this server does not hold (again): the
 * deletes still owed after a NOSCRIPT.  0, or -1 when it cannot tell. */
static int meta_del_filter(ecs_meta_t *m, meta_del_call_t *call) {
  if (m->rs.has_key == NULL)
    return -1;
  uint8_t *rd = call->keys, *wr = call->keys;
  size_t kept = 0;
  for (size_t i = 0; i < call->n; i++) {
    uint16_t kl;
    memcpy(&kl, rd, sizeof kl);
    size_t sz = sizeof kl + kl;
    const uint8_t *key = rd + sizeof kl + m->obj_pfx_len;
    if (!m->rs.has_key(m->rs.ctx, key, (uint16_t)(kl - m->obj_pfx_len))) {
      memmove(wr, rd, sz);
      wr += sz;
      kept++;
    }
    rd += sz;
  }
  call->n = kept;
  call->len = (size_t)(wr - call->keys);
  return 0;
}

/*
 * A delete call's reply.  NOSCRIPT: Redis forgot the script (SCRIPT
 * FLUSH, a restart, a failover to a node that never loaded it).  The
 * commands sent after this one have run meanwhile, so a key put here
 * again since must keep its new record: only the keys this server still
 * does not hold are sent again, with the body, which caches the script
 * again under the same SHA.  Any other failure owes a re-sync, as for
 * every write.
 */
static void meta_del_done(void *ctx, int rc, redisReply *reply) {
  meta_del_call_t *call = ctx;
  ecs_meta_t *m = call->m;
  if (rc == ECS_EREDIS && reply != NULL && meta_is_noscript(reply) && !call->retried) {
    call->retried = 1;
    if (meta_del_filter(m, call) != 0) {
      m->resync_owed = 1; /* the sweep deletes what we no longer hold */
    } else if (call->n == 0) {
      rc = ECS_OK;
    } else if (meta_del_send(m, call, 1) == ECS_OK) {
      return; /* answered by the retry */
    } else {
      m->resync_owed = 1;
      rc = ECS_ENOTCONN;
    }
  } else {
    meta_write_done(m, rc, reply);
  }
  if (call->done != NULL)
    call->done(call->ctx, rc);
  free(call);
}

/* Queues the delete of Redis key k (klen bytes) for the next flush. */
static void meta_dq_add(ecs_meta_t *m, const char *k, size_t klen) {
  size_t need = sizeof(uint16_t) + klen, used = m->dq ? m->dq->len : 0;
  if (m->dq == NULL || used + need > m->dq_cap) {
    size_t cap = m->dq_cap ? m->dq_cap * 2 : 4096;
    while (cap < used + need)
      cap *= 2;
    meta_del_call_t *q = realloc(m->dq, sizeof *q + cap);
    if (q == NULL) {
      m->resync_owed = 1; /* the delete is lost: the sweep makes up for it */
      return;
    }
    if (m->dq == NULL)
      *q = (meta_del_call_t){.m = m};
    m->dq = q;
    m->dq_cap = cap;
  }
  uint16_t kl = (uint16_t)klen;
  memcpy(m->dq->keys + used, &kl, sizeof kl);
  memcpy(m->dq->keys + used + sizeof kl, k, klen);
  m->dq->len = used + need;
  if (++m->dq->n >= META_CHUNK)
    meta_dq_flush(m);
}

/* Sends the queued deletes as one script call; the call's record goes
 * with it (a new queue starts at the next delete). */
static void meta_dq_flush(ecs_meta_t *m) {
  meta_del_call_t *call = m->dq;
  if (call == NULL || call->n == 0)
    return;
  m->dq = NULL;
  m->dq_cap = 0;
  if (meta_del_send(m, call, 0) != ECS_OK) {
    free(call);
    m->resync_owed = 1; /* not sent: the re-sync covers it */
  }
}

/* A REMOVE's delete: alone, at once (after the queued ones), awaited. */
static int meta_del_now(ecs_meta_t *m, const char *k, size_t klen, ecs_meta_done_fn done, void *ctx) {
  meta_dq_flush(m);
  meta_del_call_t *call = malloc(sizeof *call + sizeof(uint16_t) + klen);
  if (call == NULL)
    return ECS_ENOMEM;
  *call = (meta_del_call_t){.m = m, .done = done, .ctx = ctx, .n = 1, .len = sizeof(uint16_t) + klen};
  uint16_t kl = (uint16_t)klen;
  memcpy(call->keys, &kl, sizeof kl);
  memcpy(call->keys + sizeof kl, k, klen);
  if (meta_del_send(m, call, 0) != ECS_OK) {
    free(call);
    m->resync_owed = 1;
    if (m->errstr[0] == '\0')
      meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink)[0] ? ecs__rdsa_errmsg(&m->alink) : "not connected");
    return ECS_ENOTCONN;
  }
  return ECS_OK;
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
  snprintf(ttl, sizeof ttl, "%d", m->ttl_s);
  char fb[24]; /* free bytes, for clients placing puts by load */
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)(m->free_bytes ? m->free_bytes : m->pool_size));
  const char *hset[] = {"HSET", m->node_key, "addr", m->addr,   "port",  port,   "pool",
                        pool,   "epoch",     epoch,  "started", started, "free", fb};
  const char *expire[] = {"EXPIRE", m->node_key, ttl};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  meta_async_write(m, 14, hset, NULL);
  meta_async_write(m, 3, expire, NULL);
  meta_async_write(m, 3, sadd, NULL);
}

static void meta_sweep_start(ecs_meta_t *m);

static void meta_hb_expire_done(void *ctx, int rc, redisReply *r) {
  ecs_meta_t *m = ctx;
  m->hb_expire_ok = rc == ECS_OK && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

static void meta_hb_epoch_done(void *ctx, int rc, redisReply *r) {
  ecs_meta_t *m = ctx;
  char epoch[24];
  int n = snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)m->epoch);
  m->hb_epoch_ok = rc == ECS_OK && r->type == REDIS_REPLY_STRING && r->len == (size_t)n &&
                   memcmp(r->str, epoch, (size_t)n) == 0;
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
    meta_seterr(m, "registry entry lost; re-registering");
    m->resync_owed = 1;
    meta_register_async(m);
    return;
  }
  if (m->resync_owed && !m->sweeping)
    meta_sweep_start(m);
}

static void meta_heartbeat_async(ecs_meta_t *m) {
  char ttl[16];
  snprintf(ttl, sizeof ttl, "%d", m->ttl_s);
  const char *expire[] = {"EXPIRE", m->node_key, ttl};
  const char *hget[] = {"HGET", m->node_key, "epoch"};
  const char *sadd[] = {"SADD", m->nodes_key, m->node_id};
  /* free bytes, for clients placing puts by load; sent first, so that on a
   * lost entry the EXPIRE below still gives what it creates a TTL, and the
   * epoch check re-registers it whole */
  char fb[24];
  snprintf(fb, sizeof fb, "%llu", (unsigned long long)m->free_bytes);
  const char *hset[] = {"HSET", m->node_key, "free", fb};
  m->hb_expire_ok = m->hb_epoch_ok = 0;
  meta_async_write(m, 4, hset, NULL);
  if (meta_acmd(m, meta_hb_expire_done, m, 3, expire, NULL) != ECS_OK ||
      meta_acmd(m, meta_hb_epoch_done, m, 3, hget, NULL) != ECS_OK ||
      meta_acmd(m, meta_hb_done, m, 3, sadd, NULL) != ECS_OK)
    return; /* the link is going down: nothing in flight to wait for */
  m->hb_inflight = 1;
}

/*
 * The re-sync sweep, one SCAN step at a time: the SCAN's reply sends the
 * check script over the step's keys (in chunks), the last chunk's reply
 * sends the deletes and the next SCAN, and the step that brings the cursor
 * back to 0 publishes everything.  Each reply's work is bounded by the
 * SCAN COUNT, and the loop serves clients between them.
 */
typedef struct meta_sweep_step {
  ecs_meta_t *m;   /* the handle */
  char cursor[32]; /* the cursor SCAN answered */
  size_t nk;       /* keys in this step */
  uint8_t **keys;  /* their copies (without the prefix) */
  uint16_t *lens;  /* their lengths */
  size_t pending;  /* chunks awaiting their reply */
  int failed;      /* a chunk failed: the sweep stops */
  struct meta_sweep_chunk {
    struct meta_sweep_step *st; /* the step */
    size_t lo, hi;              /* its keys */
  } * chunks;                   /* one per script call */
} meta_sweep_step_t;

static void meta_sweep_step_free(meta_sweep_step_t *st) {
  if (st == NULL)
    return;
  for (size_t i = 0; i < st->nk; i++)
    free(st->keys[i]);
  free(st->keys);
  free(st->lens);
  free(st->chunks);
  free(st);
}

static void meta_sweep_fail(ecs_meta_t *m) {
  m->sweeping = 0;
  m->sweep_busy = 0;
  m->resync_owed = 1;
}

static void meta_sweep_scan(ecs_meta_t *m);

/* A step is through: the next SCAN, or (cursor back at 0) publish all. */
static void meta_sweep_advance(ecs_meta_t *m, const char *cursor) {
  snprintf(m->cursor, sizeof m->cursor, "%s", cursor);
  if (strcmp(m->cursor, "0") != 0) {
    meta_sweep_scan(m);
    return;
  }
  m->sweeping = 0;
  m->sweep_busy = 0;
  if (m->resync_owed) /* a write failed during the sweep: the next tick starts over */
    return;
  if (m->rs.publish_all != NULL)
    m->rs.publish_all(m->rs.ctx, m);
}

static void meta_sweep_check_done(void *ctx, int rc, redisReply *r) {
  struct meta_sweep_chunk *ch = ctx;
  meta_sweep_step_t *st = ch->st;
  ecs_meta_t *m = st->m;
  if (rc != ECS_OK || r->type != REDIS_REPLY_ARRAY || r->elements != ch->hi - ch->lo) {
    st->failed = 1;
  } else {
    /* 1: a live record of ours; the server no longer holding it deletes it. */
    for (size_t j = ch->lo; j < ch->hi; j++) {
      const redisReply *e = r->element[j - ch->lo];
      if (e->type == REDIS_REPLY_INTEGER && e->integer == 1 && m->rs.has_key != NULL &&
          !m->rs.has_key(m->rs.ctx, st->keys[j], st->lens[j]))
        ecs_meta_queue_del(m, st->keys[j], st->lens[j]);
    }
  }
  if (--st->pending > 0)
    return;
  meta_dq_flush(m);
  if (st->failed || !ecs__rdsa_up(&m->alink))
    meta_sweep_fail(m);
  else
    meta_sweep_advance(m, st->cursor);
  meta_sweep_step_free(st);
}

/* Sends the check script (mode "s") over the step's keys, in chunks. */
static int meta_sweep_check(ecs_meta_t *m, meta_sweep_step_t *st) {
  size_t nchunks = (st->nk + META_CHUNK - 1) / META_CHUNK;
  st->chunks = calloc(nchunks, sizeof *st->chunks);
  size_t cap = META_CHUNK < st->nk ? META_CHUNK : st->nk;
  const char **argv = malloc((cap + 6) * sizeof *argv);
  size_t *argl = malloc((cap + 6) * sizeof *argl);
  char *kbuf = malloc(cap * (m->obj_pfx_len + ECS_MAX_KEY));
  size_t *idx = malloc(st->nk * sizeof *idx);
  int rc = ECS_OK;
  if (st->chunks == NULL || argv == NULL || argl == NULL || kbuf == NULL || idx == NULL) {
    rc = ECS_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < st->nk; i++)
    idx[i] = i;
  meta_batch_t b = {.keys = (const uint8_t *const *)st->keys,
                    .lens = st->lens,
                    .idx = idx,
                    .n = st->nk,
                    .mode = "s",
                    .argv = argv,
                    .argl = argl,
                    .kbuf = kbuf};
  for (size_t ci = 0; ci < nchunks; ci++) {
    struct meta_sweep_chunk *ch = &st->chunks[ci];
    ch->st = st;
    ch->lo = ci * META_CHUNK;
    ch->hi = ch->lo + META_CHUNK < st->nk ? ch->lo + META_CHUNK : st->nk;
    int argc = meta_chunk_argv(m, &b, ci, 1);
    rc = meta_acmd(m, meta_sweep_check_done, ch, argc, argv, argl);
    if (rc != ECS_OK)
      break;
    st->pending++;
  }
out:
  free(argv);
  free(argl);
  free(kbuf);
  free(idx);
  return rc;
}

static void meta_sweep_scan_done(void *ctx, int rc, redisReply *r) {
  ecs_meta_t *m = ctx;
  if (rc != ECS_OK || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
      r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof m->cursor ||
      r->element[1]->type != REDIS_REPLY_ARRAY) {
    if (rc == ECS_OK)
      meta_seterr(m, "SCAN: unexpected reply");
    meta_sweep_fail(m);
    return;
  }
  const redisReply *list = r->element[1];
  meta_sweep_step_t *st = calloc(1, sizeof *st);
  if (st == NULL)
    goto fail;
  st->m = m;
  memcpy(st->cursor, r->element[0]->str, r->element[0]->len);
  st->keys = calloc(list->elements ? list->elements : 1, sizeof *st->keys);
  st->lens = calloc(list->elements ? list->elements : 1, sizeof *st->lens);
  if (st->keys == NULL || st->lens == NULL)
    goto fail;
  for (size_t i = 0; i < list->elements; i++) {
    const redisReply *k = list->element[i];
    if (k->type != REDIS_REPLY_STRING || k->len <= m->obj_pfx_len || k->len - m->obj_pfx_len > ECS_MAX_KEY ||
        memcmp(k->str, m->obj_pfx, m->obj_pfx_len) != 0)
      continue;
    size_t kl = k->len - m->obj_pfx_len;
    st->keys[st->nk] = malloc(kl);
    if (st->keys[st->nk] == NULL)
      goto fail;
    memcpy(st->keys[st->nk], k->str + m->obj_pfx_len, kl);
    st->lens[st->nk++] = (uint16_t)kl;
  }
  if (st->nk == 0) {
    meta_sweep_advance(m, st->cursor);
    meta_sweep_step_free(st);
    return;
  }
  if (meta_sweep_check(m, st) != ECS_OK) {
    if (st->pending == 0)
      goto fail;
    st->failed = 1; /* the chunks sent end the step, as failed */
  }
  return;
fail:
  meta_sweep_step_free(st);
  meta_sweep_fail(m);
}

static void meta_sweep_scan(ecs_meta_t *m) {
  const char *argv[] = {"SCAN", m->cursor, "MATCH", m->match, "COUNT", META_SCAN_COUNT};
  if (meta_acmd(m, meta_sweep_scan_done, m, 6, argv, NULL) != ECS_OK) {
    meta_sweep_fail(m);
    return;
  }
  m->sweep_busy = 1;
}

static void meta_sweep_start(ecs_meta_t *m) {
  m->sweeping = 1;
  m->resync_owed = 0;
  snprintf(m->cursor, sizeof m->cursor, "0");
  meta_sweep_scan(m);
}

/* The link is up (the handshake answered): register again, and owe a
 * re-sync, which starts once a heartbeat has found the entry ours. */
static void meta_async_up(void *ctx) {
  ecs_meta_t *m = ctx;
  m->errstr[0] = '\0';
  m->resync_owed = 1;
  m->sweeping = 0;
  const char *load[] = {"SCRIPT", "LOAD", meta_del_lua};
  m->del_sha[0] = '\0'; /* EVAL until this answers (a new node may not know the script) */
  (void)meta_acmd(m, meta_del_loaded, m, 3, load, NULL);
  if (m->want_reg)
    meta_register_async(m);
  m->hb_valid = 0; /* the next tick sends a heartbeat */
}

/* The link dropped: what was in flight is lost (its callbacks fail next). */
static void meta_async_down(void *ctx, int rc) {
  ecs_meta_t *m = ctx;
  (void)rc;
  meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
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
  meta_queue_clear(m);
  m->async = 1;
  m->resync_owed = 1;
  m->sweeping = 0;
  m->rc_valid = 1;
  m->last_rc_ms = ecs_now_ms();
  /* Not up yet, but records may be sent already: they follow the
   * handshake.  A connect that cannot even start is retried by tick. */
  if (ecs__rdsa_connect(&m->alink) != ECS_OK)
    meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
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
  meta_dq_flush(m); /* deletes queued outside a flush (a corrupt object dropped) */
  return ecs__rdsa_poll(&m->alink, now_ms);
}

/* ecs_meta_tick in the asynchronous mode: starts work, never waits. */
static int meta_tick_async(ecs_meta_t *m, uint64_t now_ms, const ecs_meta_resync_t *rs) {
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
      meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
    return ECS_ENOTCONN;
  }
  if (!ecs__rdsa_up(&m->alink))
    return ECS_ENOTCONN;
  int starting = m->resync_owed && !m->sweeping && rs != NULL;
  if (!m->hb_inflight &&
      (starting || !m->hb_valid || now_ms - m->last_hb_ms >= (uint64_t)m->ttl_s * 1000u / 3u)) {
    meta_heartbeat_async(m);
    m->hb_valid = 1;
    m->last_hb_ms = now_ms;
  }
  return ECS_OK;
}

int ecs_meta_tick(ecs_meta_t *m, uint64_t now_ms, const ecs_meta_resync_t *rs) {
  if (m == NULL)
    return ECS_EINVAL;
  if (!m->server)
    return meta_ensure_link(m);
  if (m->async)
    return meta_tick_async(m, now_ms, rs);
  if (!m->want_reg)
    return ecs__rds_up(&m->link) ? ECS_OK : ECS_ENOTCONN;
  int rc;
  if (!ecs__rds_up(&m->link)) {
    if (m->rc_valid && now_ms - m->last_rc_ms < (uint64_t)m->reconnect_ms)
      return ECS_ENOTCONN;
    m->rc_valid = 1;
    m->last_rc_ms = now_ms;
    rc = meta_connect(m);
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
  if (starting || !m->hb_valid || now_ms - m->last_hb_ms >= (uint64_t)m->ttl_s * 1000u / 3u) {
    rc = meta_heartbeat(m);
    if (rc != ECS_OK)
      return rc;
    m->hb_valid = 1;
    m->last_hb_ms = now_ms;
  }
  if ((m->resync_owed || m->sweeping) && rs != NULL) {
    rc = meta_resync(m, rs);
    if (rc != ECS_OK)
      return rc;
  }
  return ecs__rds_up(&m->link) ? ECS_OK : ECS_ENOTCONN;
}

int ecs_meta_unregister(ecs_meta_t *m) {
  if (m == NULL || !m->server)
    return ECS_EINVAL;
  m->want_reg = 0;
  meta_queue_clear(m);
  if (m->async) { /* the rest is a bounded wait on the blocking link */
    ecs__rdsa_close(&m->alink, ECS_ECANCELED);
    m->async = 0;
  }
  int rc = meta_connect(m);
  if (rc != ECS_OK)
    return rc;
  /* Registry first: from then on every record of ours is stale for readers,
   * and the sweep below deletes them (the check script deletes stale ones). */
  const char *del[] = {"DEL", m->node_key};
  const char *srem[] = {"SREM", m->nodes_key, m->node_id};
  redisReply *r;
  rc = meta_cmdv(m, &r, 2, del);
  if (rc != ECS_OK)
    return rc;
  rc = meta_reply_err(m, r, "unregister");
  freeReplyObject(r);
  if (rc != ECS_OK)
    return rc;
  rc = meta_cmdv(m, &r, 3, srem);
  if (rc != ECS_OK)
    return rc;
  freeReplyObject(r);
  snprintf(m->cursor, sizeof m->cursor, "0");
  m->sweeping = 0;
  for (;;) {
    int done;
    rc = meta_sweep_step(m, NULL, &done);
    if (rc != ECS_OK || done)
      break;
  }
  m->resync_owed = 0;
  return rc;
}
