/*
 * The server's request handlers, one per opcode, found through one static
 * const table.  A handler runs once the header and records of a request
 * are in (PUT's payload is read after it, by server_conn.c), parses every
 * record with store/core/proto.h before using a length from it, and ends by
 * building the reply (ecs__reply_finish / ecs__reply_error).
 */
#include "store/server/server_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/server/acl.h"
#include "store/core/log.h"
#include "store/core/net.h"

/* ------------------------------------------------------------------ */
/* request handlers                                                    */

/* A request's records must fill its meta section exactly: bytes left over
 * are a protocol error, answered (and the connection closed) here.
 * Returns 1 when the reply built so far may be sent. */
static int records_consumed(ecs_server_t *s, conn_t *c, const ecs_rbuf_t *r) {
  if (r->pos == r->len)
    return 1;
  ecs__reply_error(s, c, ECS_EPROTO, 1);
  return 0;
}

/* The figures STAT answers, also what /metrics exposes. */
static ecs_stat_reply_t stat_snapshot(ecs_server_t *s) {
  ecs_pool_stats_t ps;
  ecs_objstore_stats_t os;
  ecs_pool_stats(s->pool, &ps);
  ecs_objstore_stats(s->os, &os);
  ecs_stat_reply_t st = {
      .pool_size = ps.size,
      .bytes_in_use = ps.bytes_in_use,
      .bytes_free = ps.bytes_free,
      .largest_free = ps.largest_free,
      .bytes_requested = ps.bytes_requested,
      .objects = os.objects,
      .puts = s->puts,
      .gets = s->gets,
      .hits = s->hits,
      .misses = s->misses,
      .evictions = os.evictions,
      .removes = os.removes,
      .connections = s->nconns,
      .epoch = s->epoch,
      .redis_ok = s->meta ? (uint64_t)ecs_meta_is_up(s->meta) : 0,
      .pool_locked = (uint64_t)ps.locked,
      .pool_cuda_registered = (uint64_t)ps.cuda_registered,
  };
  return st;
}

static void handle_stat(ecs_server_t *s, conn_t *c) {
  ecs_stat_reply_t st = stat_snapshot(s);
  ecs__reply_begin(c);
  ecs_proto_stat_write(&c->out, &st);
  ecs__reply_finish(s, c, ECS_OK, 0, 0);
}

/* A re-put of a committed key whose stored bytes no longer match their
 * checksum (memory corruption) replaces the object instead of reporting an
 * idempotent success: the retry heals the store.  This costs one hash of
 * the stored object per duplicate put, which only retries pay. */
static ecs_obj_t *drop_if_corrupt(ecs_server_t *s, ecs_obj_t *o) {
  if (ecs_checksum(ecs_objstore_data(s->os, o), (size_t)o->nbytes) == o->checksum)
    return o;
  ECS_LOG_W("stored object failed its checksum; replacing it with the new put");
  ecs_objstore_remove(s->os, o->key, o->key_len);
  return NULL;
}

int ecs__obj_same(const ecs_obj_t *o, uint64_t nbytes, uint64_t checksum, int codec, uint64_t raw_nbytes,
                  const ecs_tensor_desc_t *desc) {
  if (o->nbytes != nbytes || o->checksum != checksum || o->codec != codec || o->raw_nbytes != raw_nbytes ||
      o->desc.dtype != desc->dtype || o->desc.ndim != desc->ndim)
    return 0;
  for (unsigned d = 0; d < o->desc.ndim; d++)
    if (o->desc.shape[d] != desc->shape[d])
      return 0;
  return 1;
}

static int same_content(const ecs_obj_t *o, const ecs_put_item_t *it) {
  return ecs__obj_same(o, it->nbytes, it->checksum, it->codec, it->raw_nbytes, &it->desc);
}

/* PUT, step 1: parse records, reserve blocks, then go read the payload. */
/* Room for n items in c->slots (PUT and COMMIT use them, one request at a
 * time); 0 when out of memory. */
static int slots_reserve(conn_t *c, uint32_t n) {
  if (n <= c->slots_cap)
    return 1;
  put_slot_t *ns = realloc(c->slots, (size_t)n * sizeof *ns);
  if (!ns)
    return 0;
  c->slots = ns;
  c->slots_cap = n;
  return 1;
}

/* What a PUT or RESERVE item may do given the connection's rights, before
 * the key is looked at.  An upsert needs the overwrite right (else it
 * could replace another tenant's object without the remove right), and is
 * refused without it whether the key exists or not.  ECS_OK or ECS_EPERM. */
static int upsert_allowed(const conn_t *c, const ecs_put_item_t *it) {
  return (it->flags & ECS_PUT_F_UPSERT) && !(c->rights & ECS__RIGHT_OVERWRITE) ? ECS_EPERM : ECS_OK;
}

/* The objstore's reserve flags for a PUT or RESERVE item. */
static unsigned reserve_flags(const ecs_put_item_t *it) {
  return ((it->flags & ECS_PUT_F_UPSERT) ? ECS_RESERVE_REPLACE : 0u) |
         ((it->flags & ECS_PUT_F_HARD_PIN) ? ECS_RESERVE_HARD_PIN : 0u);
}

/* When an item's soft pin ends (wall-clock ms; 0: none): its own TTL
 * (PIN_TTL) or the server's; none when the server has pins off
 * (--soft-pin-ttl-ms 0) or the item is hard-pinned (never evicted). */
static uint64_t soft_pin_until(const ecs_server_t *s, const ecs_put_item_t *it, uint64_t now) {
  if (!(it->flags & ECS_PUT_F_SOFT_PIN) || (it->flags & ECS_PUT_F_HARD_PIN) || !s->o.soft_pin_ttl_ms)
    return 0;
  return now +
         ((it->flags & ECS_PUT_F_PIN_TTL) ? ecs_proto_pin_ttl_decode(it->pin_ttl) : s->o.soft_pin_ttl_ms);
}

/* The answer to a put of a key already stored: same content, ECS_OK;
 * other content, ECS_ECONFLICT, except to a token without the read right,
 * which gets ECS_OK either way (the stored object stays): its answers must
 * not tell whether a key exists or what it holds. */
static int stored_answer(const conn_t *c, const ecs_obj_t *o, const ecs_put_item_t *it) {
  if (!(c->rights & ECS__RIGHT_READ))
    return ECS_OK;
  return same_content(o, it) ? ECS_OK : ECS_ECONFLICT;
}

static void handle_put_begin(ecs_server_t *s, conn_t *c) {
  uint32_t n = c->hdr.count;
  if (!slots_reserve(c, n)) {
    ecs__reply_error(s, c, ECS_ENOMEM, 1);
    return;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    memset(sl, 0, sizeof *sl);
    int rc = ecs_proto_put_item_read(&r, &sl->item);
    if (rc == ECS_EPROTO || r.err) {
      /* A record we cannot parse leaves the stream's framing in doubt. */
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    /* A bad key or dtype fails that item alone; its payload is discarded.
     * So does every item of a PUT the token has no right to (c->refuse). */
    sl->status = c->refuse ? c->refuse : rc;
    if (sl->status == ECS_OK)
      sl->status = upsert_allowed(c, &sl->item);
    if (sl->item.nbytes > UINT64_MAX - total) {
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    total += sl->item.nbytes;
  }
  if (r.pos != r.len || total != c->hdr.data_len) {
    ecs__reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  c->nslots = n;
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    if (sl->status != ECS_OK)
      continue;
    int upsert = (sl->item.flags & ECS_PUT_F_UPSERT) != 0;
    ecs_obj_t *o = ecs_objstore_find(s->os, sl->item.key, sl->item.key_len);
    if (o && o->state == ECS_OBJ_COMMITTED && same_content(o, &sl->item))
      o = drop_if_corrupt(s, o);
    /* An upsert of other content goes on to replace it; of the same content
     * it is as idempotent as a put. */
    if (o && o->state == ECS_OBJ_COMMITTED && (!upsert || same_content(o, &sl->item))) {
      sl->status = stored_answer(c, o, &sl->item);
      continue;
    }
    int rc = ecs_objstore_reserve_as(s->os, sl->item.key, sl->item.key_len, sl->item.nbytes,
                                     reserve_flags(&sl->item), c->tenant ? c->tenant->id : 0, &sl->obj);
    if (rc == ECS_EBUSY)
      sl->status = SLOT_DUP_PENDING; /* settled after the batch commits */
    else
      sl->status = rc;
    if (rc != ECS_OK)
      sl->obj = NULL;
  }
  ecs__server_meta_flush(s); /* deletions of anything evicted to make room */
  c->data_item = 0;
  c->data_off = 0;
  c->st = C_DATA;
}

/* PUT, step 3: verify checksums, commit, publish, reply. */
void ecs__server_put_end(ecs_server_t *s, conn_t *c) {
  /* read_data hashed the payloads as they landed; what it did not (empty
   * items, no memory for a running state) is hashed here, also without the
   * server lock (the objects are PENDING and only this connection holds
   * them), and before the wait below exists, which Redis acknowledgements
   * may touch. */
  int unsummed = 0;
  for (size_t i = 0; i < c->nslots; i++)
    unsummed |= c->slots[i].obj && !c->slots[i].summed;
  if (unsummed) {
    ecs__unlock(s);
    for (size_t i = 0; i < c->nslots; i++)
      if (c->slots[i].obj && !c->slots[i].summed)
        c->slots[i].sum =
            ecs_checksum(ecs_objstore_data(s->os, c->slots[i].obj), (size_t)c->slots[i].obj->nbytes);
    ecs__lock(s);
  }
  uint64_t now = ecs_wall_ms();
  pub_wait_t *w = ecs__pub_begin(s, c, (uint32_t)c->nslots);
  for (size_t i = 0; i < c->nslots; i++) {
    put_slot_t *sl = &c->slots[i];
    if (!sl->obj)
      continue;
    ecs_obj_t *o = sl->obj;
    sl->obj = NULL;
    uint64_t sum = sl->sum;
    if (sum != sl->item.checksum) {
      ecs_objstore_abort(s->os, o);
      sl->status = ECS_ECHECKSUM;
      continue;
    }
    o->codec = sl->item.codec;
    o->raw_nbytes = sl->item.raw_nbytes;
    o->checksum = sum;
    o->desc = sl->item.desc;
    o->commit_ms = now;
    o->keep_until_ms = soft_pin_until(s, &sl->item, now);
    ecs_objstore_commit(s->os, o);
    s->puts++;
    sl->status = ecs__pub_record(s, w, (uint32_t)i, o);
  }
  for (size_t i = 0; i < c->nslots; i++) {
    put_slot_t *sl = &c->slots[i];
    if (sl->status != SLOT_DUP_PENDING)
      continue;
    ecs_obj_t *o = ecs_objstore_find(s->os, sl->item.key, sl->item.key_len);
    if (!o || o->state != ECS_OBJ_COMMITTED)
      sl->status = ECS_EBUSY;
    else if (sl->item.flags & ECS_PUT_F_UPSERT) /* lost to a concurrent writer: busy, not a conflict */
      sl->status = same_content(o, &sl->item) ? ECS_OK : ECS_EBUSY;
    else
      sl->status = stored_answer(c, o, &sl->item);
  }
  /* Records reach Redis before the reply, so a client that saw OK can find
   * the object through Redis at once (exists_batch); the connection parks
   * meanwhile, and nobody else waits. */
  size_t n = c->nslots;
  c->nslots = 0;
  for (size_t i = 0; w != NULL && i < n; i++)
    w->status[i] = c->slots[i].status;
  if (ecs__pub_end(s, c, w))
    return;
  ecs__reply_begin(c);
  for (size_t i = 0; i < n; i++)
    ecs_proto_status_write(&c->out, c->slots[i].status);
  ecs__reply_finish(s, c, ECS_OK, (uint32_t)n, 0);
}

static void handle_get(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  ecs__reply_begin(c);
  uint64_t data_len = 0;
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    ecs_get_item_t it;
    int rc = ecs_proto_get_item_read(&r, &it);
    if (rc == ECS_EPROTO || r.err) {
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_get_reply_t rep;
    memset(&rep, 0, sizeof rep);
    s->gets++;
    ecs_obj_t *o = rc == ECS_OK ? ecs_objstore_acquire(s->os, it.key, it.key_len) : NULL;
    if (rc != ECS_OK) {
      rep.status = rc; /* a bad key fails that item alone */
    } else if (!o) {
      s->misses++;
      rep.status = ECS_ENOTFOUND;
    } else {
      s->hits++;
      rep.codec = o->codec;
      rep.desc = o->desc;
      rep.nbytes = o->nbytes;
      rep.raw_nbytes = o->raw_nbytes;
      rep.checksum = o->checksum;
      if (o->nbytes > it.capacity) {
        rep.status = ECS_EBUFSMALL;
        ecs_objstore_release(s->os, o);
      } else if (ecs__conn_hold(c, o) != ECS_OK) {
        ecs_objstore_release(s->os, o);
        rep.status = ECS_ENOMEM;
      } else {
        rep.status = ECS_OK;
        if (o->nbytes && ecs__conn_wiov_add(c, ecs_objstore_data(s->os, o), (size_t)o->nbytes) != ECS_OK) {
          ecs__reply_error(s, c, ECS_ENOMEM, 0);
          return;
        }
        data_len += o->nbytes;
      }
    }
    ecs_proto_get_reply_write(&c->out, &rep);
  }
  if (!records_consumed(s, c, &r))
    return;
  ecs__reply_finish(s, c, ECS_OK, c->hdr.count, data_len);
}

/* EXISTS and REMOVE: key items in, one status per item out. */
static void handle_keys(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  ecs__reply_begin(c);
  pub_wait_t *w = c->hdr.opcode == ECS_OP_REMOVE ? ecs__pub_begin(s, c, c->hdr.count) : NULL;
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    const uint8_t *key;
    uint16_t klen;
    int rc = ecs_proto_key_read(&r, &key, &klen);
    if (rc == ECS_EPROTO || r.err) {
      ecs__pub_abandon(w);
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    int st;
    if (rc != ECS_OK) {
      st = rc; /* a bad key fails that item alone */
      if (w != NULL)
        w->status[i] = st;
    } else if (c->hdr.opcode == ECS_OP_REMOVE) {
      st = ecs__pub_remove(s, w, i, key, klen); /* answered once the delete is acknowledged */
    } else {
      ecs_obj_t *o = ecs_objstore_find(s->os, key, klen);
      st = o && o->state == ECS_OBJ_COMMITTED ? ECS_OK : ECS_ENOTFOUND;
    }
    ecs_proto_status_write(&c->out, st);
  }
  if (!records_consumed(s, c, &r)) {
    ecs__pub_abandon(w);
    return;
  }
  if (ecs__pub_end(s, c, w))
    return;
  ecs__reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* LEASE: pin committed objects and say where their bytes are. */
static void handle_lease(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  ecs__reply_begin(c);
  uint64_t dl = ecs__pin_deadline(s);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    const uint8_t *key;
    uint16_t klen;
    int rc = ecs_proto_key_read(&r, &key, &klen);
    if (rc == ECS_EPROTO || r.err) {
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_lease_reply_t lr;
    memset(&lr, 0, sizeof lr);
    s->gets++;
    ecs_obj_t *o = rc == ECS_OK ? ecs_objstore_acquire(s->os, key, klen) : NULL;
    if (rc != ECS_OK) {
      lr.status = rc;
    } else if (!o) {
      s->misses++;
      lr.status = ECS_ENOTFOUND;
    } else if ((lr.status = ecs__pin_room(s, c, o->nbytes)) != ECS_OK) {
      ecs_objstore_release(s->os, o); /* this connection's (EBUSY) or token's (EQUOTA) pin quota is spent */
    } else {
      s->hits++;
      lr.lease_id = ecs__pin_add(c, o, PIN_LEASE, dl);
      int wrc = lr.lease_id ? ecs__pin_window(s, c, lr.lease_id, PIN_LEASE, &lr.rkey) : ECS_ENOMEM;
      if (wrc != ECS_OK) {
        if (lr.lease_id)
          (void)ecs__pin_take(c, lr.lease_id, PIN_LEASE);
        ecs_objstore_release(s->os, o);
        lr.status = wrc;
        lr.lease_id = 0;
      } else {
        lr.status = ECS_OK;
        lr.codec = o->codec;
        lr.desc = o->desc;
        lr.off = o->off;
        lr.nbytes = o->nbytes;
        lr.raw_nbytes = o->raw_nbytes;
        lr.checksum = o->checksum;
      }
    }
    ecs_proto_lease_reply_write(&c->out, &lr);
  }
  if (!records_consumed(s, c, &r))
    return;
  ecs__reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* RELEASE: unpin leases; with NOREPLY the client reads nothing back. */
static void handle_release(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  int noreply = (c->hdr.flags & ECS_FLAG_NOREPLY) != 0;
  ecs__reply_begin(c);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    uint64_t id;
    if (ecs_proto_u64_read(&r, &id) != ECS_OK) {
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_obj_t *o = ecs__pin_take(c, id, PIN_LEASE);
    if (o)
      ecs_objstore_release(s->os, o);
    ecs_proto_status_write(&c->out, o ? ECS_OK : ECS_ENOTFOUND);
  }
  if (!records_consumed(s, c, &r))
    return;
  if (noreply) {
    c->st = C_HDR; /* nothing to send; read the next request */
    return;
  }
  ecs__reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* RESERVE: allocate blocks a local or RDMA client writes in place. */
static void handle_reserve(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  ecs__reply_begin(c);
  uint64_t dl = ecs__pin_deadline(s);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    ecs_put_item_t it;
    int rc = ecs_proto_put_item_read(&r, &it);
    if (rc == ECS_EPROTO || r.err) {
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_reserve_reply_t rr = {.status = rc == ECS_OK ? upsert_allowed(c, &it) : rc};
    if (rr.status == ECS_OK) {
      int upsert = (it.flags & ECS_PUT_F_UPSERT) != 0;
      ecs_obj_t *o = ecs_objstore_find(s->os, it.key, it.key_len);
      if (o && o->state == ECS_OBJ_COMMITTED && same_content(o, &it))
        o = drop_if_corrupt(s, o);
      if (o && o->state == ECS_OBJ_COMMITTED && (!upsert || same_content(o, &it))) {
        /* already stored: same content is fine (resv_id 0), else a conflict */
        rr.status = stored_answer(c, o, &it);
      } else if (it.nbytes <= ecs_pool_size(s->pool) && ecs__pin_room(s, c, it.nbytes) != ECS_OK) {
        /* (larger than the pool: the objstore says ETOOBIG, which is the truth) */
        rr.status = ecs__pin_room(s, c, it.nbytes); /* this connection's or token's pin quota is spent */
      } else {
        rr.status = ecs_objstore_reserve_as(s->os, it.key, it.key_len, it.nbytes, reserve_flags(&it),
                                            c->tenant ? c->tenant->id : 0, &o);
        if (rr.status == ECS_OK) {
          o->codec = it.codec;
          o->raw_nbytes = it.raw_nbytes;
          o->desc = it.desc;
          /* COMMIT carries no flags: a soft pin is set here, from the reserve */
          o->keep_until_ms = soft_pin_until(s, &it, ecs_wall_ms());
          rr.off = o->off;
          rr.resv_id = ecs__pin_add(c, o, PIN_RESV, dl);
          int wrc = rr.resv_id ? ecs__pin_window(s, c, rr.resv_id, PIN_RESV, &rr.rkey) : ECS_ENOMEM;
          if (wrc != ECS_OK) {
            if (rr.resv_id)
              (void)ecs__pin_take(c, rr.resv_id, PIN_RESV);
            ecs_objstore_abort(s->os, o);
            rr.status = wrc;
            rr.off = 0;
            rr.resv_id = 0;
          }
        }
      }
    }
    ecs_proto_reserve_reply_write(&c->out, &rr);
  }
  if (!records_consumed(s, c, &r))
    return;
  ecs__server_meta_flush(s); /* deletions of anything evicted to make room */
  ecs__reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* COMMIT: the bytes are in place; verify, index and publish them.
 * Three passes: under the server lock, the request is read whole and each
 * reservation taken out of the connection's table (from then on the
 * object is PENDING and only this connection holds it: eviction never
 * sees it and no lease timer can abort it); without the lock, the bytes
 * are hashed (the payload is read outside any lock, as a PUT's is); under
 * the lock again, each object is committed or aborted.  A malformed
 * request commits nothing (it used to commit the items before the bad
 * one); the connection is then dropped, which aborts its reservations. */
static void handle_commit(ecs_server_t *s, conn_t *c) {
  uint32_t n = c->hdr.count;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  if (!slots_reserve(c, n)) {
    ecs__reply_error(s, c, ECS_ENOMEM, 1);
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    ecs_commit_item_t ci;
    if (ecs_proto_commit_item_read(&r, &ci) != ECS_OK) {
      ecs__reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    put_slot_t *sl = &c->slots[i];
    memset(sl, 0, sizeof *sl);
    sl->item.checksum = ci.checksum;
    sl->resv_id = ci.resv_id;
    sl->abort = ci.abort != 0;
  }
  if (!records_consumed(s, c, &r))
    return;
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    sl->obj = ecs__pin_take(c, sl->resv_id, PIN_RESV);
    if (!sl->obj)
      sl->status = ECS_ENOTFOUND; /* unknown, expired or already committed */
  }
  ecs__unlock(s);
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    if (sl->obj && !sl->abort)
      sl->sum = ecs_checksum(ecs_objstore_data(s->os, sl->obj), (size_t)sl->obj->nbytes);
  }
  ecs__lock(s);
  ecs__reply_begin(c);
  uint64_t now = ecs_wall_ms();
  pub_wait_t *w = ecs__pub_begin(s, c, n);
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    ecs_obj_t *o = sl->obj;
    sl->obj = NULL;
    int st = sl->status;
    if (!o) {
      /* nothing taken: st says why */
    } else if (sl->abort) {
      ecs_objstore_abort(s->os, o);
    } else if (sl->sum != sl->item.checksum) {
      ecs_objstore_abort(s->os, o);
      st = ECS_ECHECKSUM;
    } else {
      o->checksum = sl->sum;
      o->commit_ms = now;
      ecs_objstore_commit(s->os, o);
      s->puts++;
      st = ecs__pub_record(s, w, i, o);
    }
    if (w != NULL)
      w->status[i] = st;
    ecs_proto_status_write(&c->out, st);
  }
  if (ecs__pub_end(s, c, w)) /* answered once Redis acknowledged the records */
    return;
  ecs__reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* ATTACH (Unix socket only): pass the pool's memfd.  A client that only
 * reads gets a read-only descriptor, reopened through /proc; the memfd is
 * 0600 and sealed (mempool/region.c), so another uid can neither reopen
 * it writable nor truncate it.  A writable one goes only to the server's
 * own uid, root and --shm-write-uid; a read-only one also to
 * --shm-allow-uid.  Others are refused and use this socket for copies
 * (their client falls back by itself). */
static void handle_attach(ecs_server_t *s, conn_t *c) {
  if (!c->local) {
    ecs__reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  uint32_t flags = ecs_rbuf_u32(&r);
  if (r.err) {
    ecs__reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  int want_write = (flags & ECS_ATTACH_WRITE) != 0;
  if (!(c->shm_rights & SHM_MAP) || (want_write && !(c->shm_rights & SHM_WRITE))) {
    ECS_LOG_I("conn %llu: uid %u may not map the pool%s (%s); it copies over the socket",
              (unsigned long long)c->id, c->peer_uid, want_write ? " writable" : "",
              want_write && (c->shm_rights & SHM_MAP) ? "not in --shm-write-uid" : "not in --shm-allow-uid");
    ecs__reply_error(s, c, ECS_EAUTH, 0);
    return;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ecs_pool_fd(s->pool));
  /* without the write right the pool is handed out read-only (the client
   * sees the flag cleared and puts over the socket, which are refused) */
  want_write = want_write && (c->rights & ECS__RIGHT_WRITE);
  int fd = open(path, (want_write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    ECS_LOG_W("conn %llu: cannot reopen the pool fd: %s", (unsigned long long)c->id, strerror(errno));
    ecs__reply_error(s, c, ECS_EIO, 0);
    return;
  }
  ecs_attach_reply_t ar = {.pool_size = ecs_pool_size(s->pool), .flags = want_write ? ECS_ATTACH_WRITE : 0};
  ecs__reply_begin(c);
  ecs_proto_attach_reply_write(&c->out, &ar);
  ecs__reply_finish(s, c, ECS_OK, 0, 0);
  c->send_fd = fd;
}

/* RDMA_CONNECT: the client's blob in, ours out.  The endpoint (one RC QP
 * per connection) is made on first use and rebuilt on every later connect,
 * which is how a client recovers from an error completion.  It is
 * isolated (its own PD) and advertises nothing: the client reaches only
 * the windows of its own leases and reservations. */
static void handle_rdma_connect(ecs_server_t *s, conn_t *c) {
  if (!s->rdma) {
    ecs__reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  if (c->hdr.meta_len != ECS_RDMA_BLOB_SIZE) {
    ecs__reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  int rc = c->ep ? ecs_rdma_ep_reset(c->ep) : ecs_rdma_ep_create_isolated(s->rdma, &c->ep);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_connect(c->ep, c->meta, ECS_RDMA_BLOB_SIZE);
  uint8_t blob[ECS_RDMA_BLOB_SIZE];
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_local_blob(c->ep, blob);
  if (rc != ECS_OK) {
    ECS_LOG_W("conn %llu: rdma connect failed: %s", (unsigned long long)c->id, ecs_strerror(rc));
    ecs__reply_error(s, c, rc, 0);
    return;
  }
  ecs__reply_begin(c);
  ecs_wbuf_put(&c->out, blob, sizeof blob);
  ecs__reply_finish(s, c, ECS_OK, 0, 0);
}

/* Test-only hooks, refused unless --enable-debug-ops. */
static void handle_debug(ecs_server_t *s, conn_t *c) {
  if (!s->o.enable_debug_ops) {
    ecs__reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  uint32_t sub = ecs_rbuf_u32(&r);
  const uint8_t *key;
  uint16_t klen;
  if (r.err || sub != DEBUG_CORRUPT || ecs_proto_key_read(&r, &key, &klen) != ECS_OK) {
    ecs__reply_error(s, c, ECS_EINVAL, 0);
    return;
  }
  ecs_obj_t *o = ecs_objstore_find(s->os, key, klen);
  int st = ECS_ENOTFOUND;
  if (o && o->state == ECS_OBJ_COMMITTED && o->nbytes > 0) {
    uint8_t *p = ecs_objstore_data(s->os, o);
    p[o->nbytes / 2] ^= 0x5a;
    st = ECS_OK;
  }
  ecs__reply_error(s, c, st, 0);
}

/* The header and records of a request are in; dispatch. */
/* PING: an empty reply. */
static void handle_ping(ecs_server_t *s, conn_t *c) {
  ecs__reply_error(s, c, ECS_OK, 0);
}

/* What the server does with each opcode.  Flags say what the request may
 * carry: only PUT a data section from the client, only RELEASE the
 * NOREPLY flag.  rights: the ECS__RIGHT_* bits of which the connection's
 * token must hold one (0: any authenticated connection); docs/security.md
 * has the table.  ATTACH for writing needs the write right besides (its
 * handler maps the pool read-only without it).  name labels the opcode's latency histogram in
 * /metrics (NULL: not exported). */
enum { OP_DATA = 1, OP_NOREPLY = 2 };

enum {
  R_READ = ECS__RIGHT_READ,
  R_WRITE = ECS__RIGHT_WRITE,
  R_REMOVE = ECS__RIGHT_REMOVE,
  R_ADMIN = ECS__RIGHT_ADMIN
};

typedef struct op_entry {
  void (*handle)(ecs_server_t *s, conn_t *c); /* NULL: unknown opcode */
  uint8_t flags;                              /* OP_DATA, OP_NOREPLY */
  uint8_t rights;                             /* one of these rights is required (0: none) */
  const char *name;                           /* metrics label, or NULL */
} op_entry_t;

static const op_entry_t ops[] = {
    [ECS_OP_HELLO] = {ecs__handle_hello, 0, 0, "hello"},
    [ECS_OP_PUT] = {handle_put_begin, OP_DATA, R_WRITE, "put"},
    [ECS_OP_GET] = {handle_get, 0, R_READ, "get"},
    [ECS_OP_EXISTS] = {handle_keys, 0, R_READ, "exists"},
    [ECS_OP_REMOVE] = {handle_keys, 0, R_REMOVE, "remove"},
    [ECS_OP_STAT] = {handle_stat, 0, R_READ | R_ADMIN, "stat"},
    [ECS_OP_PING] = {handle_ping, 0, 0, "ping"},
    [ECS_OP_LEASE] = {handle_lease, 0, R_READ, "lease"},
    [ECS_OP_RELEASE] = {handle_release, OP_NOREPLY, R_READ, "release"},
    [ECS_OP_RESERVE] = {handle_reserve, 0, R_WRITE, "reserve"},
    [ECS_OP_COMMIT] = {handle_commit, 0, R_WRITE, "commit"},
    [ECS_OP_ATTACH] = {handle_attach, 0, R_READ, "attach"},
    [ECS_OP_RDMA_CONNECT] = {handle_rdma_connect, 0, R_READ, "rdma_connect"},
    [ECS_OP_UPGRADE] = {ecs__handle_upgrade, 0, 0, NULL},
    [ECS_OP_PULL] = {ecs__handle_pull, 0, R_WRITE, "pull"}, /* and read: per item, in the handler */
    [ECS_OP_DEBUG] = {handle_debug, 0, R_ADMIN, NULL},
};
#define N_OPS (sizeof ops / sizeof ops[0])

/* A request refused for want of a right: counted, and logged once a
 * second at most (the rest counted into the next line). */
static void log_denied(ecs_server_t *s, conn_t *c, const op_entry_t *op) {
  uint64_t now = ecs_now_ms();
  s->denied++;
  if (s->denied_log_ms && now - s->denied_log_ms < 1000) {
    s->denied_unlogged++;
    return;
  }
  char have[64];
  ECS_LOG_W("conn %llu: %s refused: its token's rights are %s (%llu more such refusals since the last line)",
            (unsigned long long)c->id, op->name ? op->name : "request",
            ecs__acl_rights_str(c->rights, have, sizeof have), (unsigned long long)s->denied_unlogged);
  s->denied_log_ms = now;
  s->denied_unlogged = 0;
}

/* The header and records of a request are in; dispatch.  Authentication
 * is checked before the opcode, so an unauthenticated peer learns nothing
 * about which opcodes exist.  A request the token has no right to is
 * answered ECS_EPERM and the connection stays up; a PUT so refused still
 * has its payload read (and discarded) by its handler, each item answered
 * ECS_EPERM, so the stream stays in step. */
void ecs__server_dispatch(ecs_server_t *s, conn_t *c) {
  c->req_t0_ns = ecs__now_ns();
  c->refuse = 0;
  if (!c->authed && c->hdr.opcode != (c->local ? ECS_OP_UPGRADE : ECS_OP_HELLO)) {
    ecs__reply_error(s, c, ECS_EAUTH, 1);
    return;
  }
  const op_entry_t *op = c->hdr.opcode < N_OPS ? &ops[c->hdr.opcode] : NULL;
  if (!op || !op->handle || (c->hdr.data_len != 0 && !(op->flags & OP_DATA)) ||
      ((c->hdr.flags & ECS_FLAG_NOREPLY) && !(op->flags & OP_NOREPLY))) {
    ecs__reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  if (op->rights && !(c->rights & op->rights)) {
    log_denied(s, c, op);
    if (!(op->flags & OP_DATA)) {
      /* a RELEASE that asked for no reply gets none: the lease stays, to its expiry */
      if (c->hdr.flags & ECS_FLAG_NOREPLY) {
        c->st = C_HDR; /* as handle_release: nothing to send; read the next request */
        return;
      }
      ecs__reply_error(s, c, ECS_EPERM, 0);
      return;
    }
    c->refuse = ECS_EPERM;
  }
  op->handle(s, c);
}

/* The body of a /metrics scrape: STAT's figures, then a latency histogram
 * per opcode that has a name. */
void ecs__server_render_metrics(void *ctx, ecs_mbuf_t *b) {
  ecs_server_t *s = ctx;
  ecs_stat_reply_t st = stat_snapshot(s);
  ecs_objstore_stats_t os;
  ecs_objstore_stats(s->os, &os);
  char epoch[32];
  snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)s->epoch);
  ecs_metrics_info(b, "ecstore_server_info", "This server: node id and epoch (start time, us).", "node",
                   s->o.node_id, "epoch", epoch);
  ecs_metrics_gauge(b, "ecstore_pool_bytes", "Pool size.", (double)st.pool_size);
  ecs_metrics_gauge(b, "ecstore_pool_used_bytes", "Pool bytes in blocks handed out.",
                    (double)st.bytes_in_use);
  ecs_metrics_gauge(b, "ecstore_pool_requested_bytes", "Bytes the stored objects asked for.",
                    (double)st.bytes_requested);
  ecs_metrics_gauge(b, "ecstore_pool_free_bytes", "Pool bytes free.", (double)st.bytes_free);
  ecs_metrics_gauge(b, "ecstore_pool_largest_free_bytes", "Largest free block.", (double)st.largest_free);
  ecs_metrics_gauge(b, "ecstore_pool_pinned", "1 when the pool is mlock'd.", (double)st.pool_locked);
  ecs_metrics_gauge(b, "ecstore_pool_cuda_registered",
                    "1 when the pool is registered with CUDA (--cuda-register and libcudart loaded).",
                    (double)st.pool_cuda_registered);
  ecs_metrics_gauge(b, "ecstore_objects", "Committed objects.", (double)st.objects);
  ecs_metrics_gauge(b, "ecstore_objects_pending", "Objects reserved, not yet committed.", (double)os.pending);
  ecs_metrics_gauge(b, "ecstore_connections", "Open client connections.", (double)st.connections);
  ecs_metrics_gauge(b, "ecstore_redis_up", "1 while the Redis link is up.", (double)st.redis_ok);
  ecs_metrics_gauge(b, "ecstore_redis_resync_pending",
                    "1 while a re-sync of the Redis records is owed or running (start-up, after an outage).",
                    (double)(s->meta != NULL && ecs_meta_resync_pending(s->meta)));
  ecs_metrics_counter(b, "ecstore_puts_total", "Objects put.", st.puts);
  ecs_metrics_counter(b, "ecstore_gets_total", "Objects asked for by get or lease.", st.gets);
  ecs_metrics_counter(b, "ecstore_get_hits_total", "Gets that found their object.", st.hits);
  ecs_metrics_counter(b, "ecstore_get_misses_total", "Gets that did not.", st.misses);
  ecs_metrics_counter(b, "ecstore_evictions_total", "Objects evicted (FIFO) to make room.", st.evictions);
  ecs_metrics_counter(b, "ecstore_removes_total", "Objects removed on request.", st.removes);
  ecs_metrics_gauge(b, "ecstore_hard_pinned_bytes",
                    "Bytes of hard-pinned objects (bounded by --hard-pin-max).",
                    (double)ecs_objstore_hard_bytes(s->os));
  ecs_metrics_counter(b, "ecstore_evict_skipped_total",
                      "Objects eviction looked at and passed over (being read, or soft-pinned).",
                      os.evict_skipped);
  ecs_metrics_counter(b, "ecstore_requests_denied_total",
                      "Requests refused: the token lacks the right (ACL).", s->denied);
  ecs_metrics_gauge(b, "ecstore_threads", "Event-loop threads (--threads).", (double)s->nloops);
  ecs_metrics_counter(b, "ecstore_lock_acquisitions_total", "Times the server lock was taken.", s->lock_n);
  ecs_metrics_counter(b, "ecstore_lock_held_microseconds_total", "Time the server lock was held.",
                      s->lock_held_ns / 1000);
  ecs_metrics_counter(b, "ecstore_lock_wait_microseconds_total", "Time threads waited for the server lock.",
                      s->lock_wait_ns / 1000);
  const char *vals[N_OPS];
  const ecs_hist_t *hs[N_OPS];
  size_t n = 0;
  for (size_t op = 0; op < N_OPS && op < sizeof s->latency / sizeof s->latency[0]; op++)
    if (ops[op].name) {
      vals[n] = ops[op].name;
      hs[n++] = &s->latency[op];
    }
  ecs_metrics_histograms(b, "ecstore_request_duration_seconds",
                         "Requests by opcode, from parsed to reply ready (puts include receiving the data).",
                         "op", vals, hs, n);
}
