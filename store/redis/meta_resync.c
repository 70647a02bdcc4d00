/*
 * Redis metadata: the re-sync sweep (store/redis/meta.h), blocking (tick,
 * unregister) and asynchronous (on the server's loop).
 */
#include "store/redis/meta_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/net.h"

/* ---- server: the blocking sweep (tick, unregister) --------------------- */

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
int ecs__meta_sweep_step(ecs_meta_t *m, const ecs_meta_resync_t *rs, int *done) {
  const char *argv[] = {"SCAN", m->cursor, "MATCH", m->match, "COUNT", META_SCAN_COUNT};
  redisReply *r;
  *done = 0;
  int rc = ecs__meta_cmdv(m, &r, 6, argv);
  if (rc != ECS_OK)
    return rc;
  rc = ecs__meta_reply_err(m, r, "SCAN");
  if (rc == ECS_OK &&
      (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
       r->element[0]->len >= sizeof m->cursor || r->element[1]->type != REDIS_REPLY_ARRAY)) {
    ecs__meta_seterr(m, "SCAN: unexpected reply");
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
    size_t *idx = ecs__meta_valid_idx(lens, nk, &b.n);
    if (idx == NULL) {
      rc = ECS_ENOMEM;
      goto out;
    }
    b.idx = idx;
    meta_sweep_ctx_t ctx = {m, rs, keys, lens};
    rc = ecs__meta_run_check(m, &b, meta_each_sweep, &ctx);
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
int ecs__meta_resync(ecs_meta_t *m, const ecs_meta_resync_t *rs) {
  if (!m->sweeping) {
    m->sweeping = 1;
    m->resync_owed = 0;
    snprintf(m->cursor, sizeof m->cursor, "0");
  }
  for (int step = 0; step < META_SCAN_STEPS; step++) {
    int done, rc = ecs__meta_sweep_step(m, rs, &done);
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
  ecs__meta_dq_flush(m);
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
    int argc = ecs__meta_chunk_argv(m, &b, ci, 1);
    rc = ecs__meta_acmd(m, meta_sweep_check_done, ch, argc, argv, argl);
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
      ecs__meta_seterr(m, "SCAN: unexpected reply");
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
  if (ecs__meta_acmd(m, meta_sweep_scan_done, m, 6, argv, NULL) != ECS_OK) {
    meta_sweep_fail(m);
    return;
  }
  m->sweep_busy = 1;
}

void ecs__meta_sweep_start(ecs_meta_t *m) {
  m->sweeping = 1;
  m->resync_owed = 0;
  snprintf(m->cursor, sizeof m->cursor, "0");
  meta_sweep_scan(m);
}
