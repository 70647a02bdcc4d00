/*
 * Backend "ecstore": libecstore, one client handle per connector role.
 * With a servers list, DATA handles talk to the servers only; the META
 * handle also connects to Redis, so has() is answered by Redis
 * (ecs_exists_batch), or by the servers while Redis is down.  Without one,
 * every handle finds the servers in Redis's registry (docs/multihost.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ec_connector/backend.h"

typedef struct ecstore_h {
  ecs_client_t *c; /* the client */
  char path[16];   /* transport asked for: "tcp", "shm", "rdma", "auto" */
} ecstore_h_t;

static int es_open(const ecs_ec_config_t *cfg, int kind, void **out, char *err, size_t errlen) {
  ecs_client_config_t cc;
  ecs_client_config_init(&cc);
  /* No servers list: every handle finds the servers in Redis's registry. */
  cc.servers = cfg->servers[0] ? cfg->servers : NULL;
  cc.redis_url = kind == ECS__EC_H_META || !cfg->servers[0] ? cfg->redis_url : NULL;
  cc.placement = cfg->placement;
  cc.replicas = cfg->replicas;
  cc.ns = cfg->ns;
  cc.auth_token = cfg->auth_token[0] ? cfg->auth_token : NULL;
  cc.connect_timeout_ms = cfg->connect_timeout_ms;
  cc.timeout_ms = cfg->timeout_ms;
  cc.verify_checksum = cfg->verify_checksum;
  cc.transport = cfg->protocol;
  cc.rdma_device = cfg->device[0] ? cfg->device : NULL;
  cc.rdma_port = cfg->rdma_port;
  cc.rdma_gid_index = cfg->rdma_gid_index;
  cc.compression = cfg->compression;
  ecstore_h_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    return ECS_ENOMEM;
  char cerr[256] = "";
  int rc = ecs_client_connect(&cc, &h->c, cerr, sizeof cerr);
  if (rc != ECS_OK) {
    if (rc == ECS_ENOTSUP)
      snprintf(err, errlen,
               "configuration not supported: protocol \"%s\", compression \"%s\" (keys \"protocol\", "
               "\"compression\"): %s",
               cfg->protocol, cfg->compression, cerr);
    else
      snprintf(err, errlen, "ecstore connect (servers \"%s\"): %s: %s",
               cfg->servers[0] ? cfg->servers : "from the registry", ecs_strerror(rc), cerr);
    free(h);
    return rc;
  }
  snprintf(h->path, sizeof h->path, "%s", cfg->protocol);
  *out = h;
  return ECS_OK;
}

static void es_close(void *hp) {
  ecstore_h_t *h = hp;
  if (h == NULL)
    return;
  ecs_client_close(h->c);
  free(h);
}

static int es_put(void *hp, const ecs_key_t *keys, const ecs_tensor_t *t, size_t n, int *status) {
  ecstore_h_t *h = hp;
  return ecs_put_batch(h->c, keys, t, n, status);
}

static int es_get(void *hp, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  ecstore_h_t *h = hp;
  return ecs_get_batch(h->c, keys, bufs, n);
}

static int es_exists(void *hp, const ecs_key_t *keys, size_t n, int *out) {
  ecstore_h_t *h = hp;
  return ecs_exists_batch(h->c, keys, n, out);
}

static int es_remove(void *hp, const ecs_key_t *keys, size_t n, int *status) {
  ecstore_h_t *h = hp;
  return ecs_remove_batch(h->c, keys, n, status);
}

static const char *es_errmsg(void *hp) {
  ecstore_h_t *h = hp;
  return ecs_client_errmsg(h->c);
}

/* The data path the client actually took ("tcp", "shm", "rdma"), not the
 * protocol asked for: "auto" resolves per server at connect. */
static const char *es_path(void *hp) {
  ecstore_h_t *h = hp;
  return h->c ? ecs_client_transport(h->c) : h->path;
}

const ecs__ec_ops_t ecs__ec_ops_ecstore = {
    .name = "ecstore",
    .open = es_open,
    .close = es_close,
    .put = es_put,
    .get = es_get,
    .exists = es_exists,
    .remove = es_remove,
    .errmsg = es_errmsg,
    .path = es_path,
};
