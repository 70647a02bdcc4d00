/*
 * The object store: keys -> pool blocks, FIFO order, reference counts and
 * eviction.  It sits between the server (which speaks to sockets and Redis)
 * and the pool (which only hands out blocks).
 *
 * Life of an object:
 *   reserve()  -> PENDING: a block is allocated (evicting the oldest
 *                 unreferenced committed objects, in commit order, when the
 *                 pool cannot serve the request), the writer holds one ref;
 *                 a PENDING key is not visible to acquire() and blocks other
 *                 reserves of the same key (ECS_EBUSY).
 *   commit()   -> COMMITTED: gets the next commit sequence number, joins the
 *                 FIFO tail, visible to acquire(); the writer's ref drops.
 *   abort()    -> the pending object and its block are freed.
 *   reserve_replace() -> like reserve(), but a COMMITTED object of the key
 *                 may exist: it stays visible to acquire() while the new
 *                 one is PENDING, and commit() swaps them in one step (the
 *                 old one is dropped with ECS_DROP_REPLACED; its readers
 *                 finish on its bytes, freed at their last release).
 *   acquire()/release() bracket every read (a GET being sent, a lease):
 *                 a referenced object is never freed.
 *   remove()/eviction -> the object leaves the index and its list at once
 *                 (invisible to acquire) and the callback fires; its block
 *                 is freed when the last reference is released.
 *
 * Zero-byte objects (empty tensors) hold no block.
 *
 * Thread safety: none.  One thread (the server's event loop) owns an
 * objstore; the callback runs on that thread, inside the call that evicted.
 */
#ifndef ECS_OBJSTORE_H
#define ECS_OBJSTORE_H

#include <stdint.h>

#include "ecstore/pool.h"
#include "ecstore/tensor.h"

typedef enum ecs_obj_state {
  ECS_OBJ_PENDING = 1,   /* reserved, bytes being written */
  ECS_OBJ_COMMITTED = 2, /* readable, on its eviction list */
  ECS_OBJ_DOOMED = 3     /* removed/evicted, waiting for its last reader */
} ecs_obj_state_t;

typedef struct ecs_obj {
  uint8_t key[ECS_MAX_KEY]; /* the key bytes (not NUL-terminated) */
  uint16_t key_len;         /* 1..ECS_MAX_KEY */
  uint8_t state;            /* an ecs_obj_state_t */
  uint8_t codec;            /* ECS_CODEC_* of the stored bytes */
  uint8_t replace;          /* pending from reserve_replace(): commit drops the committed twin */
  uint8_t hard_pin;         /* hard pin (ECS_RESERVE_HARD_PIN): never evicted, only removed or replaced */
  uint16_t owner;           /* the tenant that stored it (ecs_objstore_reserve_as; 0: none) */
  uint32_t refs;            /* holders: the writer while pending, readers */
  uint64_t off;             /* pool offset (meaningless when nbytes == 0) */
  uint64_t nbytes;          /* stored bytes == the pool allocation size */
  uint64_t raw_nbytes;      /* tensor bytes once decoded */
  uint64_t checksum;        /* xxh3-64 of the stored bytes */
  uint64_t seq;             /* commit order (0 while pending) */
  uint64_t commit_ms;       /* wall-clock ms at commit */
  uint64_t keep_until_ms;   /* soft pin: evicted only after every unpinned object, until
                               this wall-clock ms (0: none); set before commit */
  ecs_tensor_desc_t desc;   /* dtype and shape */
  /* Internal links (hash chain, eviction list); not for callers. */
  struct ecs_obj *hnext;
  struct ecs_obj *fprev, *fnext;
} ecs_obj_t;

typedef enum ecs_drop_reason {
  ECS_DROP_EVICTED = 1, /* FIFO eviction (on demand or background) */
  ECS_DROP_REMOVED = 2, /* remove() */
  ECS_DROP_REPLACED = 3 /* a reserve_replace() of its key committed */
} ecs_drop_reason_t;

/* Called once per object that leaves the index (not for abort()). */
typedef void (*ecs_drop_cb)(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why);

typedef struct ecs_objstore_opts {
  double high_watermark; /* background eviction starts above this fill (0.95) */
  double low_watermark;  /* ...and stops at or below this fill (0.85) */
  uint64_t max_objects;  /* objects in the index, pending included (0: one per minimum block of the pool) */
  int scrub_freed;       /* zero a block's bytes before it goes back to the pool */
  ecs_drop_cb on_drop;   /* may be NULL */
  void *cb_ctx;          /* passed to on_drop */
} ecs_objstore_opts_t;

typedef struct ecs_objstore ecs_objstore_t;

typedef struct ecs_objstore_stats {
  uint64_t objects;       /* committed objects in the index */
  uint64_t pending;       /* reserved, not yet committed */
  uint64_t doomed;        /* dropped but still referenced */
  uint64_t evictions;     /* objects evicted since create */
  uint64_t removes;       /* objects removed since create */
  uint64_t replaces;      /* objects replaced by reserve_replace() commits */
  uint64_t bytes_live;    /* stored bytes of committed objects */
  uint64_t evict_skipped; /* objects eviction looked at and passed over (held, or pinned) */
} ecs_objstore_stats_t;

void ecs_objstore_opts_init(ecs_objstore_opts_t *o);

/* The pool is borrowed: it must outlive the objstore. */
int ecs_objstore_create(ecs_pool_t *pool, const ecs_objstore_opts_t *o, ecs_objstore_t **out);

/* Frees every object and block (callbacks are not called); accepts NULL. */
void ecs_objstore_destroy(ecs_objstore_t *os);
/* As destroy, but gives no block back to the pool: for a stop, when the
 * pool is destroyed next.  Giving back thousands of blocks one by one is
 * wasted work there, and in debug and sanitizer builds (ECS_DEBUG: every
 * free validates the whole pool) it took seconds, which made SIGTERM miss
 * its 2 s (issue 24).  Accepts NULL. */
void ecs_objstore_abandon(ecs_objstore_t *os);

/* Looks a key up: the COMMITTED object, else a PENDING one, or NULL (a key
 * being replaced has both; the committed one is returned).  No ref taken. */
ecs_obj_t *ecs_objstore_find(ecs_objstore_t *os, const void *key, uint16_t key_len);

/* Reserves nbytes for a new key.  Errors: ECS_EKEY (bad key), ECS_EBUSY
 * (the key is pending), ECS_ECONFLICT (the key is committed: the caller
 * compares content itself through find()), ECS_ETOOBIG (nbytes > pool),
 * ECS_ENOSPC (not enough can be evicted: everything left is referenced).
 * On success *out is PENDING with refs == 1. */
int ecs_objstore_reserve(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                         ecs_obj_t **out);

/* reserve() for an upsert: a committed object of the key does not stop it
 * (it is replaced at commit); a pending one still gives ECS_EBUSY. */
int ecs_objstore_reserve_replace(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                                 ecs_obj_t **out);

/* Tenants (quotas, docs/security.md): owners 1..n, quota[i-1] the stored
 * bytes owner i may hold (0: no limit).  Objects of an owner with a quota
 * are evicted only to make room for that owner's own puts, oldest first:
 * never for another tenant's, nor by background eviction.  ECS_OK,
 * ECS_EINVAL (n > 65535), ECS_EBUSY (objects exist already) or
 * ECS_ENOMEM; call once, before any reserve. */
int ecs_objstore_set_owners(ecs_objstore_t *os, unsigned n, const uint64_t *quota);

/* The bytes all hard pins together may hold (0: half the pool; more than
 * the pool: the pool).  An owner with a quota may hard-pin the same share
 * of its quota (hard pins count against the quota too).  Call before any
 * reserve; the default is half the pool. */
void ecs_objstore_set_hard_max(ecs_objstore_t *os, uint64_t bytes);

/* Flags of reserve_as().  REPLACE: reserve_replace(), an upsert.
 * HARD_PIN: a hard pin, never evicted (FIFO, background or quota) until
 * removed or replaced; ECS_EPINQUOTA past set_hard_max(). */
#define ECS_RESERVE_REPLACE 1u
#define ECS_RESERVE_HARD_PIN 2u

/* reserve() or reserve_replace() (flags ECS_RESERVE_*) on behalf of owner
 * (0: none).  An owner with a quota: an object larger than the quota is
 * ECS_EQUOTA; past the quota the owner's own oldest objects make room,
 * and when they cannot (held by readers, pending or hard-pinned) the item
 * is ECS_EQUOTA; room in the pool is made from the owner's objects and
 * those of owners without a quota.  Whether eviction can give the room is
 * decided before anything is evicted: when it cannot, the item is refused
 * (ECS_EQUOTA, ECS_EPINQUOTA, ECS_ENOSPC) and nothing is evicted. */
int ecs_objstore_reserve_as(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                            unsigned flags, uint16_t owner, ecs_obj_t **out);

/* Stored bytes (pending included) of owner. */
uint64_t ecs_objstore_owner_bytes(const ecs_objstore_t *os, uint16_t owner);

/* Stored bytes (pending included) of all hard pins. */
uint64_t ecs_objstore_hard_bytes(const ecs_objstore_t *os);

/* Commits a pending object (fill codec, raw_nbytes, checksum, desc first).
 * Drops the writer's reference. */
void ecs_objstore_commit(ecs_objstore_t *os, ecs_obj_t *obj);

/* Drops a pending object and frees its block. */
void ecs_objstore_abort(ecs_objstore_t *os, ecs_obj_t *obj);

/* A committed object with one more reference, or NULL. */
ecs_obj_t *ecs_objstore_acquire(ecs_objstore_t *os, const void *key, uint16_t key_len);

/* Drops one reference; frees a doomed object with its last reference. */
void ecs_objstore_release(ecs_objstore_t *os, ecs_obj_t *obj);

/* Removes a committed key.  ECS_OK, or ECS_ENOTFOUND (absent or pending). */
int ecs_objstore_remove(ecs_objstore_t *os, const void *key, uint16_t key_len);

/* Background eviction: when the pool's fill is above the high watermark,
 * evicts the oldest unreferenced objects until it is at or below the low
 * watermark, at most max_objects of them per call.  A run that finds
 * nothing evictable above low (referenced, or still pending) goes on at
 * the first call after a commit or a last release.  Returns how many it
 * evicted. */
unsigned ecs_objstore_evict_background(ecs_objstore_t *os, unsigned max_objects);

/* Calls fn for each committed object: by eviction class (unpinned, soft-
 * and hard-pinned, each quota'd owner's), each class oldest first. */
void ecs_objstore_foreach(ecs_objstore_t *os, void (*fn)(void *ctx, const ecs_obj_t *obj), void *ctx);

void ecs_objstore_stats(ecs_objstore_t *os, ecs_objstore_stats_t *st);

/* Pointer to an object's bytes in this process. */
void *ecs_objstore_data(ecs_objstore_t *os, const ecs_obj_t *obj);

#endif /* ECS_OBJSTORE_H */
