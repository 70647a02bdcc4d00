/*
 * Leases and reservations, the pins of the shm and RDMA data paths.  A
 * pin is an object a client holds: a committed object it reads in place
 * (lease) or a pending object it writes in place (reservation).  Pins live
 * in a per-connection slot table; a pin's id is (generation << 32 |
 * slot + 1), so a stale or forged id is refused in O(1).  Closing the
 * connection or the pin's expiry drops it.
 */
#include "store/server_internal.h"

#include <stdlib.h>

#include "ecstore/error.h"
#include "store/log.h"
#include "store/net.h"

/* Per-connection quotas: without them one client could lease or reserve
 * the whole pool (everyone else gets ENOSPC) and grow its pin table
 * without bound.  A refused item is ECS_EBUSY; other clients are not
 * affected, and the client's own pins free room as they go.  A
 * connection that holds nothing may always pin one object, so an object
 * larger than the byte quota can still be stored and read in place. */
int ecs__pin_room(const ecs_server_t *s, const conn_t *c, uint64_t nbytes) {
  if (c->live_pins == 0)
    return ECS_OK;
  if (c->live_pins >= s->o.max_pins || nbytes > s->o.max_pinned_bytes - c->pinned_bytes)
    return ECS_EBUSY;
  return ECS_OK;
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
  p->kind = kind;
  p->expires_ms = expires_ms;
  p->gen++;
  c->live_pins++;
  c->pinned_bytes += obj->nbytes;
  return (uint64_t)p->gen << 32 | (uint64_t)(slot + 1);
}

/* Removes the pin named id if it is of the given kind; returns its object. */
ecs_obj_t *ecs__pin_take(conn_t *c, uint64_t id, uint8_t kind) {
  uint32_t slot = (uint32_t)(id & 0xffffffffu);
  if (slot == 0 || slot > c->npins)
    return NULL;
  pin_t *p = &c->pins[slot - 1];
  if (!p->obj || p->kind != kind || p->gen != (uint32_t)(id >> 32))
    return NULL;
  ecs_obj_t *o = p->obj;
  p->obj = NULL;
  p->next_free = c->pin_free;
  c->pin_free = slot - 1;
  c->live_pins--;
  c->pinned_bytes -= o->nbytes;
  return o;
}

static void pin_drop(ecs_server_t *s, conn_t *c, uint32_t slot) {
  pin_t *p = &c->pins[slot];
  c->pinned_bytes -= p->obj->nbytes;
  if (p->kind == PIN_LEASE)
    ecs_objstore_release(s->os, p->obj);
  else
    ecs_objstore_abort(s->os, p->obj);
  p->obj = NULL;
  p->next_free = c->pin_free;
  c->pin_free = slot;
  c->live_pins--;
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
