/*
 * libecstore client: setting up a handle; see include/ecstore/ecstore.h.
 *
 * The configuration's defaults and checks, the servers list, choosing the
 * data path (and what to do when a server cannot take it), the Redis link,
 * and connecting one server on demand (ecs__cli_ensure: connect, HELLO,
 * upgrade to the path), which every request goes through.
 */
#include "ecstore/ecstore.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
int ecs__cli_ensure(ecs_client_t *c, srv_t *s, uint64_t deadline) {
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
  /* Connecting is a call like any other: one deadline, timeout_ms, for
   * every connect and HELLO (each connect attempt also within
   * connect_timeout_ms).  It used to add the two, so a stopped server held
   * ecstore-cli for twice its --timeout-ms (issue 24). */
  uint64_t deadline = ecs_now_ms() + (uint64_t)c->cfg.timeout_ms;
  c->call_deadline = deadline; /* the Redis steps below share it (review finding C2) */
  for (size_t i = 0; i < c->nsrv && !c->discover; i++) { /* discovered servers: lazily */
    rc = ecs__cli_ensure(c, &c->srv[i], deadline);
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
    mo.timeout_ms =
        c->cfg.timeout_ms < ECS_CLI_REDIS_TIMEOUT_MS ? c->cfg.timeout_ms : ECS_CLI_REDIS_TIMEOUT_MS;
    /* every step of the first connect (each sentinel, AUTH, SELECT, ROLE,
     * SCRIPT LOAD) within the connect call's Redis budget: they each took
     * timeout_ms, after the servers had taken theirs (C2) */
    mo.connect_until_ms = ecs__cli_redis_until(c);
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
  ecs__cli_end(c, ECS_OK);
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
