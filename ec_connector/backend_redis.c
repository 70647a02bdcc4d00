/*
 * Backend "redis": tensor bytes stored in Redis itself, as LMCache's Redis
 * backend does: one key per object, "ecs:{<ns>}:ect:<key>", holding the
 * 128-byte header (backend.h) followed by the bytes.  Batches are
 * pipelined: one write of every command, then the replies in order.
 *
 * A put is MULTI / SET key header / APPEND key bytes / [EXPIRE] / EXEC, so
 * a reader never sees a header without its bytes and the bytes are not
 * first copied into one buffer with the header.  Puts are flushed every
 * FLUSH_BYTES so a batch of large tensors does not build one huge output
 * buffer.  Redis refusing memory (maxmemory, "-OOM") is ECS_ENOSPC for the
 * item.  Objects live until redis_ttl_s (0: until removed or evicted by
 * Redis' own maxmemory policy).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ec_connector/backend.h"
#include "store/redis/rds.h"
#include "store/core/net.h"

#define FLUSH_BYTES (32u << 20)

typedef struct redis_h {
  ecs__rds_t r;      /* the link */
  char prefix[160];  /* "ecs:{<ns>}:ect:" */
  size_t prefix_len; /* its length */
  int ttl_s;         /* EXPIRE seconds, 0: none */
  int verify;        /* check checksums on load */
  char err[320];     /* last whole-batch error */
} redis_h_t;

static int rb_open(const ecs_ec_config_t *cfg, int kind, void **out, char *err, size_t errlen) {
  (void)kind;
  redis_h_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    return ECS_ENOMEM;
  int rc = ecs__rds_init(&h->r, cfg->redis_url, cfg->connect_timeout_ms, cfg->timeout_ms);
  int n = snprintf(h->prefix, sizeof h->prefix, "ecs:{%s}:ect:", cfg->ns);
  h->prefix_len = n > 0 && (size_t)n < sizeof h->prefix ? (size_t)n : 0;
  ecs__rds_set_route(&h->r, h->prefix); /* Redis Cluster: the namespace's slot */
  if (rc == ECS_OK)
    rc = ecs__rds_connect(&h->r);
  if (rc != ECS_OK) {
    snprintf(err, errlen, "key \"redis_url\": %s", ecs__rds_errmsg(&h->r));
    ecs__rds_close(&h->r);
    free(h);
    return rc;
  }
  h->ttl_s = cfg->redis_ttl_s;
  h->verify = cfg->verify_checksum;
  *out = h;
  return ECS_OK;
}

static void rb_close(void *hp) {
  redis_h_t *h = hp;
  if (h == NULL)
    return;
  ecs__rds_close(&h->r);
  free(h);
}

/* The Redis key of k into buf (capacity prefix + ECS_MAX_KEY). */
static size_t rb_key(const redis_h_t *h, const ecs_key_t *k, char *buf) {
  memcpy(buf, h->prefix, h->prefix_len);
  memcpy(buf + h->prefix_len, k->data, k->len);
  return h->prefix_len + k->len;
}

static void rb_fail_rest(redis_h_t *h, int rc, int *status, size_t from, size_t n) {
  snprintf(h->err, sizeof h->err, "%s", ecs__rds_errmsg(&h->r));
  for (size_t i = from; i < n; i++)
    if (status[i] == 1)
      status[i] = rc;
}

static int rb_put(void *hp, const ecs_key_t *keys, const ecs_tensor_t *t, size_t n, int *status) {
  redis_h_t *h = hp;
  char key[sizeof h->prefix + ECS_MAX_KEY];
  char ttl[24];
  snprintf(ttl, sizeof ttl, "%d", h->ttl_s);
  uint8_t(*hdr)[ECS__EC_HDR_SIZE] = malloc(n * ECS__EC_HDR_SIZE + 1);
  if (hdr == NULL)
    return ECS_ENOMEM;
  uint64_t deadline = ecs__rds_deadline(&h->r);
  int rc = ECS_OK;
  size_t i = 0;
  for (size_t k = 0; k < n; k++)
    status[k] = 1; /* not answered yet */
  while (i < n && rc == ECS_OK) {
    /* queue a group of at most FLUSH_BYTES (at least one item) */
    size_t first = i, bytes = 0;
    for (; i < n && (i == first || bytes + t[i].nbytes <= FLUSH_BYTES); i++) {
      int st = ecs_key_check(keys[i].data, keys[i].len);
      if (st == ECS_OK)
        st = ecs__ec_tensor_check(&t[i]);
      if (st != ECS_OK) {
        status[i] = st;
        continue;
      }
      size_t kl = rb_key(h, &keys[i], key);
      ecs__ec_hdr_encode(hdr[i], &t[i].desc, t[i].nbytes, ecs_checksum(t[i].data, t[i].nbytes));
      const char *multi[] = {"MULTI"};
      const char *set[] = {"SET", key, (const char *)hdr[i]};
      size_t set_l[] = {3, kl, ECS__EC_HDR_SIZE};
      const char *app[] = {"APPEND", key, t[i].nbytes ? (const char *)t[i].data : ""};
      size_t app_l[] = {6, kl, (size_t)t[i].nbytes};
      const char *exp[] = {"EXPIRE", key, ttl};
      size_t exp_l[] = {6, kl, strlen(ttl)};
      const char *exec[] = {"EXEC"};
      rc = ecs__rds_append(&h->r, 1, multi, NULL);
      if (rc == ECS_OK)
        rc = ecs__rds_append(&h->r, 3, set, set_l);
      if (rc == ECS_OK)
        rc = ecs__rds_append(&h->r, 3, app, app_l);
      if (rc == ECS_OK && h->ttl_s > 0)
        rc = ecs__rds_append(&h->r, 3, exp, exp_l);
      if (rc == ECS_OK)
        rc = ecs__rds_append(&h->r, 1, exec, NULL);
      if (rc != ECS_OK)
        break;
      bytes += t[i].nbytes;
    }
    if (rc != ECS_OK)
      break;
    /* read the replies of the group, in order */
    for (size_t j = first; j < i && rc == ECS_OK; j++) {
      if (status[j] != 1)
        continue;
      int nrep = h->ttl_s > 0 ? 5 : 4, item = ECS_OK;
      for (int q = 0; q < nrep; q++) {
        redisReply *rep;
        int r = ecs__rds_reply(&h->r, deadline, &rep);
        if (r == ECS_EREDIS && ecs__rds_up(&h->r)) {
          /* an error reply: the item fails, the link stays up */
          if (item == ECS_OK)
            item = strstr(ecs__rds_errmsg(&h->r), "OOM") ? ECS_ENOSPC : ECS_EREDIS;
          continue;
        }
        if (r != ECS_OK) {
          rc = r;
          break;
        }
        if (q == nrep - 1 && item == ECS_OK) {
          if (rep->type != REDIS_REPLY_ARRAY)
            item = ECS_EREDIS; /* EXEC aborted */
          for (size_t e = 0; rep->type == REDIS_REPLY_ARRAY && e < rep->elements; e++)
            if (rep->element[e]->type == REDIS_REPLY_ERROR)
              item = strstr(rep->element[e]->str, "OOM") ? ECS_ENOSPC : ECS_EREDIS;
        }
        freeReplyObject(rep);
      }
      if (rc == ECS_OK)
        status[j] = item;
    }
  }
  free(hdr);
  if (rc != ECS_OK) {
    rb_fail_rest(h, rc, status, 0, n);
    ecs__rds_close(&h->r); /* replies may be left unread: start clean */
  }
  return rc;
}

/* Checks a GET reply and copies it out. */
static void rb_get1(redis_h_t *h, const redisReply *rep, ecs_get_buf_t *b) {
  uint64_t nbytes, sum;
  if (rep->type == REDIS_REPLY_NIL) {
    b->status = ECS_ENOTFOUND;
    return;
  }
  if (rep->type != REDIS_REPLY_STRING || rep->len < ECS__EC_HDR_SIZE ||
      ecs__ec_hdr_decode((const uint8_t *)rep->str, &b->desc, &nbytes, &sum) != ECS_OK ||
      (uint64_t)rep->len - ECS__EC_HDR_SIZE != nbytes) {
    b->status = ECS_ECHECKSUM;
    return;
  }
  if (nbytes > b->capacity) {
    b->nbytes = nbytes;
    b->status = ECS_EBUFSMALL;
    return;
  }
  const void *bytes = rep->str + ECS__EC_HDR_SIZE;
  if (h->verify && ecs_checksum(bytes, (size_t)nbytes) != sum) {
    b->status = ECS_ECHECKSUM;
    return;
  }
  if (nbytes)
    memcpy(b->data, bytes, (size_t)nbytes);
  b->nbytes = nbytes;
  b->status = ECS_OK;
}

/* Pipelines one single-key command per key (cmd "GET", "EXISTS", "DEL")
 * and hands each reply to fn.  Invalid keys are skipped (status EKEY). */
typedef void (*rb_each_fn)(redis_h_t *h, size_t i, const redisReply *rep, void *arg);

static int rb_each(redis_h_t *h, const char *cmd, const ecs_key_t *keys, size_t n, int *skip, rb_each_fn fn,
                   void *arg) {
  char key[sizeof h->prefix + ECS_MAX_KEY];
  int rc = ECS_OK;
  for (size_t i = 0; i < n && rc == ECS_OK; i++) {
    skip[i] = ecs_key_check(keys[i].data, keys[i].len) != ECS_OK;
    if (skip[i])
      continue;
    size_t kl = rb_key(h, &keys[i], key);
    const char *argv[] = {cmd, key};
    size_t lens[] = {strlen(cmd), kl};
    rc = ecs__rds_append(&h->r, 2, argv, lens);
  }
  uint64_t deadline = ecs__rds_deadline(&h->r);
  for (size_t i = 0; i < n && rc == ECS_OK; i++) {
    if (skip[i])
      continue;
    redisReply *rep;
    rc = ecs__rds_reply(&h->r, deadline, &rep);
    if (rc != ECS_OK)
      break;
    fn(h, i, rep, arg);
    freeReplyObject(rep);
  }
  if (rc != ECS_OK) {
    snprintf(h->err, sizeof h->err, "%s", ecs__rds_errmsg(&h->r));
    ecs__rds_close(&h->r); /* replies may be left unread: start clean */
  }
  return rc;
}

static void get_fn(redis_h_t *h, size_t i, const redisReply *rep, void *arg) {
  ecs_get_buf_t *bufs = arg;
  rb_get1(h, rep, &bufs[i]);
}

static int rb_get(void *hp, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  int *skip = calloc(n + 1, sizeof *skip);
  if (skip == NULL)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    bufs[i].status = 1;
    bufs[i].nbytes = 0;
  }
  int rc = rb_each(hp, "GET", keys, n, skip, get_fn, bufs);
  for (size_t i = 0; i < n; i++) {
    if (skip[i])
      bufs[i].status = ECS_EKEY;
    else if (bufs[i].status == 1)
      bufs[i].status = rc != ECS_OK ? rc : ECS_EPROTO;
  }
  free(skip);
  return rc;
}

static void int_fn(redis_h_t *h, size_t i, const redisReply *rep, void *arg) {
  (void)h;
  int *out = arg;
  out[i] = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
}

static int rb_exists(void *hp, const ecs_key_t *keys, size_t n, int *out) {
  int *skip = calloc(n + 1, sizeof *skip);
  if (skip == NULL)
    return ECS_ENOMEM;
  memset(out, 0, n * sizeof *out);
  int rc = rb_each(hp, "EXISTS", keys, n, skip, int_fn, out);
  if (rc != ECS_OK)
    memset(out, 0, n * sizeof *out); /* an error is never "exists" */
  free(skip);
  return rc;
}

static int rb_remove(void *hp, const ecs_key_t *keys, size_t n, int *status) {
  int *skip = calloc(n + 1, sizeof *skip);
  if (skip == NULL)
    return ECS_ENOMEM;
  memset(status, 0, n * sizeof *status);
  int rc = rb_each(hp, "DEL", keys, n, skip, int_fn, status);
  for (size_t i = 0; i < n; i++)
    status[i] = skip[i] ? ECS_EKEY : rc != ECS_OK ? rc : status[i] ? ECS_OK : ECS_ENOTFOUND;
  free(skip);
  return rc;
}

static const char *rb_errmsg(void *hp) {
  return ((redis_h_t *)hp)->err;
}

static const char *rb_path(void *hp) {
  (void)hp;
  return "redis";
}

const ecs__ec_ops_t ecs__ec_ops_redis = {
    .name = "redis",
    .open = rb_open,
    .close = rb_close,
    .put = rb_put,
    .get = rb_get,
    .exists = rb_exists,
    .remove = rb_remove,
    .errmsg = rb_errmsg,
    .path = rb_path,
};
