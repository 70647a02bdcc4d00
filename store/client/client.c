/*
 * libecstore client: the batch driver; see include/ecstore/ecstore.h.
 *
 * A call checks its items, splits the batch by server (key hash), and
 * hands each server's share to the data path the server is on, through
 * that path's operations table (store/client/client_priv.h): the driver never
 * knows whether the bytes go over a socket, through shared memory or by
 * RDMA.  It owns what every path has in common: connecting and choosing the
 * path, the call's deadline, a per-item status for every item, and the
 * requests that are the same on every path (exists, remove, stat, ping).
 */
#include "ecstore/ecstore.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "store/client/client_internal.h"
#include "store/client/client_priv.h"
#include "store/core/codec.h"
#include "store/redis/meta.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "store/redis/rds.h"

typedef ecs_cli_srv_t srv_t;

const char *ecs_client_errmsg(const ecs_client_t *c) {
  return c ? c->errmsg : "";
}

void ecs_client_config_init(ecs_client_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->servers = NULL; /* "127.0.0.1:7700" unless a Redis URL asks for discovery */
  cfg->ns = "default";
  cfg->connect_timeout_ms = 2000;
  cfg->timeout_ms = 10000;
  cfg->verify_checksum = 1;
  cfg->max_object_size = ECS_DEFAULT_MAX_OBJECT_SIZE;
  cfg->shm_server_uid = -1;
  cfg->registry_refresh_ms = 2000;
  cfg->replicas = 1;
}

void ecs_free(void *p) {
  free(p);
}

/* Why a connection could not be made, in the words a user acts on: the
 * system's reason ("connection refused") and what it usually means. */
static void connect_err(ecs_client_t *c, const srv_t *s, int rc, int to_ms) {
  if (rc == ECS_ETIMEDOUT) {
    ecs__cli_err(c, "cannot connect to %s: no answer within %d ms", s->addr, to_ms);
    return;
  }
  int e = errno;
  char why[96];
  snprintf(why, sizeof why, "%s", e == EHOSTUNREACH ? "host unreachable or name not resolved" : strerror(e));
  why[0] = (char)tolower((unsigned char)why[0]);
  ecs__cli_err(c, "cannot connect to %s: %s%s", s->addr, why,
               e == ECONNREFUSED ? " (is ecstore-server running there?)" : "");
}

/* Makes sure server s is connected and greeted. */
static int ensure(ecs_client_t *c, srv_t *s, uint64_t deadline) {
  if (s->fd >= 0)
    return ECS_OK;
  uint64_t now = ecs_now_ms();
  int left = now >= deadline ? 0 : (int)((deadline - now) > INT_MAX ? INT_MAX : deadline - now);
  if (left == 0)
    return ECS_ETIMEDOUT;
  int to = c->cfg.connect_timeout_ms < left ? c->cfg.connect_timeout_ms : left;
  int rc = ecs_net_connect(s->host, s->port, to, &s->fd);
  if (rc) {
    s->fd = -1;
    connect_err(c, s, rc, to);
    return rc;
  }
  ecs_net_tune_local(s->fd); /* a server on this host: no pacing of puts (net.h) */
  rc = ecs__cli_hello(c, s, deadline);
  if (rc) {
    if (!c->errmsg[0])
      ecs__cli_err(c, "%s: HELLO failed: %s", s->addr, ecs_strerror(rc));
    ecs__cli_drop(s);
    return rc;
  }
  s->ops = &ecs__cli_tcp_ops;
  if (!c->path->upgrade)
    return ECS_OK;
  rc = c->path->upgrade(c, s, deadline);
  if (rc == ECS_OK)
    return ECS_OK;
  if (c->fallback == ECS_FALLBACK_NONE) {
    ecs__cli_drop(s);
    return rc;
  }
  if (c->fallback == ECS_FALLBACK_SAY && s->fd >= 0)
    fprintf(stderr, "ecstore: %s; using tcp\n", c->errmsg);
  c->errmsg[0] = '\0'; /* TCP it is */
  return s->fd >= 0 ? ECS_OK : rc;
}

/* ------------------------------------------------------------------ */
/* connect / close                                                      */

static int parse_servers(ecs_client_t *c, char *errbuf, size_t errlen) {
  char *save = NULL;
  for (char *tok = strtok_r(c->servers_s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ')
      tok++;
    if (!*tok)
      continue;
    if (c->nsrv == ECS_CLI_MAX_SERVERS) {
      snprintf(errbuf, errlen, "too many servers (at most %d)", ECS_CLI_MAX_SERVERS);
      return ECS_EINVAL;
    }
    srv_t *s = &c->srv[c->nsrv];
    if (ecs_net_parse_hostport(tok, s->host, sizeof s->host, &s->port) || s->port == 0) {
      snprintf(errbuf, errlen, "bad server address '%s' (expected HOST:PORT)", tok);
      return ECS_EINVAL;
    }
    snprintf(s->addr, sizeof s->addr, "%s", tok);
    s->fd = -1;
    s->cli = c;
    s->live = 1;
    c->nsrv++;
  }
  if (c->nsrv == 0) {
    snprintf(errbuf, errlen, "no server address given");
    return ECS_EINVAL;
  }
  return ECS_OK;
}

int ecs_client_connect(const ecs_client_config_t *cfg, ecs_client_t **out, char *errbuf, size_t errlen) {
  char dummy[8];
  if (!errbuf) {
    errbuf = dummy;
    errlen = sizeof dummy;
  }
  errbuf[0] = '\0';
  *out = NULL;
  ecs_client_config_t def;
  ecs_client_config_init(&def);
  if (!cfg)
    cfg = &def;
  ecs_client_t *c = calloc(1, sizeof *c);
  if (!c)
    return ECS_ENOMEM;
  c->cfg = *cfg;
  if (c->cfg.connect_timeout_ms <= 0)
    c->cfg.connect_timeout_ms = def.connect_timeout_ms;
  if (c->cfg.timeout_ms <= 0)
    c->cfg.timeout_ms = def.timeout_ms;
  if (c->cfg.max_object_size == 0) /* a zeroed config: the default, never "no cap" */
    c->cfg.max_object_size = def.max_object_size;
  if (c->cfg.registry_refresh_ms <= 0)
    c->cfg.registry_refresh_ms = def.registry_refresh_ms;
  /* No servers list but a Redis URL: the servers come from the registry. */
  c->discover = (!cfg->servers || !*cfg->servers) && cfg->redis_url && *cfg->redis_url;
  c->servers_s = strdup(cfg->servers && *cfg->servers ? cfg->servers : "127.0.0.1:7700");
  c->ns_s = strdup(cfg->ns && *cfg->ns ? cfg->ns : def.ns);
  c->redis_s = cfg->redis_url && *cfg->redis_url ? strdup(cfg->redis_url) : NULL;
  c->token_s = cfg->auth_token && *cfg->auth_token ? strdup(cfg->auth_token) : NULL;
  ecs_wbuf_init(&c->w);
  int rc = ECS_ENOMEM;
  if (!c->servers_s || !c->ns_s || (cfg->redis_url && *cfg->redis_url && !c->redis_s) ||
      (cfg->auth_token && *cfg->auth_token && !c->token_s))
    goto fail;
  rc = ECS_EINVAL;
  if (strlen(c->ns_s) > ECS_PROTO_MAX_NS) {
    snprintf(errbuf, errlen, "namespace longer than %d bytes", ECS_PROTO_MAX_NS);
    goto fail;
  }
  if (c->token_s && strlen(c->token_s) > ECS_PROTO_MAX_TOKEN) {
    snprintf(errbuf, errlen, "auth token longer than %d bytes", ECS_PROTO_MAX_TOKEN);
    goto fail;
  }
  rc = ecs__place_parse(c, c->cfg.placement, errbuf, errlen);
  if (rc)
    goto fail;
  if (c->cfg.replicas <= 0) /* a zeroed config: one copy */
    c->cfg.replicas = 1;
  if (c->cfg.replicas > ECS_MAX_REPLICAS) {
    snprintf(errbuf, errlen, "replicas %d: at most %d copies", c->cfg.replicas, ECS_MAX_REPLICAS);
    rc = ECS_EINVAL;
    goto fail;
  }
  if (c->cfg.replicas > 1 && !c->discover) {
    /* With a list, an object lives where its key hashes and a get asks
     * only that server: copies elsewhere would never be read. */
    snprintf(errbuf, errlen,
             "replicas %d needs the servers from Redis (a redis_url and no servers list); "
             "with a servers list each object has one home",
             c->cfg.replicas);
    rc = ECS_EINVAL;
    goto fail;
  }
  if (!c->discover) {
    rc = parse_servers(c, errbuf, errlen);
    if (rc)
      goto fail;
  }
  const char *tr = c->cfg.transport && *c->cfg.transport ? c->cfg.transport : "auto";
  if (!strcmp(tr, "auto")) {
    c->path = &ecs__cli_shm_ops;
    c->fallback = ECS_FALLBACK_QUIET;
  } else if (!strcmp(tr, "tcp")) {
    c->path = &ecs__cli_tcp_ops;
  } else if (!strcmp(tr, "shm")) {
    c->path = &ecs__cli_shm_ops;
    c->fallback = ECS_FALLBACK_NONE;
  } else if (!strcmp(tr, "rdma")) {
    /* Without a device: one line, then tcp: asking for rdma where there is
     * none is a deployment choice, not a reason to refuse to connect. */
    char rerr[256] = "";
    c->path = &ecs__cli_rdma_ops;
    c->fallback = ECS_FALLBACK_SAY;
    if (ecs__rdma_client_open(c, rerr, sizeof rerr) != ECS_OK) {
      fprintf(stderr, "ecstore: %s; using tcp\n", rerr[0] ? rerr : "rdma: unavailable");
      c->path = &ecs__cli_tcp_ops;
    }
  } else {
    snprintf(errbuf, errlen, "unknown transport '%s' (expected auto, tcp, shm or rdma)", tr);
    rc = ECS_EINVAL;
    goto fail;
  }
  if (c->cfg.compression && *c->cfg.compression && ecs_codec_parse(c->cfg.compression, &c->codec) != ECS_OK) {
    snprintf(errbuf, errlen, "unknown compression '%s' (expected none, lz4, zstd or auto)",
             c->cfg.compression);
    rc = ECS_EINVAL;
    goto fail;
  }
  uint64_t deadline = ecs_now_ms() + (uint64_t)c->cfg.connect_timeout_ms + (uint64_t)c->cfg.timeout_ms;
  for (size_t i = 0; i < c->nsrv && !c->discover; i++) { /* discovered servers: lazily */
    rc = ensure(c, &c->srv[i], deadline);
    if (rc) {
      snprintf(errbuf, errlen, "%s", c->errmsg);
      goto fail;
    }
  }
  if (c->redis_s) {
    ecs_meta_opts_t mo;
    ecs_meta_opts_init(&mo);
    mo.redis_url = c->redis_s;
    mo.ns = c->ns_s;
    mo.timeout_ms = c->cfg.timeout_ms < 2000 ? c->cfg.timeout_ms : 2000;
    rc = ecs_meta_open(&mo, &c->meta);
    if (rc) {
      char shown[256], port[256]; /* never the password */
      const char *bad = ecs__rds_url_port_problem(c->redis_s, port, sizeof port);
      if (bad)
        snprintf(errbuf, errlen, "bad Redis URL '%s': %s",
                 ecs__rds_url_redact(c->redis_s, shown, sizeof shown), bad);
      else
        snprintf(errbuf, errlen,
                 "bad Redis URL '%s' (a user needs a password, in the URL or ECSTORE_REDIS_PASSWORD; "
                 "a sentinel_user in the URL or ECSTORE_SENTINEL_PASSWORD)",
                 ecs__rds_url_redact(c->redis_s, shown, sizeof shown));
      goto fail;
    }
    /* A Redis that is down is not a reason to refuse: puts and gets go to
     * the servers, which keep serving without it; exists falls back to
     * asking the servers, and the handle reconnects on the next call. */
  }
  if (c->discover) {
    /* Without a servers list, Redis is the only way to find a server. */
    rc = ecs__place_refresh(c, 1);
    if (rc) {
      snprintf(errbuf, errlen, "%s", c->errmsg);
      goto fail;
    }
  }
  c->errmsg[0] = '\0';
  *out = c;
  return ECS_OK;
fail:
  ecs_client_close(c);
  return rc;
}

void ecs_client_close(ecs_client_t *c) {
  if (!c)
    return;
  for (size_t i = 0; i < c->nsrv; i++)
    ecs__cli_drop(&c->srv[i]);
  ecs_meta_close(c->meta);
  ecs__rdma_client_close(c);
  ecs_wbuf_free(&c->w);
  free(c->rmeta);
  free(c->servers_s);
  free(c->redis_s);
  free(c->ns_s);
  free(c->token_s);
  free(c);
}

size_t ecs_client_server_count(const ecs_client_t *c) {
  return c->nsrv;
}

void ecs_client_put_copies(const ecs_client_t *c, size_t *stored, size_t *wanted) {
  if (stored)
    *stored = c ? c->copies_stored : 0;
  if (wanted)
    *wanted = c ? c->copies_wanted : 0;
}

/* A kind of batch call (put, get, view, exists/remove): what it does with
 * one server's share of the items (idx: indices into the caller's arrays),
 * and how it reads and sets one item's status there.  arg is the call's
 * own struct of the caller's arrays. */
typedef struct batch_kind {
  int (*share)(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline);
  int (*status)(void *arg, size_t i);        /* item i's status: only OK items are sent */
  void (*fail)(void *arg, size_t i, int rc); /* an item a whole-share failure took down */
  void (*again)(void *arg, size_t i);        /* item i goes to another copy: status back to OK */
  int parallel;                              /* 1: shares on several servers run at once */
  int miss_when_gone;                        /* 1: discovery, an unreachable holder is a miss */
} batch_kind_t;

/* The server an object lives on, with a configured servers list. */
static size_t route(const ecs_client_t *c, const ecs_key_t *k) {
  if (c->nsrv == 1)
    return 0;
  return (size_t)(XXH3_64bits(k->data, k->len) % c->nsrv);
}

/* Items of a batch that go to server si, as indices into the caller's
 * arrays.  idx must hold n entries. */
static size_t pick(const size_t *where, size_t n, const batch_kind_t *kind, void *arg, size_t si,
                   size_t *idx) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (kind->status(arg, i) == ECS_OK && where[i] == si)
      idx[m++] = i;
  return m;
}

static int key_ok(const ecs_key_t *k) {
  return k->data && ecs_key_check(k->data, k->len) == ECS_OK;
}

/* Where each item still OK is: by key hash over the servers list, or,
 * with discovery, where Redis says its copies are (an item with no live
 * holder is a miss: fail(ECS_ENOTFOUND)).  where must hold n *
 * ECS_CLI_MAX_COPIES entries: item i's servers, nearest first, from
 * where[i * ECS_CLI_MAX_COPIES], then ECS_CLI_NOWHERE.  An error is
 * Redis's, for the whole batch: every item still OK is given it. */
static int locate(ecs_client_t *c, const ecs_key_t *keys, size_t n, const batch_kind_t *kind, void *arg,
                  size_t *where) {
  if (!c->discover) {
    for (size_t i = 0; i < n * ECS_CLI_MAX_COPIES; i++)
      where[i] = ECS_CLI_NOWHERE;
    for (size_t i = 0; i < n; i++)
      if (kind->status(arg, i) == ECS_OK)
        where[i * ECS_CLI_MAX_COPIES] = route(c, &keys[i]);
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

/* One server's share of a batch, run by run_batch on the caller's thread
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
      int miss = gone && j->kind->miss_when_gone;
      for (size_t q = off; q < j->m; q++)
        j->kind->fail(j->arg, j->idx[q], miss ? ECS_ENOTFOUND : rc);
      if (gone)
        j->s->down_until = ecs_now_ms() + ECS_CLI_DOWN_MS;
      if (!miss)
        j->rc = rc;
      return;
    }
  }
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
  }
  free(jobs);
  free(idx);
  return ret;
}

static int run_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, const batch_kind_t *kind, void *arg,
                     const size_t *where) {
  (void)keys;
  return run_batch_until(c, n, kind, arg, where, ecs__cli_deadline(c));
}

/* An item status worth another copy: a miss there (evicted, or its server
 * gone), bytes that failed their checksum, or a server that failed. */
static int try_other_copy(int st) {
  return st == ECS_ENOTFOUND || st == ECS_ECHECKSUM || st == ECS_ECONN || st == ECS_ETIMEDOUT;
}

/* A located batch (where: locate's n * ECS_CLI_MAX_COPIES servers) read
 * from the nearest copy of each item; an item whose copy failed or was a
 * miss goes to its next copy, round after round, within one deadline.
 * The return is the first whole-share error that some item still
 * carries at the end (ECS_OK when every such item was served by another
 * copy). */
static int run_nearest(ecs_client_t *c, size_t n, const batch_kind_t *kind, void *arg, const size_t *where) {
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

/* ------------------------------------------------------------------ */
/* put                                                                  */

static int put_validate(const ecs_key_t *k, const ecs_tensor_t *t) {
  if (!key_ok(k))
    return ECS_EKEY;
  uint64_t want;
  int rc = ecs_tensor_nbytes(&t->desc, &want);
  if (rc)
    return ECS_EDTYPE;
  if (want != t->nbytes)
    return ECS_EDTYPE;
  if (t->nbytes && !t->data)
    return ECS_EINVAL;
  return ECS_OK;
}

typedef struct put_arg {
  const ecs_key_t *keys;
  const ecs_tensor_t *ts;
  int *status;
} put_arg_t;

static int put_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  put_arg_t *a = arg;
  int rc = ensure(c, s, deadline);
  return rc ? rc : s->ops->put(c, s, a->keys, a->ts, idx, m, a->status, deadline);
}

static int put_status(void *arg, size_t i) {
  return ((put_arg_t *)arg)->status[i];
}

static void put_fail(void *arg, size_t i, int rc) {
  ((put_arg_t *)arg)->status[i] = rc;
}

static void put_again(void *arg, size_t i) {
  ((put_arg_t *)arg)->status[i] = ECS_OK;
}

static const batch_kind_t put_kind = {put_share, put_status, put_fail, put_again, 0, 0};
/* Replicas: the copies of a batch go to several servers at once. */
static const batch_kind_t put_copies_kind = {put_share, put_status, put_fail, put_again, 1, 0};

/* A put's item stored in a first round: not sent again (any nonzero
 * status keeps an item back; no ECS_* code is positive). */
#define PUT_DONE 1

/* Discovery: places the items still OK (where[i]); an item with no live
 * server anywhere gets ECS_ECONN. */
static void put_place(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *ts, size_t n, int *status,
                      size_t *where, uint64_t *load) {
  memset(load, 0, ECS_CLI_MAX_SERVERS * sizeof *load);
  int none = 0;
  for (size_t i = 0; i < n; i++) {
    where[i] =
        status[i] == ECS_OK ? ecs__place_put(c, &keys[i], ts[i].nbytes, load, NULL, 0) : ECS_CLI_NOWHERE;
    if (status[i] == ECS_OK && where[i] == ECS_CLI_NOWHERE) {
      status[i] = ECS_ECONN;
      none = 1;
    }
  }
  if (none)
    ecs__cli_err(c, "discovery: no live server in the registry of namespace '%s' (Redis %s)", c->ns_s,
                 c->redis_s);
}

/*
 * Replicas (discovery): item i's R copies are entries i*R .. i*R+R-1 of
 * one batch of n*R, each placed on a server none of the item's other
 * copies uses, and sent to every server at once (run_batch, parallel).
 * A copy whose server could not be reached is placed again, once, on a
 * server left.  Item i is ECS_OK when at least one copy was stored (a
 * cache needs one copy to serve; fewer than R is counted in
 * copies_stored and said in errmsg), else the first copy's error.
 */
static int put_replicas(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *ts, size_t n, int *status,
                        size_t *wrote) {
  size_t R = (size_t)c->cfg.replicas, N = n * R;
  ecs_key_t *k2 = malloc((N ? N : 1) * sizeof *k2);
  ecs_tensor_t *t2 = malloc((N ? N : 1) * sizeof *t2);
  int *st2 = malloc((N ? N : 1) * sizeof *st2);
  size_t *w2 = malloc((N ? N : 1) * sizeof *w2);
  uint64_t load[ECS_CLI_MAX_SERVERS];
  int ret = ECS_ENOMEM;
  if (!k2 || !t2 || !st2 || !w2)
    goto out;
  ecs__place_refresh(c, 0);
  c->errmsg[0] = '\0';
  memset(load, 0, sizeof load);
  int none = 0;
  for (size_t i = 0; i < n; i++) {
    for (size_t r = 0; r < R; r++) {
      size_t e = i * R + r;
      k2[e] = keys[i];
      t2[e] = ts[i];
      st2[e] = status[i];
      w2[e] = status[i] == ECS_OK ? ecs__place_put(c, &keys[i], ts[i].nbytes, load, &w2[i * R], r)
                                  : ECS_CLI_NOWHERE;
      if (status[i] == ECS_OK && w2[e] == ECS_CLI_NOWHERE) {
        st2[e] = ECS_ECONN; /* fewer live servers than copies */
        none |= r == 0;
      }
    }
  }
  put_arg_t a = {k2, t2, st2};
  ret = run_batch(c, k2, N, &put_copies_kind, &a, w2);
  for (size_t e = 0; e < N && ret == ECS_ENOMEM; e++)
    if (st2[e] == ECS_OK && w2[e] != ECS_CLI_NOWHERE)
      st2[e] = ECS_ENOMEM; /* never sent */
  /* Copies whose server could not be reached (it died and is still
   * listed until its registry entry expires): placed again, once. */
  int again = 0;
  for (size_t e = 0; e < N; e++) {
    if (wrote && (st2[e] == ECS_OK || st2[e] == ECS_EREDIS))
      wrote[(e / R) * ECS_CLI_MAX_COPIES + e % R] = w2[e];
    if (st2[e] == ECS_OK)
      st2[e] = PUT_DONE;
    else if (w2[e] != ECS_CLI_NOWHERE && (st2[e] == ECS_ECONN || st2[e] == ECS_ETIMEDOUT))
      again = 1;
  }
  if (again) {
    ecs__place_refresh(c, 1);
    c->errmsg[0] = '\0';
    memset(load, 0, sizeof load);
    for (size_t e = 0; e < N; e++) {
      if (w2[e] == ECS_CLI_NOWHERE || (st2[e] != ECS_ECONN && st2[e] != ECS_ETIMEDOUT)) {
        w2[e] = st2[e] == PUT_DONE ? w2[e] : ECS_CLI_NOWHERE;
        continue;
      }
      size_t i = e / R; /* not onto a server this item's copies already use or tried */
      size_t to = ecs__place_put(c, &keys[i], ts[i].nbytes, load, &w2[i * R], R);
      st2[e] = to == ECS_CLI_NOWHERE ? st2[e] : ECS_OK;
      w2[e] = to;
    }
    for (size_t e = 0; e < N; e++)
      if (st2[e] != ECS_OK)
        w2[e] = ECS_CLI_NOWHERE; /* kept for the exclusions above; not sent again */
    ret = run_batch(c, k2, N, &put_copies_kind, &a, w2);
    for (size_t e = 0; e < N && ret == ECS_ENOMEM; e++)
      if (st2[e] == ECS_OK && w2[e] != ECS_CLI_NOWHERE)
        st2[e] = ECS_ENOMEM;
    for (size_t e = 0; e < N && wrote; e++)
      if (w2[e] != ECS_CLI_NOWHERE && (st2[e] == ECS_OK || st2[e] == ECS_EREDIS))
        wrote[(e / R) * ECS_CLI_MAX_COPIES + e % R] = w2[e];
  }
  size_t short_items = 0;
  c->copies_stored = 0;
  c->copies_wanted = 0;
  for (size_t i = 0; i < n; i++) {
    if (status[i] != ECS_OK)
      continue;
    size_t got = 0;
    int err = ECS_OK;
    for (size_t r = 0; r < R; r++) {
      int st = st2[i * R + r];
      if (st == ECS_OK || st == PUT_DONE)
        got++;
      else if (err == ECS_OK)
        err = st;
    }
    status[i] = got ? ECS_OK : err;
    c->copies_stored += got;
    c->copies_wanted += R;
    short_items += got < R;
  }
  int carried = 0; /* a share error that every item got past on other servers is no error */
  for (size_t i = 0; i < n && ret != ECS_OK; i++)
    carried |= status[i] == ret;
  if (!carried)
    ret = ECS_OK;
  if (none)
    ecs__cli_err(c, "discovery: no live server in the registry of namespace '%s' (Redis %s)", c->ns_s,
                 c->redis_s);
  else if (short_items && !c->errmsg[0])
    ecs__cli_err(c, "replicas: %zu of %zu items stored fewer than %zu copies (%zu of %zu copies stored)",
                 short_items, n, R, c->copies_stored, c->copies_wanted);
out:
  free(k2);
  free(t2);
  free(st2);
  free(w2);
  return ret;
}

/* wrote, when not NULL (n * ECS_CLI_MAX_COPIES entries, ECS_CLI_NOWHERE on
 * entry): with discovery, the servers each item's copies were stored on. */
static int put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                     int *status, size_t *wrote) {
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++)
    status[i] = put_validate(&keys[i], &tensors[i]);
  c->copies_stored = c->copies_wanted = 0;
  if (c->discover && c->cfg.replicas > 1)
    return put_replicas(c, keys, tensors, n, status, wrote);
  put_arg_t a = {keys, tensors, status};
  size_t *where = calloc(n ? n : 1, sizeof *where);
  uint64_t load[ECS_CLI_MAX_SERVERS];
  if (!where)
    return ECS_ENOMEM;
  int ret;
  size_t sent = 0;
  for (size_t i = 0; i < n; i++)
    sent += status[i] == ECS_OK;
  if (!c->discover) {
    for (size_t i = 0; i < n; i++)
      where[i] = route(c, &keys[i]);
    ret = run_batch(c, keys, n, &put_kind, &a, where);
  } else {
    ecs__place_refresh(c, 0);
    c->errmsg[0] = '\0';
    put_place(c, keys, tensors, n, status, where, load);
    ret = run_batch(c, keys, n, &put_kind, &a, where);
    /* A server that could not be reached (it died, and the registry still
     * lists it until its entry expires): place its items again, once, on
     * the servers left (run_batch marked it down). */
    int again = 0;
    for (size_t i = 0; i < n; i++) {
      if (wrote && where[i] != ECS_CLI_NOWHERE && (status[i] == ECS_OK || status[i] == ECS_EREDIS))
        wrote[i * ECS_CLI_MAX_COPIES] = where[i];
      if (where[i] != ECS_CLI_NOWHERE && (status[i] == ECS_ECONN || status[i] == ECS_ETIMEDOUT)) {
        status[i] = ECS_OK;
        again = 1;
      } else if (status[i] == ECS_OK) {
        status[i] = PUT_DONE;
      }
    }
    if (again) {
      ecs__place_refresh(c, 1);
      c->errmsg[0] = '\0';
      put_place(c, keys, tensors, n, status, where, load);
      ret = run_batch(c, keys, n, &put_kind, &a, where);
      for (size_t i = 0; i < n && wrote; i++)
        if (where[i] != ECS_CLI_NOWHERE && (status[i] == ECS_OK || status[i] == ECS_EREDIS))
          wrote[i * ECS_CLI_MAX_COPIES] = where[i];
    }
    for (size_t i = 0; i < n; i++)
      if (status[i] == PUT_DONE)
        status[i] = ECS_OK;
  }
  for (size_t i = 0; i < n; i++)
    c->copies_stored += status[i] == ECS_OK;
  c->copies_wanted = sent;
  /* ECS_EREDIS on an item: the server stored it but Redis did not
   * acknowledge its record in time (docs/redis-schema.md, "Writes"). */
  size_t unpublished = 0;
  for (size_t i = 0; i < n; i++)
    unpublished += status[i] == ECS_EREDIS;
  if (unpublished && !c->errmsg[0])
    snprintf(c->errmsg, sizeof c->errmsg,
             "%zu of %zu items stored but not yet published to Redis (Redis slow or down): gets find them, "
             "exists through Redis says 0 until the server re-publishes them",
             unpublished, n);
  free(where);
  return ret;
}

int ecs_put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                  int *status) {
  if (!c || (n && (!keys || !tensors || !status)))
    return ECS_EINVAL;
  c->put_flags = 0;
  return put_batch(c, keys, tensors, n, status, NULL);
}

/* ------------------------------------------------------------------ */
/* get                                                                  */

typedef struct get_arg {
  const ecs_key_t *keys;
  ecs_get_buf_t *bufs;
  int alloc;
} get_arg_t;

static int get_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  get_arg_t *a = arg;
  int rc = ensure(c, s, deadline);
  return rc ? rc : s->ops->get(c, s, a->keys, a->bufs, idx, m, a->alloc, deadline);
}

static int get_status(void *arg, size_t i) {
  return ((get_arg_t *)arg)->bufs[i].status;
}

static void get_fail(void *arg, size_t i, int rc) {
  get_arg_t *a = arg;
  ecs_get_buf_t *b = &a->bufs[i];
  if (a->alloc) {
    free(b->data);
    b->data = NULL;
  }
  b->status = rc;
  b->nbytes = 0;
}

static void get_again(void *arg, size_t i) {
  get_arg_t *a = arg;
  ecs_get_buf_t *b = &a->bufs[i];
  if (a->alloc) {
    free(b->data);
    b->data = NULL;
  }
  b->status = ECS_OK;
  b->nbytes = 0;
  memset(&b->desc, 0, sizeof b->desc);
}

static const batch_kind_t get_kind = {get_share, get_status, get_fail, get_again, 1, 1};

static int get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n, int alloc) {
  if (!c || (n && (!keys || !bufs)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (alloc)
      bufs[i].data = NULL;
    bufs[i].nbytes = 0;
    memset(&bufs[i].desc, 0, sizeof bufs[i].desc);
    bufs[i].status = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
  }
  get_arg_t a = {keys, bufs, alloc};
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  if (!where)
    return ECS_ENOMEM;
  int ret = locate(c, keys, n, &get_kind, &a, where);
  if (ret == ECS_OK)
    ret = run_nearest(c, n, &get_kind, &a, where);
  free(where);
  if (alloc) { /* only OK items keep a buffer */
    for (size_t i = 0; i < n; i++) {
      if (bufs[i].status != ECS_OK && bufs[i].data) {
        free(bufs[i].data);
        bufs[i].data = NULL;
      }
    }
  }
  return ret;
}

int ecs_get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  return get_batch(c, keys, bufs, n, 0);
}

int ecs_get_batch_alloc(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  return get_batch(c, keys, bufs, n, 1);
}

/* ------------------------------------------------------------------ */
/* views                                                                */

typedef struct view_arg {
  const ecs_key_t *keys;
  ecs_view_t *views;
} view_arg_t;

static int view_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  view_arg_t *a = arg;
  int rc = ensure(c, s, deadline);
  if (rc)
    return rc;
  if (!s->ops->view) { /* the bytes are not mapped here */
    for (size_t j = 0; j < m; j++)
      a->views[idx[j]].status = ECS_ENOTSUP;
    return ECS_OK;
  }
  return s->ops->view(c, s, a->keys, a->views, idx, m, deadline);
}

static int view_status(void *arg, size_t i) {
  return ((view_arg_t *)arg)->views[i].status;
}

static void view_fail(void *arg, size_t i, int rc) {
  ((view_arg_t *)arg)->views[i].status = rc;
}

static void view_again(void *arg, size_t i) {
  ecs_view_t *v = &((view_arg_t *)arg)->views[i];
  memset(v, 0, sizeof *v);
  v->status = ECS_OK;
}

static const batch_kind_t view_kind = {view_share, view_status, view_fail, view_again, 0, 1};

int ecs_get_view_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_view_t *views, size_t n) {
  if (!c || (n && (!keys || !views)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    memset(&views[i], 0, sizeof views[i]);
    views[i].status = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
  }
  view_arg_t a = {keys, views};
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  if (!where)
    return ECS_ENOMEM;
  int ret = locate(c, keys, n, &view_kind, &a, where);
  if (ret == ECS_OK)
    ret = run_nearest(c, n, &view_kind, &a, where);
  free(where);
  return ret;
}

/* ------------------------------------------------------------------ */
/* exists / remove: key items in, statuses out                          */

static int keys_one_server(ecs_client_t *c, srv_t *s, uint8_t op, const ecs_key_t *keys, const size_t *idx,
                           size_t m, int *out, uint64_t deadline) {
  int rc = ensure(c, s, deadline);
  if (rc)
    return rc;
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++)
    ecs_proto_key_write(&c->w, keys[idx[j]].data, (uint16_t)keys[idx[j]].len);
  ecs_hdr_t h;
  rc = ecs__cli_call(c, s, op, (uint32_t)m, NULL, 0, 0, ECS_CALL_COUNT, NULL, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  rc = ecs__cli_read_statuses(c, &h, idx, m, out);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
}

typedef struct keys_arg {
  const ecs_key_t *keys;
  uint8_t op;
  int *out;
} keys_arg_t;

static int keys_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  keys_arg_t *a = arg;
  return keys_one_server(c, s, a->op, a->keys, idx, m, a->out, deadline);
}

static int keys_status(void *arg, size_t i) {
  return ((keys_arg_t *)arg)->out[i];
}

static void keys_fail(void *arg, size_t i, int rc) {
  ((keys_arg_t *)arg)->out[i] = rc;
}

static void keys_again(void *arg, size_t i) {
  ((keys_arg_t *)arg)->out[i] = ECS_OK;
}

static const batch_kind_t keys_kind = {keys_share, keys_status, keys_fail, keys_again, 0, 0};

/* exists / remove on every copy (replicas): item i is sent to each of its
 * holders in turn, and is ECS_OK when any holder answered OK (it held the
 * key, or removed it), else the first holder's answer. */
static int keys_batch(ecs_client_t *c, uint8_t op, const ecs_key_t *keys, size_t n, int *out) {
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++)
    out[i] = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
  keys_arg_t a = {keys, op, out};
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  size_t *cur = malloc((n ? n : 1) * sizeof *cur);
  int *st = malloc((n ? n : 1) * sizeof *st);
  int ret = ECS_ENOMEM;
  if (!where || !cur || !st)
    goto out;
  ret = locate(c, keys, n, &keys_kind, &a, where);
  if (ret != ECS_OK)
    goto out;
  for (size_t i = 0; i < n; i++)
    cur[i] = where[i * ECS_CLI_MAX_COPIES];
  ret = run_batch(c, keys, n, &keys_kind, &a, cur);
  keys_arg_t b = {keys, op, st};
  for (size_t r = 1; r < ECS_CLI_MAX_COPIES; r++) {
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
      cur[i] = where[i * ECS_CLI_MAX_COPIES + r];
      st[i] = cur[i] == ECS_CLI_NOWHERE ? ECS_ENOTFOUND : ECS_OK;
      more += cur[i] != ECS_CLI_NOWHERE;
    }
    if (!more)
      break;
    int rc = run_batch(c, keys, n, &keys_kind, &b, cur);
    if (rc && !ret)
      ret = rc;
    for (size_t i = 0; i < n; i++)
      if (cur[i] != ECS_CLI_NOWHERE && st[i] == ECS_OK)
        out[i] = ECS_OK;
  }
  int carried = 0; /* an error every item got past on another copy is no error */
  for (size_t i = 0; i < n && ret != ECS_OK && ret != ECS_ENOMEM; i++)
    carried |= out[i] == ret;
  if (ret != ECS_OK && ret != ECS_ENOMEM && !carried)
    ret = ECS_OK;
out:
  free(where);
  free(cur);
  free(st);
  return ret;
}

/* ---- upsert: a put that replaces every copy ---- */

/* An upsert replaces an object, but with discovery Redis may list copies
 * on servers this upsert did not write: put there before a join or leave
 * moved the key's rank, or by a put with more replicas.  Those still hold
 * the old bytes and a get could read one, so they are removed (each
 * server then drops its own holder entry).  Best effort: one lookup round
 * trip and a REMOVE per such server; the upsert's statuses stand. */
static void upsert_drop_others(ecs_client_t *c, const ecs_key_t *keys, size_t n, const int *status,
                               const size_t *wrote) {
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  size_t *cur = malloc((n ? n : 1) * sizeof *cur);
  int *st = malloc((n ? n : 1) * sizeof *st);
  char saved[sizeof c->errmsg];
  snprintf(saved, sizeof saved, "%s", c->errmsg);
  if (!where || !cur || !st)
    goto out;
  for (size_t i = 0; i < n; i++)
    st[i] = status[i] == ECS_OK || status[i] == ECS_EREDIS ? ECS_OK : ECS_ENOTFOUND;
  keys_arg_t a = {keys, ECS_OP_REMOVE, st};
  if (locate(c, keys, n, &keys_kind, &a, where) != ECS_OK)
    goto out;
  for (size_t r = 0; r < ECS_CLI_MAX_COPIES; r++) {
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
      size_t s = where[i * ECS_CLI_MAX_COPIES + r];
      int mine = s == ECS_CLI_NOWHERE || (status[i] != ECS_OK && status[i] != ECS_EREDIS);
      for (size_t w = 0; w < ECS_CLI_MAX_COPIES && !mine; w++)
        mine = wrote[i * ECS_CLI_MAX_COPIES + w] == s;
      cur[i] = mine ? ECS_CLI_NOWHERE : s;
      st[i] = mine ? ECS_ENOTFOUND : ECS_OK;
      more += !mine;
    }
    if (more)
      (void)run_batch(c, keys, n, &keys_kind, &a, cur);
  }
out:
  snprintf(c->errmsg, sizeof c->errmsg, "%s", saved);
  free(where);
  free(cur);
  free(st);
}

/* The same path as a put with one flag on every item; the server does the
 * replacing (store/server/objstore.h, reserve_replace). */
int ecs_upsert_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                     int *status) {
  if (!c || (n && (!keys || !tensors || !status)))
    return ECS_EINVAL;
  c->put_flags = ECS_PUT_F_UPSERT;
  size_t *wrote = c->discover ? malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *wrote) : NULL;
  if (c->discover && !wrote) {
    c->put_flags = 0;
    return ECS_ENOMEM;
  }
  for (size_t i = 0; wrote && i < n * ECS_CLI_MAX_COPIES; i++)
    wrote[i] = ECS_CLI_NOWHERE;
  int ret = put_batch(c, keys, tensors, n, status, wrote);
  c->put_flags = 0;
  if (wrote && ret == ECS_OK)
    upsert_drop_others(c, keys, n, status, wrote);
  free(wrote);
  return ret;
}

int ecs_remove_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *status) {
  if (!c || (n && (!keys || !status)))
    return ECS_EINVAL;
  return keys_batch(c, ECS_OP_REMOVE, keys, n, status);
}

static int exists_from_servers(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists);

int ecs_exists_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  if (!c || (n && (!keys || !exists)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++)
    exists[i] = 0;
  if (n == 0)
    return ECS_OK;
  if (c->meta && ecs_now_ms() >= c->redis_retry_ms) {
    const uint8_t **kp = malloc(n * sizeof *kp);
    uint16_t *kl = malloc(n * sizeof *kl);
    int *ex = malloc(n * sizeof *ex);
    int rc = ECS_ENOMEM;
    if (kp && kl && ex) {
      size_t m = 0;
      size_t *map = (size_t *)malloc(n * sizeof *map);
      if (map) {
        for (size_t i = 0; i < n; i++) {
          if (!key_ok(&keys[i]))
            continue; /* a bad key exists nowhere */
          kp[m] = keys[i].data;
          kl[m] = (uint16_t)keys[i].len;
          map[m++] = i;
        }
        rc = m ? ecs_meta_exists_batch(c->meta, kp, kl, m, ex) : ECS_OK;
        if (rc == ECS_OK)
          for (size_t j = 0; j < m; j++)
            exists[map[j]] = ex[j] == 1;
        free(map);
      }
    }
    free(kp);
    free(kl);
    free(ex);
    if (rc != ECS_ECONN && rc != ECS_ETIMEDOUT && rc != ECS_EREDIS)
      return rc;
    /* Redis is down or frozen: the servers hold the truth about their own
     * objects, so ask them rather than fail a scheduler's check, and keep
     * asking them for a while rather than pay a frozen Redis's timeout on
     * every call. */
    c->redis_retry_ms = ecs_now_ms() + ECS_CLI_REDIS_RETRY_MS;
  }
  if (!c->meta)
    return exists_from_servers(c, keys, n, exists);
  /* If the servers fail too, both reasons are in the message. */
  char why[128];
  snprintf(why, sizeof why, "%s", ecs_meta_errstr(c->meta));
  int frc = exists_from_servers(c, keys, n, exists);
  if (frc != ECS_OK) {
    char srv[sizeof c->errmsg];
    snprintf(srv, sizeof srv, "%s", c->errmsg);
    ecs__cli_err(c, "Redis unreachable (%s) and servers failed too: %s", why, srv);
  }
  return frc;
}

/* exists answered by the servers: each server says whether it holds the
 * keys routed to it. */
static int exists_from_servers(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  int *st = malloc(n * sizeof *st);
  if (!st)
    return ECS_ENOMEM;
  int rc = keys_batch(c, ECS_OP_EXISTS, keys, n, st);
  if (rc == ECS_OK)
    for (size_t i = 0; i < n; i++)
      exists[i] = st[i] == ECS_OK;
  free(st);
  return rc;
}

/* ------------------------------------------------------------------ */
/* stat / ping / debug                                                  */

/* A request whose records the caller builds in c->w *after* this connects
 * (a reconnect's HELLO reuses c->w); the reply's records stay in c->rmeta. */
typedef void (*build_fn)(ecs_client_t *c, const void *arg, size_t len);

static int simple_rpc_once(ecs_client_t *c, srv_t *s, uint8_t op, build_fn build, const void *arg, size_t len,
                           ecs_hdr_t *h, uint64_t deadline) {
  int rc = ensure(c, s, deadline);
  if (rc)
    return rc;
  ecs_wbuf_reset(&c->w);
  if (build)
    build(c, arg, len);
  rc = ecs__cli_call(c, s, op, 0, NULL, 0, 0, 0, NULL, h, deadline);
  if (rc != ECS_OK && h->status == ECS_OK) /* not the server's answer: the stream is lost */
    return ecs__cli_fail(c, s, rc);
  return rc;
}

static int simple_rpc(ecs_client_t *c, srv_t *s, uint8_t op, build_fn build, const void *arg, size_t len,
                      ecs_hdr_t *h) {
  uint64_t deadline = ecs__cli_deadline(c);
  int reused = s->fd >= 0;
  int rc = simple_rpc_once(c, s, op, build, arg, len, h, deadline);
  if (rc == ECS_ECONN && reused) /* a stale connection: retry once on a fresh one */
    rc = simple_rpc_once(c, s, op, build, arg, len, h, deadline);
  return rc;
}

int ecs_stat(ecs_client_t *c, size_t server, ecs_server_stat_t *st) {
  if (!c || !st || server >= c->nsrv)
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  srv_t *s = &c->srv[server];
  ecs_hdr_t h;
  int rc = simple_rpc(c, s, ECS_OP_STAT, NULL, NULL, 0, &h);
  if (rc)
    return rc;
  ecs_stat_reply_t sr;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  rc = ecs_proto_stat_read(&r, &sr);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  memset(st, 0, sizeof *st);
  st->pool_size = sr.pool_size;
  st->bytes_in_use = sr.bytes_in_use;
  st->bytes_free = sr.bytes_free;
  st->largest_free = sr.largest_free;
  st->bytes_requested = sr.bytes_requested;
  st->objects = sr.objects;
  st->puts = sr.puts;
  st->gets = sr.gets;
  st->hits = sr.hits;
  st->misses = sr.misses;
  st->evictions = sr.evictions;
  st->removes = sr.removes;
  st->connections = sr.connections;
  st->epoch = sr.epoch;
  st->redis_ok = sr.redis_ok;
  st->pool_locked = sr.pool_locked;
  snprintf(st->node_id, sizeof st->node_id, "%s", s->node_id);
  snprintf(st->address, sizeof st->address, "%s", s->addr);
  return ECS_OK;
}

int ecs_ping(ecs_client_t *c) {
  if (!c)
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  ecs__place_refresh(c, 0);
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < c->nsrv; i++) {
    ecs_hdr_t h;
    if (!c->srv[i].live) /* departed (discovery) */
      continue;
    int rc = simple_rpc(c, &c->srv[i], ECS_OP_PING, NULL, NULL, 0, &h);
    if (rc)
      return rc;
  }
  return ECS_OK;
}

static void build_corrupt(ecs_client_t *c, const void *key, size_t key_len) {
  ecs_wbuf_u32(&c->w, 1); /* DEBUG subcode 1: corrupt one byte */
  ecs_proto_key_write(&c->w, key, (uint16_t)key_len);
}

int ecs__client_debug_corrupt(ecs_client_t *c, const void *key, size_t key_len) {
  ecs_key_t k = {key, key_len};
  if (!c || !key_ok(&k))
    return ECS_EINVAL;
  ecs_hdr_t h;
  int st = ECS_OK;
  size_t where[ECS_CLI_MAX_COPIES]; /* the nearest copy is the one corrupted */
  int rc = locate(c, &k, 1, &keys_kind, &(keys_arg_t){&k, ECS_OP_DEBUG, &st}, where);
  if (rc || st)
    return rc ? rc : st;
  return simple_rpc(c, &c->srv[where[0]], ECS_OP_DEBUG, build_corrupt, key, key_len, &h);
}

int ecs__client_server_fd(ecs_client_t *c, size_t server) {
  return server < c->nsrv ? c->srv[server].fd : -1;
}

const char *ecs_client_transport(const ecs_client_t *c) {
  /* a server not connected now counts as tcp: that is where it starts */
  const char *name = NULL;
  for (size_t i = 0; i < c->nsrv; i++) {
    if (c->discover && !c->srv[i].ops)
      continue; /* discovered servers are connected when used: only those count */
    const char *n = c->srv[i].ops ? c->srv[i].ops->name : ecs__cli_tcp_ops.name;
    if (name && strcmp(name, n) != 0)
      return "mixed";
    name = n;
  }
  return name ? name : "tcp";
}
