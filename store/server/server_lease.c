/*
 * Leases and reservations, the pins of the shm and RDMA data paths.  A
 * pin is an object a client holds: a committed object it reads in place
 * (lease) or a pending object it writes in place (reservation).  Pins live
 * in a per-connection slot table; a pin's id is (generation << 32 |
 * slot + 1), so a stale or forged id is refused in O(1).  Closing the
 * connection or the pin's expiry drops it.
 *
 * On an RDMA connection a pin also carries a window (ecs_rdma_ep_window):
 * a zero-based registration of the object's block alone, in the
 * connection's own protection domain, readable for a lease and writable
 * for a reservation.  Its rkey is the only way that client's QP reaches
 * the pool, and no other client's QP can use it.  Whatever ends the pin
 * (release, commit, abort, expiry, close) closes the window first, so the
 * rkey is dead before the block is published, freed or reused.
 */
#include "store/server/server_internal.h"

#include <stdlib.h>

#include "ecstore/error.h"
#include "store/core/log.h"
#include "store/core/net.h"

/* Per-connection quotas: without them one client could lease or reserve
 * the whole pool (everyone else gets ENOSPC) and grow its pin table
 * without bound.  A refused item is ECS_EBUSY; other clients are not
 * affected, and the client's own pins free room as they go.  A
 * connection that holds nothing may always pin one object, so an object
 * larger than the byte quota can still be stored and read in place. */
int ecs__pin_room(const ecs_server_t *s, const conn_t *c, uint64_t nbytes) {
  const tenant_t *t = c->tenant;
  if (t && t->pins) {
    /* A token's quota (--acl-file) binds all its connections together:
     * more connections are no way around it.  Its one-object exception
     * holds only while the whole token holds nothing pinned. */
    if ((t->q.pins && t->pins >= t->q.pins) || (t->q.pinned && nbytes > t->q.pinned - t->pinned))
      return ECS_EQUOTA;
  } else if (t && t->q.pinned && t->q.stored && nbytes > t->q.stored) {
    return ECS_EQUOTA; /* the exception is bounded by what the token may store */
  }
  if (c->live_pins == 0)
    return ECS_OK;
  if (c->live_pins >= s->o.max_pins || nbytes > s->o.max_pinned_bytes - c->pinned_bytes)
    return ECS_EBUSY;
  return ECS_OK;
}

/* A pin of nbytes taken (+1) or given back (-1): the connection's and its
 * token's accounts. */
static void pin_account(conn_t *c, uint64_t nbytes, int sign) {
  tenant_t *t = c->tenant;
  if (sign > 0) {
    c->live_pins++;
    c->pinned_bytes += nbytes;
  } else {
    c->live_pins--;
    c->pinned_bytes -= nbytes;
  }
  if (t && sign > 0) {
    t->pins++;
    t->pinned += nbytes;
  } else if (t) {
    t->pins--;
    t->pinned -= nbytes;
  }
}

uint64_t ecs__pin_add(conn_t *c, ecs_obj_t *obj, uint8_t kind, uint64_t expires_ms) {
  uint32_t slot;
  if (c->pin_free != PIN_NONE) {
    slot = c->pin_free;
    c->pin_free = c->pins[slot].next_free;
  } else {
    if (c->npins == c->pins_cap) {
      uint32_t ncap = c->pins_cap ? c->pins_cap * 2 : 64;
      pin_t *np = realloc(c->pins, (size_t)ncap * sizeof *np);
      if (!np)
        return 0;
      c->pins = np;
      c->pins_cap = ncap;
    }
    slot = c->npins++;
    c->pins[slot].gen = 0;
  }
  pin_t *p = &c->pins[slot];
  p->obj = obj;
  p->win = NULL;
  p->kind = kind;
  p->expires_ms = expires_ms;
  p->gen++;
  pin_account(c, obj->nbytes, 1);
  return (uint64_t)p->gen << 32 | (uint64_t)(slot + 1);
}

/* The live pin named id, of the given kind, or NULL. */
static pin_t *pin_find(conn_t *c, uint64_t id, uint8_t kind) {
  uint32_t slot = (uint32_t)(id & 0xffffffffu);
  if (slot == 0 || slot > c->npins)
    return NULL;
  pin_t *p = &c->pins[slot - 1];
  if (!p->obj || p->kind != kind || p->gen != (uint32_t)(id >> 32))
    return NULL;
  return p;
}

/* Closes the pin's window: from here on its rkey is a remote access error. */
static void pin_close_window(pin_t *p) {
  ecs_rdma_dereg(p->win);
  p->win = NULL;
}

int ecs__pin_window(ecs_server_t *s, conn_t *c, uint64_t id, uint8_t kind, uint32_t *rkey) {
  *rkey = 0;
  pin_t *p = pin_find(c, id, kind);
  if (!p)
    return ECS_ENOTFOUND;
  if (!c->ep || p->obj->nbytes == 0)
    return ECS_OK; /* not an RDMA connection, or nothing to move */
  int access = kind == PIN_LEASE ? ECS_RDMA_REMOTE_READ : ECS_RDMA_REMOTE_WRITE;
  int rc =
      ecs_rdma_ep_window(c->ep, ecs_objstore_data(s->os, p->obj), (size_t)p->obj->nbytes, access, &p->win);
  if (rc != ECS_OK) {
    ECS_LOG_W("conn %llu: cannot open an RDMA window of %llu bytes: %s", (unsigned long long)c->id,
              (unsigned long long)p->obj->nbytes, ecs_strerror(rc));
    return rc;
  }
  *rkey = ecs_rdma_mr_rkey(p->win);
  return ECS_OK;
}

/* Removes the pin named id if it is of the given kind; returns its object. */
ecs_obj_t *ecs__pin_take(conn_t *c, uint64_t id, uint8_t kind) {
  pin_t *p = pin_find(c, id, kind);
  if (!p)
    return NULL;
  uint32_t slot = (uint32_t)(id & 0xffffffffu);
  pin_close_window(p);
  ecs_obj_t *o = p->obj;
  p->obj = NULL;
  p->next_free = c->pin_free;
  c->pin_free = slot - 1;
  pin_account(c, o->nbytes, -1);
  return o;
}

static void pin_drop(ecs_server_t *s, conn_t *c, uint32_t slot) {
  pin_t *p = &c->pins[slot];
  pin_close_window(p);
  pin_account(c, p->obj->nbytes, -1);
  if (p->kind == PIN_LEASE)
    ecs_objstore_release(s->os, p->obj);
  else
    ecs_objstore_abort(s->os, p->obj);
  p->obj = NULL;
  p->next_free = c->pin_free;
  c->pin_free = slot;
}

/* Drops every pin past its deadline (all of them when now is UINT64_MAX). */
void ecs__pins_expire(ecs_server_t *s, conn_t *c, uint64_t now) {
  for (uint32_t i = 0; i < c->npins && c->live_pins; i++) {
    if (c->pins[i].obj && c->pins[i].expires_ms <= now) {
      if (now != UINT64_MAX)
        ECS_LOG_W("conn %llu: %s expired; dropped", (unsigned long long)c->id,
                  c->pins[i].kind == PIN_LEASE ? "lease" : "reservation");
      pin_drop(s, c, i);
    }
  }
}
uint64_t ecs__pin_deadline(const ecs_server_t *s) {
  return ecs_now_ms() + (uint64_t)s->o.lease_timeout_ms;
}
