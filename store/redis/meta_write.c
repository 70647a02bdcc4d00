/*
 * Redis metadata: writes (store/redis/meta.h).  The blocking write queue
 * (queue_put, queue_del, flush), the asynchronous puts, and the record
 * deletes of the asynchronous mode, one script call per flush.
 */
#include "store/redis/meta_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/net.h"

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

void ecs_meta_queue_put(ecs_meta_t *m, const ecs_meta_rec_t *rec) {
  if (m == NULL || !m->server || rec == NULL)
    return;
  meta_rec_fmt_t f;
  if (m->async) {
    if (ecs__meta_rec_format(m, rec, &f) == 0)
      ecs__meta_async_write(m, META_REC_ARGC, f.argv, f.lens);
    return;
  }
  if (!ecs__rds_up(&m->link))
    return; /* down: the re-sync after the reconnect publishes it */
  if (ecs__meta_rec_format(m, rec, &f) != 0)
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
  size_t klen = ecs__meta_obj_key(m, k, key, key_len);
  return meta_del_now(m, k, klen, done, ctx);
}

void ecs_meta_queue_del(ecs_meta_t *m, const void *key, uint16_t key_len) {
  if (m == NULL || !m->server || (!m->async && !ecs__rds_up(&m->link)) || key == NULL || key_len == 0 ||
      key_len > ECS_MAX_KEY)
    return;
  char k[META_KEY_MAX];
  size_t klen = ecs__meta_obj_key(m, k, key, key_len);
  if (m->async) { /* sent with the next flush, one script call for all */
    meta_dq_add(m, k, klen);
    return;
  }
  const char *argv[] = {"EVAL", ecs__meta_del_lua, "1", k, m->node_id};
  size_t lens[] = {4, ecs__meta_del_lua_len, 1, klen, strlen(m->node_id)};
  meta_enqueue(m, 5, argv, lens);
  meta_maybe_autoflush(m);
}

int ecs_meta_flush(ecs_meta_t *m) {
  if (m == NULL || !m->server)
    return ECS_EINVAL;
  if (m->async) { /* commands leave with the loop's next write event */
    ecs__meta_dq_flush(m);
    return ecs__rdsa_up(&m->alink) ? ECS_OK : ecs__meta_not_connected(m);
  }
  if (!ecs__rds_up(&m->link)) {
    ecs__meta_queue_clear(m);
    return ecs__meta_not_connected(m);
  }
  if (m->qn == 0)
    return ECS_OK;
  for (size_t i = 0; i < m->qn; i++) {
    int rc = ecs__meta_append(m, m->q[i].argc, m->q[i].argv, m->q[i].lens);
    if (rc != ECS_OK)
      return rc; /* the link is down and the queue dropped */
  }
  size_t n = m->qn;
  ecs__meta_queue_clear(m);
  uint64_t deadline = ecs__meta_deadline(m);
  int rc = ECS_OK;
  m->busy = 1;
  for (size_t i = 0; i < n; i++) {
    redisReply *r;
    int e = ecs__meta_reply(m, &r, deadline);
    if (e != ECS_OK) {
      rc = e;
      break;
    }
    if (ecs__meta_reply_err(m, r, "flush") != ECS_OK) {
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

/* A write whose reply only matters when it failed: an error reply (OOM,
 * WRONGTYPE) means Redis may now miss a record, so a re-sync is owed; a
 * dropped link owes one anyway (meta_async_down). */
static void meta_write_done(void *ctx, int rc, redisReply *reply) {
  ecs_meta_t *m = ctx;
  (void)reply;
  if (rc == ECS_EREDIS && ecs__rdsa_up(&m->alink)) {
    ecs__meta_seterr(m, "%s", ecs__rdsa_errmsg(&m->alink));
    m->resync_owed = 1;
  }
}

/* Sends a write; when it cannot be sent, the re-sync will cover it. */
void ecs__meta_async_write(ecs_meta_t *m, int argc, const char **argv, const size_t *lens) {
  if (ecs__meta_acmd(m, meta_write_done, m, argc, argv, lens) != ECS_OK)
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
  if (ecs__meta_rec_format(m, rec, &f) != 0)
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
  int rc = ecs__meta_acmd(m, meta_put_done, w, argc, argv, lens);
  if (rc != ECS_OK) {
    free(w);
    m->resync_owed = 1;
    if (m->errstr[0] == '\0')
      ecs__meta_seterr(m, "%s",
                       ecs__rdsa_errmsg(&m->alink)[0] ? ecs__rdsa_errmsg(&m->alink) : "not connected");
    return ECS_ENOTCONN;
  }
  return ECS_OK;
}

/* ---- record deletes: one script call per flush -------------------------- */

/*
 * A script call deleting the records of n keys (ecs__meta_del_lua).  Eviction
 * deletes queue up in m->dq until the next flush, or until any other
 * command leaves (ecs__meta_acmd), and go as one call: Redis runs the script
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
  argv[1] = eval ? ecs__meta_del_lua : m->del_sha;
  lens[1] = eval ? ecs__meta_del_lua_len : strlen(m->del_sha);
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
  if (rc == ECS_EREDIS && reply != NULL && ecs__meta_is_noscript(reply) && !call->retried) {
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
    ecs__meta_dq_flush(m);
}

/* Sends the queued deletes as one script call; the call's record goes
 * with it (a new queue starts at the next delete). */
void ecs__meta_dq_flush(ecs_meta_t *m) {
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
  ecs__meta_dq_flush(m);
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
      ecs__meta_seterr(m, "%s",
                       ecs__rdsa_errmsg(&m->alink)[0] ? ecs__rdsa_errmsg(&m->alink) : "not connected");
    return ECS_ENOTCONN;
  }
  return ECS_OK;
}
