/*
 * Replies that wait: a PUT, COMMIT or REMOVE is answered once Redis
 * acknowledged its records, and a PULL once its holders answered
 * (server_pull.c).  The request parks in its connection's reply queue
 * (server_conn.c) and the last acknowledgement builds its reply.  Split
 * from server.c, which keeps the Redis glue these use.
 */
#include "store/server/server_internal.h"

#include <stdlib.h>

#include "ecstore/error.h"
#include "store/core/log.h"
#include "store/core/net.h"

/* ---- replies that wait for their records ---- */

/*
 * A put is answered once Redis acknowledged its records, so that exists()
 * after an OK is true.  The records go out on the asynchronous link with
 * everyone else's of the same loop iteration (group commit); the request
 * parks in its connection's reply queue until its own records are answered
 * (the connection reads and runs its next requests meanwhile, and replies
 * in request order), and no other connection waits for them.  A record Redis does not acknowledge within
 * the Redis timeout (or that cannot be sent: the link is down) makes its
 * item ECS_EREDIS: stored here, not published; the re-sync publishes it
 * (docs/redis-schema.md, "Writes").
 */

pub_wait_t *ecs__pub_begin(ecs_server_t *s, conn_t *c, uint32_t n) {
  if (s->meta == NULL || n == 0)
    return NULL;
  return ecs__pub_alloc(s, c, n);
}

pub_wait_t *ecs__pub_alloc(ecs_server_t *s, conn_t *c, uint32_t n) {
  pub_wait_t *w = calloc(1, sizeof *w);
  if (w == NULL)
    return NULL;
  w->items = calloc(n, sizeof *w->items);
  w->status = calloc(n, sizeof *w->status);
  if (w->items == NULL || w->status == NULL) {
    free(w->items);
    free(w->status);
    free(w);
    return NULL;
  }
  w->s = s;
  w->c = c;
  w->n = n;
  for (uint32_t i = 0; i < n; i++) {
    w->items[i].w = w;
    w->items[i].idx = i;
  }
  return w;
}

static void pub_free(pub_wait_t *w) {
  free(w->items);
  free(w->status);
  free(w);
}

/* Builds the reply of a parked request, once its last record is answered
 * (or at once, when it was parked only to keep its place in line): its
 * slot becomes ready, and the owner sends it after the older ones. */
static void pub_reply(pub_wait_t *w) {
  parked_t *pk = w->pk;
  ecs_server_t *s = w->s;
  pk->w = NULL;
  w->pk = NULL;
  ecs_wbuf_reset(&pk->body);
  for (uint32_t i = 0; i < w->n; i++)
    ecs_proto_status_write(&pk->body, w->status[i]);
  int oom = pk->body.err != ECS_OK;
  if (oom)
    ecs_wbuf_reset(&pk->body);
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = pk->opcode,
                 .flags = ECS_FLAG_REPLY,
                 .req_id = pk->req_id,
                 .status = oom ? ECS_ENOMEM : ECS_OK,
                 .count = oom ? 0 : w->n,
                 .meta_len = (uint32_t)pk->body.len,
                 .data_len = 0};
  ecs_proto_hdr_encode(&h, pk->hdr);
  pk->ready = 1;
  if (pk == &w->c->rq[w->c->rq_head])
    w->c->last_ms = ecs_now_ms(); /* it may leave now: from here on the peer is waited on */
  if (pk->t0_ns && pk->opcode < sizeof s->latency / sizeof s->latency[0])
    ecs_hist_observe(&s->latency[pk->opcode], ecs__now_ns() - pk->t0_ns);
  ecs__conn_unpark(s, w->c);
}

void ecs__pub_done(void *ctx, int rc) {
  struct pub_item *it = ctx;
  pub_wait_t *w = it->w;
  if (rc != ECS_OK && w->status[it->idx] == ECS_OK) {
    w->status[it->idx] = ECS_EREDIS;
    ECS_LOG_D("record not acknowledged (%s): stored, published by the re-sync", ecs_strerror(rc));
  }
  if (--w->pending > 0)
    return;
  if (w->c != NULL && w->pk != NULL)
    pub_reply(w);
  pub_free(w);
}

int ecs__pub_record(ecs_server_t *s, pub_wait_t *w, uint32_t idx, const ecs_obj_t *obj) {
  if (s->meta == NULL)
    return ECS_OK;
  ecs_meta_rec_t rec;
  ecs__server_rec(s, obj, &rec);
  if (w == NULL) {
    ecs_meta_queue_put(s->meta, &rec);
    return ECS_OK;
  }
  if (ecs_meta_put_async(s->meta, &rec, ecs__pub_done, &w->items[idx]) != ECS_OK)
    return ECS_EREDIS;
  w->pending++;
  return ECS_OK;
}

int ecs__pub_end(ecs_server_t *s, conn_t *c, pub_wait_t *w) {
  if (w == NULL)
    return 0;
  if (w->pending == 0 && c->rq_n == 0) {
    pub_free(w);
    return 0;
  }
  /* Parked: c reads its next requests meanwhile, and this reply keeps its
   * place in line (even when already answered, behind older ones). */
  w->pk = ecs__conn_park(s, c);
  w->pk->w = w;
  if (w->pending == 0) {
    pub_reply(w);
    pub_free(w);
  }
  return 1;
}

int ecs__pub_remove(ecs_server_t *s, pub_wait_t *w, uint32_t idx, const uint8_t *key, uint16_t klen) {
  s->pub_cur = w;
  s->pub_cur_idx = idx;
  int st = ecs_objstore_remove(s->os, key, klen); /* on_drop sends the delete */
  s->pub_cur = NULL;
  if (w == NULL)
    return st;
  if (st == ECS_OK && w->status[idx] == ECS_EREDIS)
    return ECS_EREDIS;
  return w->status[idx] = st;
}

void ecs__pub_abandon(pub_wait_t *w) {
  if (w == NULL)
    return;
  if (w->pk != NULL)
    w->pk->w = NULL;
  w->pk = NULL;
  w->c = NULL;
  if (w->pending == 0)
    pub_free(w);
}
