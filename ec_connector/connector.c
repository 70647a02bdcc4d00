/*
 * The EC connector: producer (save queue, pinned staging, the saver
 * thread), scheduler (has) and consumer (load handles, the loader thread).
 *
 * Two worker threads, each with its own backend handle (handles are
 * single-threaded): a saver that drains the save queue in batches of
 * batch_size, and a loader that serves load handles in the same batches.
 * They are apart so that a large put batch never delays a load, which is
 * on the engine's critical path.  Every wait is on a condition variable
 * with a monotonic deadline; nothing polls.
 *
 * Save slots: queue_depth fixed slots, on exactly one of four places: the
 * free list, the queue, the saver's hands (inflight), or the failed list.
 * A failed save keeps its slot (its key and status, not its staging bytes)
 * until wait_for_save reports it, so a failure can never be dropped, and
 * the memory of unreported failures stays bounded by queue_depth.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ec_connector/conn_internal.h"
#include "store/core/log.h"
#include "store/core/net.h"

#define NO_OFF UINT64_MAX

/* ------------------------------------------------------------------ */
/* small helpers                                                        */

static void deadline_ts(uint64_t deadline_ms, struct timespec *ts) {
  ts->tv_sec = (time_t)(deadline_ms / 1000);
  ts->tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
}

/* Waits on cv until signalled or the monotonic deadline; 1 when the
 * deadline has passed. */
static int cv_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ms) {
  if (ecs_now_ms() >= deadline_ms)
    return 1;
  struct timespec ts;
  deadline_ts(deadline_ms, &ts);
  pthread_cond_timedwait(cv, mu, &ts);
  return ecs_now_ms() >= deadline_ms;
}

static int cv_init(pthread_cond_t *cv) {
  pthread_condattr_t a;
  if (pthread_condattr_init(&a) != 0)
    return ECS_ENOMEM;
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
  return rc == 0 ? ECS_OK : ECS_ENOMEM;
}

static uint64_t deadline_after(const ecs_ec_conn_t *c, int timeout_ms) {
  return ecs_now_ms() + (uint64_t)(timeout_ms < 0 ? c->cfg.timeout_ms : timeout_ms);
}

static void list_push(ecs__save_slot_t *slots, ecs__slot_list_t *l, int i) {
  slots[i].next = -1;
  if (l->tail >= 0)
    slots[l->tail].next = i;
  else
    l->head = i;
  l->tail = i;
  l->count++;
}

static int list_pop(ecs__save_slot_t *slots, ecs__slot_list_t *l) {
  int i = l->head;
  if (i < 0)
    return -1;
  l->head = slots[i].next;
  if (l->head < 0)
    l->tail = -1;
  l->count--;
  slots[i].next = -1;
  return i;
}

/* A NUL-terminated key: its length, or 0 when it is not a valid key. */
static size_t key_len_of(const char *s) {
  if (s == NULL)
    return 0;
  size_t n = strnlen(s, ECS_MAX_KEY + 1);
  return ecs_key_check(s, n) == ECS_OK ? n : 0;
}

/* ------------------------------------------------------------------ */
/* workers                                                              */

static void *saver_main(void *arg) {
  ecs_ec_conn_t *c = arg;
  size_t batch = (size_t)c->cfg.batch_size;
  int *idx = calloc(batch, sizeof *idx);
  ecs_key_t *keys = calloc(batch, sizeof *keys);
  ecs_tensor_t *t = calloc(batch, sizeof *t);
  int *st = calloc(batch, sizeof *st);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (c->queued.count == 0 && !c->save_stop)
      pthread_cond_wait(&c->cv_work, &c->mu);
    if (c->save_stop)
      break;
    size_t k = 0;
    if (idx && keys && t && st)
      while (k < batch && c->queued.count > 0)
        idx[k++] = list_pop(c->slots, &c->queued);
    else /* no memory for the batch arrays: fail the queue, never hang it */
      while (c->queued.count > 0) {
        int i = list_pop(c->slots, &c->queued);
        c->slots[i].status = ECS_ENOMEM;
        list_push(c->slots, &c->failed, i);
      }
    c->inflight += k;
    pthread_mutex_unlock(&c->mu);

    for (size_t j = 0; j < k; j++) {
      ecs__save_slot_t *s = &c->slots[idx[j]];
      keys[j].data = s->key;
      keys[j].len = s->key_len;
      t[j].data = s->off == NO_OFF ? NULL : ecs_pool_ptr(c->staging, s->off);
      t[j].nbytes = s->nbytes;
      t[j].desc = s->desc;
      st[j] = 1; /* not answered */
    }
    int rc = k ? c->ops->put(c->h_save, keys, t, k, st) : ECS_OK;
    size_t nfail = 0;
    for (size_t j = 0; j < k; j++) {
      if (st[j] == 1)
        st[j] = rc != ECS_OK ? rc : ECS_EIO;
      nfail += st[j] != ECS_OK;
    }
    if (nfail)
      ECS_LOG_W("ec_connector: %zu of %zu saves failed (%s): %s", nfail, k,
                ecs_strerror(rc != ECS_OK ? rc : ECS_EIO), c->ops->errmsg(c->h_save));

    pthread_mutex_lock(&c->mu);
    for (size_t j = 0; j < k; j++) {
      ecs__save_slot_t *s = &c->slots[idx[j]];
      if (s->off != NO_OFF)
        ecs_pool_free(c->staging, s->off, (size_t)s->nbytes);
      s->off = NO_OFF;
      s->status = st[j];
      if (st[j] == ECS_OK) {
        c->saves_stored++;
        list_push(c->slots, &c->free_slots, idx[j]);
      } else {
        c->saves_failed++;
        list_push(c->slots, &c->failed, idx[j]);
      }
    }
    c->inflight -= k;
    pthread_cond_broadcast(&c->cv_done);
    pthread_cond_broadcast(&c->cv_room);
  }
  pthread_mutex_unlock(&c->mu);
  free(idx);
  free(keys);
  free(t);
  free(st);
  return NULL;
}

/* Takes the next batch of items off the load queue (lmu held). */
static ecs_ec_load_t *loader_take(ecs_ec_conn_t *c, size_t *first, size_t *count) {
  ecs_ec_load_t *ld = c->lq_head;
  size_t batch = (size_t)c->cfg.batch_size;
  size_t i = ld->next, k = 0;
  *first = i;
  while (i < ld->n && k < batch) {
    i++;
    k++;
  }
  ld->next = i;
  ld->inflight = k;
  if (ld->next >= ld->n) {
    c->lq_head = ld->qnext;
    if (c->lq_head == NULL)
      c->lq_tail = NULL;
    ld->queued = 0;
    ld->qnext = NULL;
  }
  *count = k;
  return ld;
}

static void *loader_main(void *arg) {
  ecs_ec_conn_t *c = arg;
  size_t batch = (size_t)c->cfg.batch_size;
  ecs_key_t *keys = calloc(batch, sizeof *keys);
  ecs_get_buf_t *bufs = calloc(batch, sizeof *bufs);
  size_t *map = calloc(batch, sizeof *map);
  pthread_mutex_lock(&c->lmu);
  for (;;) {
    while (c->lq_head == NULL && !c->load_stop)
      pthread_cond_wait(&c->lcv_work, &c->lmu);
    if (c->load_stop)
      break;
    size_t first, k;
    ecs_ec_load_t *ld = loader_take(c, &first, &k);
    pthread_mutex_unlock(&c->lmu);

    /* Items with an invalid key were finished at start_load. */
    size_t m = 0;
    int rc = ECS_ENOMEM;
    if (keys && bufs && map) {
      for (size_t j = first; j < first + k; j++) {
        ecs__load_item_t *it = &ld->items[j];
        if (it->key_len == 0)
          continue;
        keys[m].data = it->key;
        keys[m].len = it->key_len;
        memset(&bufs[m], 0, sizeof bufs[m]);
        bufs[m].data = it->dst;
        bufs[m].capacity = it->capacity;
        bufs[m].status = 1;
        map[m++] = j;
      }
      rc = m ? c->ops->get(c->h_load, keys, bufs, m) : ECS_OK;
      if (rc != ECS_OK)
        ECS_LOG_W("ec_connector: load batch of %zu failed: %s: %s", m, ecs_strerror(rc),
                  c->ops->errmsg(c->h_load));
    }

    pthread_mutex_lock(&c->lmu);
    for (size_t q = 0; q < m; q++) {
      ecs__load_item_t *it = &ld->items[map[q]];
      ecs_get_buf_t *b = &bufs[q];
      int s = b->status == 1 ? (rc != ECS_OK ? rc : ECS_EIO) : b->status;
      it->res.nbytes = b->nbytes;
      it->res.desc = b->desc;
      /* A size other than the engine expects is a miss, whatever landed
       * in the buffer: the engine would misread it. */
      if ((s == ECS_OK || s == ECS_EBUFSMALL) && it->expected && b->nbytes != it->expected)
        s = ECS_EDTYPE;
      it->res.status = s;
      if (s == ECS_OK) {
        c->load_hits++;
        c->load_bytes += b->nbytes;
      } else {
        c->load_misses++;
      }
    }
    if (m == 0 && rc != ECS_OK) /* no batch arrays: fail the items */
      for (size_t j = first; j < first + k; j++)
        if (ld->items[j].key_len) {
          ld->items[j].res.status = rc;
          c->load_misses++;
        }
    for (size_t j = first; j < first + k; j++)
      ld->ndone += ld->items[j].key_len != 0; /* invalid keys were counted at start_load */
    ld->inflight = 0;
    pthread_cond_broadcast(&c->lcv_done);
  }
  pthread_mutex_unlock(&c->lmu);
  free(keys);
  free(bufs);
  free(map);
  return NULL;
}

/* ------------------------------------------------------------------ */
/* open / close                                                         */

static void conn_free(ecs_ec_conn_t *c) {
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv_work);
  pthread_cond_destroy(&c->cv_done);
  pthread_cond_destroy(&c->cv_room);
  pthread_mutex_destroy(&c->lmu);
  pthread_cond_destroy(&c->lcv_work);
  pthread_cond_destroy(&c->lcv_done);
  pthread_mutex_destroy(&c->has_mu);
  pthread_mutex_destroy(&c->kv_mu);
  ecs_pool_destroy(c->staging);
  free(c->slots);
  free(c);
}

static void conn_stop(ecs_ec_conn_t *c) {
  pthread_mutex_lock(&c->mu);
  c->save_stop = 1;
  pthread_cond_broadcast(&c->cv_work);
  pthread_cond_broadcast(&c->cv_room);
  pthread_mutex_unlock(&c->mu);
  if (c->saver_started)
    pthread_join(c->saver, NULL);
  c->saver_started = 0;
  pthread_mutex_lock(&c->lmu);
  c->load_stop = 1;
  pthread_cond_broadcast(&c->lcv_work);
  pthread_mutex_unlock(&c->lmu);
  if (c->loader_started)
    pthread_join(c->loader, NULL);
  c->loader_started = 0;
  /* loads still queued end as canceled, so their waiters return */
  pthread_mutex_lock(&c->lmu);
  for (ecs_ec_load_t *ld = c->lq_head; ld; ld = ld->qnext) {
    for (size_t j = ld->next; j < ld->n; j++)
      if (ld->items[j].key_len) {
        ld->items[j].res.status = ECS_ECANCELED;
        ld->ndone++;
      }
    ld->next = ld->n;
    ld->queued = 0;
  }
  c->lq_head = c->lq_tail = NULL;
  pthread_cond_broadcast(&c->lcv_done);
  pthread_mutex_unlock(&c->lmu);
  c->ops->close(c->h_save);
  c->ops->close(c->h_load);
  c->ops->close(c->h_meta);
  c->h_save = c->h_load = c->h_meta = NULL;
  ecs__kv_shutdown(c);
}

int ecs_ec_open(const ecs_ec_config_t *cfg, ecs_ec_conn_t **out, char *err, size_t errlen) {
  char dummy[8];
  if (err == NULL || errlen == 0) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = '\0';
  if (out == NULL || cfg == NULL) {
    snprintf(err, errlen, "no config or no out pointer");
    return ECS_EINVAL;
  }
  *out = NULL;
  int rc = ecs__ec_config_check(cfg, err, errlen);
  if (rc != ECS_OK)
    return rc;
  ecs_ec_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return ECS_ENOMEM;
  c->cfg = *cfg;
  rc = ecs__ec_config_secrets(&c->cfg, err, errlen);
  if (rc != ECS_OK) {
    free(c);
    return rc;
  }
  c->ops = ecs__ec_ops_for(cfg->backend);
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->lmu, NULL);
  pthread_mutex_init(&c->has_mu, NULL);
  pthread_mutex_init(&c->kv_mu, NULL);
  if (cv_init(&c->cv_work) || cv_init(&c->cv_done) || cv_init(&c->cv_room) || cv_init(&c->lcv_work) ||
      cv_init(&c->lcv_done)) {
    conn_free(c);
    return ECS_ENOMEM;
  }
  size_t depth = (size_t)cfg->queue_depth;
  c->slots = calloc(depth, sizeof *c->slots);
  if (c->slots == NULL) {
    conn_free(c);
    return ECS_ENOMEM;
  }
  c->free_slots = c->queued = c->failed = (ecs__slot_list_t){-1, -1, 0};
  for (size_t i = 0; i < depth; i++) {
    c->slots[i].off = NO_OFF;
    list_push(c->slots, &c->free_slots, (int)i);
  }
  rc = c->ops->open(&c->cfg, ECS__EC_H_DATA, &c->h_save, err, errlen);
  if (rc == ECS_OK)
    rc = c->ops->open(&c->cfg, ECS__EC_H_DATA, &c->h_load, err, errlen);
  if (rc == ECS_OK)
    rc = c->ops->open(&c->cfg, ECS__EC_H_META, &c->h_meta, err, errlen);
  if (rc == ECS_OK) {
    if (pthread_create(&c->saver, NULL, saver_main, c) == 0)
      c->saver_started = 1;
    else
      rc = ECS_ENOMEM;
  }
  if (rc == ECS_OK) {
    if (pthread_create(&c->loader, NULL, loader_main, c) == 0)
      c->loader_started = 1;
    else
      rc = ECS_ENOMEM;
  }
  if (rc != ECS_OK) {
    if (err[0] == '\0')
      snprintf(err, errlen, "%s", ecs_strerror(rc));
    conn_stop(c);
    conn_free(c);
    return rc;
  }
  snprintf(c->describe, sizeof c->describe, "%s/%s", c->ops->name, c->ops->path(c->h_load));
  *out = c;
  return ECS_OK;
}

int ecs_ec_open_json(const char *json, ecs_ec_conn_t **out, char *err, size_t errlen) {
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  if (out)
    *out = NULL;
  int rc = ecs_ec_config_parse_json(&cfg, json, 0, err, errlen);
  if (rc != ECS_OK)
    return rc;
  return ecs_ec_open(&cfg, out, err, errlen);
}

void ecs_ec_close(ecs_ec_conn_t *c) {
  if (c == NULL)
    return;
  /* let queued saves finish, within the configured deadline */
  pthread_mutex_lock(&c->mu);
  uint64_t deadline = deadline_after(c, -1);
  while (c->queued.count + c->inflight > 0)
    if (cv_wait_until(&c->cv_done, &c->mu, deadline))
      break;
  if (c->queued.count + c->inflight > 0)
    ECS_LOG_W("ec_connector: close: %zu saves still pending after %d ms, dropped",
              c->queued.count + c->inflight, c->cfg.timeout_ms);
  pthread_mutex_unlock(&c->mu);
  conn_stop(c);
  pthread_mutex_lock(&c->lmu);
  c->closed = 1;
  size_t live = c->live_loads;
  pthread_mutex_unlock(&c->lmu);
  if (live == 0)
    conn_free(c);
  else /* freed by the last ecs_ec_load_release() */
    ECS_LOG_E("ec_connector: close with %zu load handles not released", live);
}

const char *ecs_ec_describe(const ecs_ec_conn_t *c) {
  return c ? c->describe : "";
}

/* ------------------------------------------------------------------ */
/* producer                                                             */

/* Reserves a slot and staging bytes for nbytes (mu held); ECS_OK with *slot
 * and *off, or ECS_EBUSY at the deadline. */
static int save_reserve(ecs_ec_conn_t *c, uint64_t nbytes, int *slot, uint64_t *off) {
  uint64_t deadline = ecs_now_ms() + (uint64_t)c->cfg.save_timeout_ms;
  for (;;) {
    if (c->save_stop)
      return ECS_ECANCELED;
    if (c->free_slots.count > 0) {
      int rc = ECS_OK;
      *off = NO_OFF;
      if (nbytes > 0)
        rc = ecs_pool_alloc(c->staging, (size_t)nbytes, off);
      if (rc == ECS_OK) {
        *slot = list_pop(c->slots, &c->free_slots);
        return ECS_OK;
      }
      if (rc != ECS_ENOSPC)
        return rc;
    }
    if (cv_wait_until(&c->cv_room, &c->mu, deadline))
      if (c->free_slots.count == 0 || (nbytes > 0 && !ecs_pool_can_fit(c->staging, (size_t)nbytes)))
        return ECS_EBUSY;
  }
}

int ecs_ec_save(ecs_ec_conn_t *c, const char *mm_hash, const ecs_tensor_t *t) {
  if (c == NULL || t == NULL)
    return ECS_EINVAL;
  size_t klen = key_len_of(mm_hash);
  if (klen == 0)
    return ECS_EKEY;
  int rc = ecs__ec_tensor_check(t);
  if (rc != ECS_OK)
    return rc;
  if (t->nbytes > c->cfg.staging_bytes)
    return ECS_ETOOBIG;
  pthread_mutex_lock(&c->mu);
  if (c->staging == NULL) {
    ecs_pool_opts_t po;
    ecs_pool_opts_init(&po);
    po.size = (size_t)c->cfg.staging_bytes;
    po.name = "ecs-ec-staging";
    rc = ecs_pool_create(&po, &c->staging);
    if (rc != ECS_OK) {
      pthread_mutex_unlock(&c->mu);
      ECS_LOG_E("ec_connector: staging pool of %llu bytes: %s", (unsigned long long)c->cfg.staging_bytes,
                ecs_strerror(rc));
      return rc;
    }
  }
  int slot;
  uint64_t off;
  rc = save_reserve(c, t->nbytes, &slot, &off);
  pthread_mutex_unlock(&c->mu);
  if (rc != ECS_OK)
    return rc;

  /* the copy runs unlocked: the slot is ours alone until queued */
  ecs__save_slot_t *s = &c->slots[slot];
  memcpy(s->key, mm_hash, klen);
  s->key[klen] = '\0';
  s->key_len = klen;
  s->off = off;
  s->nbytes = t->nbytes;
  s->desc = t->desc;
  s->status = ECS_EBUSY;
  if (off != NO_OFF)
    memcpy(ecs_pool_ptr(c->staging, off), t->data, (size_t)t->nbytes);

  pthread_mutex_lock(&c->mu);
  list_push(c->slots, &c->queued, slot);
  c->saves++;
  c->save_bytes += t->nbytes;
  pthread_cond_signal(&c->cv_work);
  pthread_mutex_unlock(&c->mu);
  return ECS_OK;
}

int ecs_ec_wait_for_save(ecs_ec_conn_t *c, int timeout_ms, ecs_ec_save_result_t *failed, size_t cap,
                         size_t *nfailed) {
  if (nfailed)
    *nfailed = 0;
  if (c == NULL)
    return ECS_EINVAL;
  if (failed == NULL)
    cap = 0;
  pthread_mutex_lock(&c->mu);
  uint64_t deadline = deadline_after(c, timeout_ms);
  while (c->queued.count + c->inflight > 0)
    if (cv_wait_until(&c->cv_done, &c->mu, deadline))
      break;
  size_t pending = c->queued.count + c->inflight, w = 0;
  while (w < cap && c->failed.count > 0) {
    int i = list_pop(c->slots, &c->failed);
    memcpy(failed[w].mm_hash, c->slots[i].key, c->slots[i].key_len + 1);
    failed[w].status = c->slots[i].status;
    list_push(c->slots, &c->free_slots, i);
    w++;
  }
  int left = c->failed.count > 0;
  if (w)
    pthread_cond_broadcast(&c->cv_room);
  pthread_mutex_unlock(&c->mu);
  if (nfailed)
    *nfailed = w;
  if (pending)
    return ECS_ETIMEDOUT;
  return (w || left) ? ECS_EIO : ECS_OK;
}

size_t ecs_ec_save_pending(ecs_ec_conn_t *c) {
  if (c == NULL)
    return 0;
  pthread_mutex_lock(&c->mu);
  size_t n = c->queued.count + c->inflight;
  pthread_mutex_unlock(&c->mu);
  return n;
}

/* ------------------------------------------------------------------ */
/* scheduler                                                            */

int ecs_ec_has(ecs_ec_conn_t *c, const char *const *mm_hashes, size_t n, int *out) {
  if (out)
    memset(out, 0, n * sizeof *out);
  if (c == NULL || (n > 0 && (mm_hashes == NULL || out == NULL)))
    return ECS_EINVAL;
  if (n == 0)
    return ECS_OK;
  ecs_key_t *keys = calloc(n, sizeof *keys);
  size_t *map = calloc(n, sizeof *map);
  int *got = calloc(n, sizeof *got);
  int rc = ECS_ENOMEM;
  if (keys && map && got) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
      size_t kl = key_len_of(mm_hashes[i]);
      if (kl == 0)
        continue; /* an invalid key is not stored: 0 */
      keys[m].data = mm_hashes[i];
      keys[m].len = kl;
      map[m++] = i;
    }
    pthread_mutex_lock(&c->has_mu);
    rc = m ? c->ops->exists(c->h_meta, keys, m, got) : ECS_OK;
    c->has_calls++;
    if (rc != ECS_OK) {
      c->has_errors++;
      ECS_LOG_W("ec_connector: has(%zu): %s: %s", n, ecs_strerror(rc), c->ops->errmsg(c->h_meta));
    }
    pthread_mutex_unlock(&c->has_mu);
    if (rc == ECS_OK)
      for (size_t q = 0; q < m; q++)
        out[map[q]] = got[q] == 1;
  }
  free(keys);
  free(map);
  free(got);
  return rc;
}

/* ------------------------------------------------------------------ */
/* consumer                                                             */

int ecs_ec_start_load(ecs_ec_conn_t *c, const ecs_ec_load_item_t *items, size_t n, ecs_ec_load_t **out) {
  if (out)
    *out = NULL;
  if (c == NULL || items == NULL || n == 0 || out == NULL)
    return ECS_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (items[i].dst == NULL && items[i].capacity != 0)
      return ECS_EINVAL;
  ecs_ec_load_t *ld = calloc(1, sizeof *ld + n * sizeof ld->items[0]);
  if (ld == NULL)
    return ECS_ENOMEM;
  ld->c = c;
  ld->n = n;
  size_t invalid = 0;
  for (size_t i = 0; i < n; i++) {
    ecs__load_item_t *it = &ld->items[i];
    it->key_len = key_len_of(items[i].mm_hash);
    if (it->key_len)
      memcpy(it->key, items[i].mm_hash, it->key_len);
    it->dst = items[i].dst;
    it->capacity = items[i].capacity;
    it->expected = items[i].expected_nbytes;
    it->res.status = it->key_len ? ECS_EBUSY : ECS_EKEY;
    invalid += it->key_len == 0;
  }
  pthread_mutex_lock(&c->lmu);
  if (c->load_stop) {
    pthread_mutex_unlock(&c->lmu);
    free(ld);
    return ECS_ECANCELED;
  }
  c->live_loads++;
  c->loads += n;
  c->load_misses += invalid;
  ld->ndone = invalid;
  if (invalid < n) {
    ld->queued = 1;
    if (c->lq_tail)
      c->lq_tail->qnext = ld;
    else
      c->lq_head = ld;
    c->lq_tail = ld;
    pthread_cond_signal(&c->lcv_work);
  } else {
    ld->next = n;
  }
  pthread_mutex_unlock(&c->lmu);
  *out = ld;
  return ECS_OK;
}

int ecs_ec_wait_for_load(ecs_ec_load_t *ld, int timeout_ms, ecs_ec_load_result_t *results) {
  if (ld == NULL)
    return ECS_EINVAL;
  ecs_ec_conn_t *c = ld->c;
  pthread_mutex_lock(&c->lmu);
  uint64_t deadline = deadline_after(c, timeout_ms);
  while (ld->ndone < ld->n)
    if (cv_wait_until(&c->lcv_done, &c->lmu, deadline))
      break;
  if (results)
    for (size_t i = 0; i < ld->n; i++)
      results[i] = ld->items[i].res;
  int done = ld->ndone >= ld->n;
  pthread_mutex_unlock(&c->lmu);
  return done ? ECS_OK : ECS_ETIMEDOUT;
}

int ecs_ec_poll_load(ecs_ec_load_t *ld, ecs_ec_load_result_t *results) {
  int rc = ecs_ec_wait_for_load(ld, 0, results);
  return rc == ECS_ETIMEDOUT ? ECS_EBUSY : rc;
}

size_t ecs_ec_load_size(const ecs_ec_load_t *ld) {
  return ld ? ld->n : 0;
}

void ecs_ec_load_release(ecs_ec_load_t *ld) {
  if (ld == NULL)
    return;
  ecs_ec_conn_t *c = ld->c;
  pthread_mutex_lock(&c->lmu);
  if (ld->queued) {
    ecs_ec_load_t **pp = &c->lq_head, *prev = NULL;
    while (*pp && *pp != ld) {
      prev = *pp;
      pp = &(*pp)->qnext;
    }
    if (*pp) {
      *pp = ld->qnext;
      if (c->lq_tail == ld)
        c->lq_tail = prev;
    }
    ld->queued = 0;
  }
  /* the batch in flight writes into our buffers: wait for it (the
   * backend bounds it by timeout_ms) */
  while (ld->inflight > 0)
    pthread_cond_wait(&c->lcv_done, &c->lmu);
  c->live_loads--;
  int free_conn = c->closed && c->live_loads == 0;
  pthread_mutex_unlock(&c->lmu);
  free(ld);
  if (free_conn)
    conn_free(c);
}

/* ------------------------------------------------------------------ */
/* counters                                                             */

void ecs_ec_stats(ecs_ec_conn_t *c, ecs_ec_stats_t *st) {
  memset(st, 0, sizeof *st);
  if (c == NULL)
    return;
  pthread_mutex_lock(&c->mu);
  st->saves = c->saves;
  st->saves_stored = c->saves_stored;
  st->saves_failed = c->saves_failed;
  st->save_bytes = c->save_bytes;
  if (c->staging) {
    ecs_pool_stats_t ps;
    ecs_pool_stats(c->staging, &ps);
    st->staging_in_use = ps.bytes_in_use;
  }
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_lock(&c->has_mu);
  st->has_calls = c->has_calls;
  st->has_errors = c->has_errors;
  pthread_mutex_unlock(&c->has_mu);
  pthread_mutex_lock(&c->lmu);
  st->loads = c->loads;
  st->load_hits = c->load_hits;
  st->load_misses = c->load_misses;
  st->load_bytes = c->load_bytes;
  pthread_mutex_unlock(&c->lmu);
}
