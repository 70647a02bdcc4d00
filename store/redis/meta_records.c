/*
 * Redis metadata: object records (store/redis/meta.h).  Formatting a
 * record's HSET, parsing one back, and the check script's batches
 * (ecs_meta_exists_batch, ecs_meta_lookup_batch; the re-sync sweep runs the
 * same script).
 */
#include "store/redis/meta_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/net.h"

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

/* "ecs:{ns}:obj:" + key into buf; returns its length. */
size_t ecs__meta_obj_key(const ecs_meta_t *m, char *buf, const void *key, uint16_t key_len) {
  memcpy(buf, m->obj_pfx, m->obj_pfx_len);
  memcpy(buf + m->obj_pfx_len, key, key_len);
  return m->obj_pfx_len + key_len;
}

/* Formats rec's HSET; -1 for a record that cannot be written. */
int ecs__meta_rec_format(const ecs_meta_t *m, const ecs_meta_rec_t *rec, meta_rec_fmt_t *f) {
  if (rec->key == NULL || rec->key_len == 0 || rec->key_len > ECS_MAX_KEY || rec->desc.ndim > ECS_MAX_DIMS)
    return -1;
  size_t klen = ecs__meta_obj_key(m, f->key, rec->key, rec->key_len);
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

/* ---- the check script: exists, lookup, sweep -------------------------- */

/* Builds chunk ci's argv with EVALSHA (or EVAL with the body); returns argc. */
int ecs__meta_chunk_argv(ecs_meta_t *m, meta_batch_t *b, size_t ci, int eval) {
  size_t lo = ci * META_CHUNK, hi = lo + META_CHUNK < b->n ? lo + META_CHUNK : b->n;
  int a = 0;
  snprintf(b->nk, sizeof b->nk, "%zu", hi - lo);
  b->argv[a] = eval ? "EVAL" : "EVALSHA";
  b->argl[a] = strlen(b->argv[a]);
  a++;
  b->argv[a] = eval ? ecs__meta_check_lua : m->sha;
  b->argl[a] = eval ? ecs__meta_check_lua_len : strlen(m->sha);
  a++;
  b->argv[a] = b->nk;
  b->argl[a++] = strlen(b->nk);
  char *p = b->kbuf;
  for (size_t j = lo; j < hi; j++) {
    size_t i = b->idx[j];
    size_t kl = ecs__meta_obj_key(m, p, b->keys[i], b->lens[i]);
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

int ecs__meta_is_noscript(const redisReply *r) {
  return r->type == REDIS_REPLY_ERROR && r->len >= 8 && memcmp(r->str, "NOSCRIPT", 8) == 0;
}

/* Checks one chunk's reply and hands its elements to each(). */
static int meta_chunk_done(ecs_meta_t *m, meta_batch_t *b, size_t ci, const redisReply *r, meta_each_fn each,
                           void *ctx) {
  size_t lo = ci * META_CHUNK, hi = lo + META_CHUNK < b->n ? lo + META_CHUNK : b->n;
  int rc = ecs__meta_reply_err(m, r, "check script");
  if (rc != ECS_OK)
    return rc;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != hi - lo) {
    ecs__meta_seterr(m, "check script: unexpected reply");
    return ECS_EREDIS;
  }
  for (size_t j = lo; j < hi; j++)
    each(ctx, b->idx[j], r->element[j - lo]);
  return ECS_OK;
}

int ecs__meta_run_check(ecs_meta_t *m, meta_batch_t *b, meta_each_fn each, void *ctx) {
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
    int argc = ecs__meta_chunk_argv(m, b, ci, m->sha[0] == '\0');
    rc = ecs__meta_append(m, argc, b->argv, b->argl);
    if (rc != ECS_OK)
      goto out;
  }
  uint64_t deadline = ecs__meta_deadline(m);
  /* Read every reply before acting on any error, so that the link stays
   * in step.  A NOSCRIPT chunk (the script cache was flushed) is sent again
   * with the script's body once the pipeline is drained. */
  m->busy = 1;
  for (size_t ci = 0; ci < nchunks; ci++) {
    redisReply *r;
    int e = ecs__meta_reply(m, &r, deadline);
    if (e != ECS_OK) {
      rc = e;
      goto out;
    }
    if (ecs__meta_is_noscript(r))
      noscript[ci] = 1;
    else if (rc == ECS_OK)
      rc = meta_chunk_done(m, b, ci, r, each, ctx);
    freeReplyObject(r);
  }
  for (size_t ci = 0; ci < nchunks && rc == ECS_OK; ci++) {
    if (!noscript[ci])
      continue;
    redisReply *r;
    int argc = ecs__meta_chunk_argv(m, b, ci, 1);
    rc = ecs__meta_cmd(m, &r, argc, b->argv, b->argl);
    if (rc != ECS_OK)
      goto out;
    rc = meta_chunk_done(m, b, ci, r, each, ctx);
    freeReplyObject(r);
    if (m->sha[0] != '\0' && ecs__meta_load_script(m) != ECS_OK)
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
size_t *ecs__meta_valid_idx(const uint16_t *lens, size_t n, size_t *nvalid) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx);
  size_t k = 0;
  if (idx != NULL)
    for (size_t i = 0; i < n; i++)
      if (lens[i] >= 1 && lens[i] <= ECS_MAX_KEY)
        idx[k++] = i;
  *nvalid = k;
  return idx;
}

/* Runs a check batch; a client whose pooled link had gone stale (Redis
 * restarted: EOF or reset, not a timeout) retries once on a fresh one. */
static int meta_check_batch(ecs_meta_t *m, meta_batch_t *b, meta_each_fn each, void *ctx) {
  int rc = ecs__meta_ensure_link(m);
  if (rc != ECS_OK)
    return rc;
  int was_used = m->link.used;
  rc = ecs__meta_run_check(m, b, each, ctx);
  if (rc == ECS_ECONN && !ecs__rds_up(&m->link) && was_used && !m->server) {
    rc = ecs__meta_connect(m);
    if (rc == ECS_OK)
      rc = ecs__meta_run_check(m, b, each, ctx);
  }
  return rc;
}

static int meta_parse_rec(const redisReply *e, ecs_meta_rec_t *rec);

/* A record exists when the lookup would find it: its fields parse and a
 * holder is live (before: any record with a live "node" and "epoch", so a
 * forged or junk record said yes, and the get then missed). */
static void meta_each_exists(void *ctx, size_t i, const redisReply *e) {
  int *exists = ctx;
  ecs_meta_rec_t rec;
  exists[i] = e->type == REDIS_REPLY_ARRAY && meta_parse_rec(e, &rec) == 0;
}

int ecs_meta_exists_batch(ecs_meta_t *m, const uint8_t *const *keys, const uint16_t *lens, size_t n,
                          int *exists) {
  if (n > 0 && (exists == NULL || keys == NULL || lens == NULL))
    return ECS_EINVAL;
  for (size_t i = 0; i < n; i++)
    exists[i] = 0;
  if (m == NULL)
    return ECS_EINVAL;
  meta_batch_t b = {.keys = keys, .lens = lens, .mode = "l"}; /* the whole record, parsed as lookup does */
  size_t *idx = ecs__meta_valid_idx(lens, n, &b.n);
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
  size_t *idx = ecs__meta_valid_idx(lens, n, &b.n);
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
