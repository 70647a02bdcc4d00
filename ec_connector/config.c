/*
 * Connector configuration: defaults, the JSON keys (one table, so the
 * parser, the checks and the messages can never disagree), and the checks
 * ecs_ec_open() runs before connecting.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ec_connector/conn_internal.h"
#include "store/redis/rds.h"
#include "ec_connector/json.h"
#include "ecstore/ec_connector.h"
#include "store/core/parse.h"

typedef enum key_kind {
  K_STR,     /* string into a char array */
  K_CHOICE,  /* string, one of a list */
  K_INT,     /* integer in [lo, hi] */
  K_BOOL,    /* true/false */
  K_SIZE,    /* integer or "64M" in [lo, hi] */
  K_BACKEND, /* "ecstore" | "disk" | "redis" */
  K_SERVERS  /* string, or array of strings joined with ',' */
} key_kind_t;

typedef struct key_def {
  const char *name;    /* JSON key */
  key_kind_t kind;     /* how to read it */
  size_t off;          /* field offset in ecs_ec_config_t */
  size_t cap;          /* K_STR/K_CHOICE/K_SERVERS: array size */
  long long lo, hi;    /* K_INT/K_SIZE bounds */
  const char *choices; /* K_CHOICE: "a|b|c" */
} key_def_t;

#define F(field) offsetof(ecs_ec_config_t, field)
#define CAP(field) sizeof(((ecs_ec_config_t *)0)->field)

static const key_def_t keys[] = {
    {"backend", K_BACKEND, F(backend), 0, 0, 0, NULL},
    {"servers", K_SERVERS, F(servers), CAP(servers), 0, 0, NULL},
    {"redis_url", K_STR, F(redis_url), CAP(redis_url), 0, 0, NULL},
    {"namespace", K_STR, F(ns), CAP(ns), 0, 0, NULL},
    {"auth_token", K_STR, F(auth_token), CAP(auth_token), 0, 0, NULL},
    {"protocol", K_CHOICE, F(protocol), CAP(protocol), 0, 0, "auto|tcp|shm|rdma"},
    {"device", K_STR, F(device), CAP(device), 0, 0, NULL},
    {"rdma_port", K_INT, F(rdma_port), 0, 1, 255, NULL},
    {"rdma_gid_index", K_INT, F(rdma_gid_index), 0, 0, 255, NULL},
    {"compression", K_CHOICE, F(compression), CAP(compression), 0, 0, "none|lz4|zstd|auto"},
    {"connect_timeout_ms", K_INT, F(connect_timeout_ms), 0, 1, 600000, NULL},
    {"timeout_ms", K_INT, F(timeout_ms), 0, 1, 3600000, NULL},
    {"save_timeout_ms", K_INT, F(save_timeout_ms), 0, 0, 3600000, NULL},
    {"verify_checksum", K_BOOL, F(verify_checksum), 0, 0, 0, NULL},
    {"staging_bytes", K_SIZE, F(staging_bytes), 0, 1 << 16, 1LL << 40, NULL},
    {"queue_depth", K_INT, F(queue_depth), 0, 1, 65536, NULL},
    {"batch_size", K_INT, F(batch_size), 0, 1, 4096, NULL},
    {"disk_path", K_STR, F(disk_path), CAP(disk_path), 0, 0, NULL},
    {"disk_fsync", K_BOOL, F(disk_fsync), 0, 0, 0, NULL},
    {"redis_ttl_s", K_INT, F(redis_ttl_s), 0, 0, 365 * 86400, NULL},
    {"kv_ttl_s", K_INT, F(kv_ttl_s), 0, 1, 365 * 86400, NULL},
    {"lookup_retries", K_INT, F(lookup_retries), 0, 0, 100, NULL},
    {"retry_backoff_ms", K_INT, F(retry_backoff_ms), 0, 1, 60000, NULL},
    {"redis_password_file", K_STR, F(redis_password_file), CAP(redis_password_file), 0, 0, NULL},
    {"sentinel_password_file", K_STR, F(sentinel_password_file), CAP(sentinel_password_file), 0, 0, NULL},
    {"placement", K_CHOICE, F(placement), CAP(placement), 0, 0, "hash|local|least-loaded"},
    {"replicas", K_INT, F(replicas), 0, 1, ECS_MAX_REPLICAS, NULL},
};

void ecs_ec_config_init(ecs_ec_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->backend = ECS_EC_BACKEND_ECSTORE;
  cfg->servers[0] = '\0'; /* the servers registered in redis_url's Redis */
  snprintf(cfg->placement, sizeof cfg->placement, "hash");
  snprintf(cfg->ns, sizeof cfg->ns, "default");
  snprintf(cfg->protocol, sizeof cfg->protocol, "auto");
  snprintf(cfg->compression, sizeof cfg->compression, "none");
  cfg->rdma_port = 1;
  cfg->connect_timeout_ms = 2000;
  cfg->timeout_ms = 10000;
  cfg->save_timeout_ms = 5000;
  cfg->verify_checksum = 1;
  cfg->staging_bytes = 64ull << 20;
  cfg->queue_depth = 256;
  cfg->batch_size = 32;
  cfg->kv_ttl_s = 600;
  cfg->lookup_retries = 5;
  cfg->retry_backoff_ms = 20;
  cfg->replicas = 1;
}

const char *ecs_ec_backend_name(int backend) {
  switch (backend) {
  case ECS_EC_BACKEND_ECSTORE: return "ecstore";
  case ECS_EC_BACKEND_DISK: return "disk";
  case ECS_EC_BACKEND_REDIS: return "redis";
  }
  return "?";
}

__attribute__((format(printf, 3, 4))) static int cfg_fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return ECS_EINVAL;
}

static int want_type(const key_def_t *k, const ecs_json_t *v, ecs_json_type_t t, const char *what, char *err,
                     size_t errlen) {
  if (v->type == t)
    return ECS_OK;
  return cfg_fail(err, errlen, "key \"%s\": expected %s, got %s", k->name, what,
                  ecs__json_type_name(v->type));
}

static int set_str(const key_def_t *k, char *dst, const char *s, size_t len, char *err, size_t errlen) {
  if (memchr(s, '\0', len) != NULL)
    return cfg_fail(err, errlen, "key \"%s\": string holds a NUL byte", k->name);
  if (len >= k->cap)
    return cfg_fail(err, errlen, "key \"%s\": longer than %zu bytes", k->name, k->cap - 1);
  memcpy(dst, s, len);
  dst[len] = '\0';
  return ECS_OK;
}

static int in_choices(const char *choices, const char *s) {
  size_t n = strlen(s);
  const char *p = choices;
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t m = bar ? (size_t)(bar - p) : strlen(p);
    if (m == n && memcmp(p, s, n) == 0)
      return 1;
    if (!bar)
      break;
    p = bar + 1;
  }
  return 0;
}

static int set_servers(const key_def_t *k, char *dst, const ecs_json_t *v, char *err, size_t errlen) {
  if (v->type == ECS_JSON_STRING)
    return set_str(k, dst, v->str, v->len, err, errlen);
  if (v->type != ECS_JSON_ARRAY)
    return cfg_fail(err, errlen, "key \"servers\": expected a string or an array of strings, got %s",
                    ecs__json_type_name(v->type));
  if (v->count == 0)
    return cfg_fail(err, errlen, "key \"servers\": empty list");
  size_t len = 0;
  for (const ecs_json_t *e = v->child; e; e = e->next) {
    if (e->type != ECS_JSON_STRING || e->len == 0 || memchr(e->str, ',', e->len) ||
        memchr(e->str, '\0', e->len))
      return cfg_fail(err, errlen, "key \"servers\": each element must be a non-empty \"HOST:PORT\" string");
    if (len + e->len + 2 > k->cap)
      return cfg_fail(err, errlen, "key \"servers\": longer than %zu bytes", k->cap - 1);
    if (len)
      dst[len++] = ',';
    memcpy(dst + len, e->str, e->len);
    len += e->len;
    dst[len] = '\0';
  }
  return ECS_OK;
}

static int apply_key(ecs_ec_config_t *cfg, const key_def_t *k, const ecs_json_t *v, char *err,
                     size_t errlen) {
  char *base = (char *)cfg;
  int rc;
  if (v->type == ECS_JSON_NULL)
    return ECS_OK; /* null keeps the default (Python's None) */
  switch (k->kind) {
  case K_STR:
    if ((rc = want_type(k, v, ECS_JSON_STRING, "a string", err, errlen)) != ECS_OK)
      return rc;
    return set_str(k, base + k->off, v->str, v->len, err, errlen);
  case K_SERVERS: return set_servers(k, base + k->off, v, err, errlen);
  case K_CHOICE:
  case K_BACKEND: {
    const char *choices = k->kind == K_BACKEND ? "ecstore|disk|redis" : k->choices;
    if (v->type != ECS_JSON_STRING || !in_choices(choices, v->str))
      return cfg_fail(err, errlen, "key \"%s\": expected one of %s", k->name, choices);
    if (k->kind == K_CHOICE)
      return set_str(k, base + k->off, v->str, v->len, err, errlen);
    int b = !strcmp(v->str, "disk")    ? ECS_EC_BACKEND_DISK
            : !strcmp(v->str, "redis") ? ECS_EC_BACKEND_REDIS
                                       : ECS_EC_BACKEND_ECSTORE;
    memcpy(base + k->off, &b, sizeof b);
    return ECS_OK;
  }
  case K_BOOL: {
    if ((rc = want_type(k, v, ECS_JSON_BOOL, "true or false", err, errlen)) != ECS_OK)
      return rc;
    int b = v->boolean;
    memcpy(base + k->off, &b, sizeof b);
    return ECS_OK;
  }
  case K_INT: {
    if (v->type != ECS_JSON_NUMBER || !v->is_int || v->integer < k->lo || v->integer > k->hi)
      return cfg_fail(err, errlen, "key \"%s\": expected an integer in %lld..%lld", k->name, k->lo, k->hi);
    int i = (int)v->integer;
    memcpy(base + k->off, &i, sizeof i);
    return ECS_OK;
  }
  case K_SIZE: {
    uint64_t sz;
    if (v->type == ECS_JSON_NUMBER && v->is_int && v->integer >= 0) {
      sz = (uint64_t)v->integer;
    } else if (v->type == ECS_JSON_STRING && ecs_parse_size(v->str, &sz) == ECS_OK) {
      /* "64M" */
    } else {
      return cfg_fail(err, errlen, "key \"%s\": expected a byte count (a number or a size like \"64M\")",
                      k->name);
    }
    if (sz < (uint64_t)k->lo || sz > (uint64_t)k->hi)
      return cfg_fail(err, errlen, "key \"%s\": %llu is outside %lld..%lld bytes", k->name,
                      (unsigned long long)sz, k->lo, k->hi);
    memcpy(base + k->off, &sz, sizeof sz);
    return ECS_OK;
  }
  }
  return ECS_EINVAL;
}

int ecs_ec_config_parse_json(ecs_ec_config_t *cfg, const char *json, size_t len, char *err, size_t errlen) {
  if (err && errlen)
    err[0] = '\0';
  if (cfg == NULL || json == NULL)
    return cfg_fail(err, errlen, "no config or no JSON text");
  if (len == 0)
    len = strlen(json);
  ecs_json_t *root = NULL;
  char jerr[200];
  int rc = ecs__json_parse(json, len, &root, jerr, sizeof jerr);
  if (rc != ECS_OK) {
    if (err && errlen)
      snprintf(err, errlen, "JSON syntax: %s", jerr);
    return rc;
  }
  if (root->type != ECS_JSON_OBJECT) {
    ecs_json_type_t t = root->type;
    ecs__json_free(root);
    return cfg_fail(err, errlen, "JSON: the config must be an object, not %s", ecs__json_type_name(t));
  }
  rc = ECS_OK;
  for (const ecs_json_t *m = root->child; m && rc == ECS_OK; m = m->next) {
    const key_def_t *k = NULL;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
      if (strlen(keys[i].name) == m->key_len && memcmp(keys[i].name, m->key, m->key_len) == 0)
        k = &keys[i];
    if (k == NULL) {
      rc = cfg_fail(err, errlen, "unknown key \"%.64s\" (offset %zu)", m->key, m->offset);
      break;
    }
    rc = apply_key(cfg, k, m, err, errlen);
  }
  ecs__json_free(root);
  return rc;
}

int ecs_ec_config_load_file(ecs_ec_config_t *cfg, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    cfg_fail(err, errlen, "%s: %s", path, strerror(e));
    return ecs_from_errno(e);
  }
  size_t cap = ECS_JSON_MAX_INPUT + 1;
  char *buf = malloc(cap);
  if (buf == NULL) {
    fclose(f);
    return ECS_ENOMEM;
  }
  size_t n = fread(buf, 1, cap, f);
  int rerr = ferror(f);
  fclose(f);
  int rc;
  if (rerr)
    rc = cfg_fail(err, errlen, "%s: read error", path);
  else if (n > ECS_JSON_MAX_INPUT)
    rc = cfg_fail(err, errlen, "%s: larger than %u bytes", path, ECS_JSON_MAX_INPUT);
  else if (n == 0)
    rc = cfg_fail(err, errlen, "%s: empty file", path);
  else {
    char inner[300];
    rc = ecs_ec_config_parse_json(cfg, buf, n, inner, sizeof inner);
    if (rc != ECS_OK)
      cfg_fail(err, errlen, "%s: %s", path, inner);
  }
  free(buf);
  return rc;
}

int ecs__ec_config_check(const ecs_ec_config_t *cfg, char *err, size_t errlen) {
  if (cfg->backend < ECS_EC_BACKEND_ECSTORE || cfg->backend > ECS_EC_BACKEND_REDIS)
    return cfg_fail(err, errlen, "key \"backend\": expected one of ecstore|disk|redis");
  if (cfg->ns[0] == '\0')
    return cfg_fail(err, errlen, "key \"namespace\": must not be empty");
  if (cfg->queue_depth < 1 || cfg->batch_size < 1 || cfg->timeout_ms < 1 || cfg->connect_timeout_ms < 1)
    return cfg_fail(err, errlen, "queue_depth, batch_size and timeouts must be positive");
  if (cfg->staging_bytes < (1u << 16))
    return cfg_fail(err, errlen, "key \"staging_bytes\": at least 65536");
  switch (cfg->backend) {
  case ECS_EC_BACKEND_ECSTORE:
    if (cfg->redis_url[0] == '\0')
      return cfg_fail(err, errlen,
                      "key \"redis_url\": backend ecstore needs it (the scheduler's has() asks Redis only)");
    break;
  case ECS_EC_BACKEND_DISK:
    if (cfg->disk_path[0] == '\0')
      return cfg_fail(err, errlen, "key \"disk_path\": backend disk needs a directory");
    break;
  case ECS_EC_BACKEND_REDIS:
    if (cfg->redis_url[0] == '\0')
      return cfg_fail(err, errlen, "key \"redis_url\": backend redis needs it");
    break;
  }
  return ECS_OK;
}

int ecs__ec_config_secrets(ecs_ec_config_t *cfg, char *err, size_t errlen) {
  if ((cfg->redis_password_file[0] == '\0' && cfg->sentinel_password_file[0] == '\0') ||
      cfg->redis_url[0] == '\0')
    return ECS_OK;
  ecs__rds_url_t u;
  char why[600];
  int rc = ecs__rds_url_parse(cfg->redis_url, &u);
  if (rc != ECS_OK) {
    char shown[256];
    snprintf(err, errlen, "key \"redis_url\": bad URL '%s'",
             ecs__rds_url_redact(cfg->redis_url, shown, sizeof shown));
  } else if (cfg->redis_password_file[0] &&
             (rc = ecs__rds_read_secret(cfg->redis_password_file, u.pass, sizeof u.pass, why, sizeof why)) !=
                 ECS_OK) {
    snprintf(err, errlen, "key \"redis_password_file\": %s", why);
  } else if (cfg->sentinel_password_file[0] && !u.master[0]) {
    snprintf(err, errlen, "key \"sentinel_password_file\": needs a redis-sentinel:// redis_url");
    rc = ECS_EINVAL;
  } else if (cfg->sentinel_password_file[0] &&
             (rc = ecs__rds_read_secret(cfg->sentinel_password_file, u.spass, sizeof u.spass, why,
                                        sizeof why)) != ECS_OK) {
    snprintf(err, errlen, "key \"sentinel_password_file\": %s", why);
  } else if ((rc = ecs__rds_url_format(&u, 1, cfg->redis_url, sizeof cfg->redis_url)) != ECS_OK) {
    snprintf(err, errlen,
             "key \"redis_password_file\"/\"sentinel_password_file\": the passwords do not fit "
             "in a redis_url");
  }
  memset(&u, 0, sizeof u);
  return rc;
}
