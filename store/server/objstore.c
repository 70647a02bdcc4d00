/*
 * The object store: a chained hash table of keys, lists of committed
 * objects by who may evict them, reference counts, and eviction.
 *
 * Where an object lives, by state:
 *   PENDING    hash table only (a second reserve of its key sees EBUSY;
 *              eviction never sees it, so a writer's block is never taken);
 *              a replacing one shares its key with the COMMITTED object it
 *              replaces at commit, so a key has at most one of each
 *   COMMITTED  hash table and one list by eviction class (at commit):
 *              the FIFO (anyone's to evict, commit order), the soft pins
 *              (in the order the pins end), a quota'd owner's own list
 *              (commit order), the hard pins (never evicted)
 *   DOOMED     neither; on the doomed list (reusing the FIFO links) only so
 *              that destroy() can free it; freed at its last release
 *
 * Eviction walks the lists open to the evictor from their heads, oldest
 * head first, and skips referenced objects: they keep their place and stay
 * the oldest, to be evicted once released.  Lists it may not evict from it
 * never opens, so hard pins and other tenants' objects cost it nothing.
 *
 * The callback runs while the object is still allocated (and its block
 * still held), so it may read the object and its bytes; it must not call
 * back into the objstore to change it.
 */
#include "store/server/objstore.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

/* First table size; a power of two, small enough to cost nothing idle. */
#define OS_INITIAL_BUCKETS 1024u

/* A list of committed objects of one eviction class (through fprev/fnext). */
typedef struct olist {
  ecs_obj_t *head, *tail; /* the first and last object */
  uint64_t free_bytes;    /* pool bytes (granted) of the objects on it that no one holds */
} olist_t;

struct ecs_objstore {
  ecs_pool_t *pool;         /* borrowed; outlives us */
  ecs_objstore_opts_t opts; /* watermarks and callback, as given */
  uint64_t max_alloc;       /* the largest request the pool could ever serve */
  uint64_t min_block;       /* the pool's granule: what one block really costs */
  uint64_t max_objects;     /* bound on nkeys: what the index may cost in host memory */
  uint64_t high_bytes;      /* bytes_in_use above this starts background eviction */
  uint64_t low_bytes;       /* ...and at or below this stops it */
  int bg_active;            /* 1 between crossing high and reaching low */
  int bg_stalled;           /* a run stopped above low with nothing evictable: resume once something is */

  ecs_obj_t **buckets; /* hash chains through hnext; PENDING and COMMITTED */
  size_t nbuckets;     /* a power of two */
  size_t nkeys;        /* objects in the table */

  /* Every committed object is on exactly one list, by what may evict it. */
  olist_t fifo;      /* anyone's to evict, oldest first: commit order */
  olist_t soft;      /* soft-pinned (owners without a quota): in the order the pins end */
  olist_t hard;      /* hard-pinned: never evicted; commit order */
  olist_t *owned;    /* [nowners + 1]: objects of owners with a quota (their soft pins too) */
  ecs_obj_t *doomed; /* dropped objects still referenced, through fnext */

  size_t kept; /* committed objects with a soft pin (expired ones too) */

  uint64_t hard_max;   /* bytes all hard pins may hold (ecs_objstore_set_hard_max) */
  uint64_t hard_bytes; /* bytes hard pins hold, pending included */

  unsigned nowners;         /* tenants 1..nowners (ecs_objstore_set_owners) */
  uint64_t *owner_quota;    /* [nowners + 1]: stored bytes each may hold (0: no limit) */
  uint64_t *owner_bytes;    /* [nowners + 1]: stored bytes each holds, pending included */
  uint64_t *owner_hard_max; /* [nowners + 1]: its share of hard_max (owners with a quota) */
  uint64_t *owner_hard;     /* [nowners + 1]: bytes its hard pins hold, pending included */

  uint64_t next_seq;       /* the seq the next commit gets */
  ecs_objstore_stats_t st; /* counters returned by ecs_objstore_stats() */
};

/* ---- helpers ------------------------------------------------------------ */

static uint64_t key_hash(const void *key, size_t len) {
  return XXH3_64bits(key, len);
}

/* What the pool really takes for nbytes: exact-size blocks are rounded up
 * to the minimum block, and zero-byte objects take nothing. */
static uint64_t granted(const ecs_objstore_t *os, uint64_t nbytes) {
  return (nbytes + os->min_block - 1) / os->min_block * os->min_block;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The pool serves each request from one power-of-two block (pool.h), so
 * in a region that is not a power of two the largest block, not the
 * region, bounds a request.  Anything larger is ETOOBIG up front: evicting
 * the whole FIFO for it would only end in ENOSPC. */
static uint64_t largest_block(uint64_t size, uint64_t min_block) {
  uint64_t b = min_block;
  while (b <= size / 2)
    b *= 2;
  return b <= size ? b : 0;
}

/* Frees an object that is in no list, with its block.  Returns the bytes
 * this gave back to the pool.  With scrub_freed the bytes are zeroed
 * first: a removed tensor must not outlive its removal in a pool that
 * other clients map (shm) or read (RDMA), nor in a core dump. */
static uint64_t obj_free(ecs_objstore_t *os, ecs_obj_t *o) {
  uint64_t freed = 0;
  if (o->nbytes) {
    if (os->opts.scrub_freed)
      memset(ecs_pool_ptr(os->pool, o->off), 0, (size_t)o->nbytes);
    int rc = ecs_pool_free(os->pool, o->off, o->nbytes);
    assert(rc == ECS_OK); /* a failure here is our bookkeeping bug */
    (void)rc;
    freed = granted(os, o->nbytes);
  }
  free(o);
  return freed;
}

/* ---- hash table --------------------------------------------------------- */

static ecs_obj_t **bucket_of(ecs_objstore_t *os, const void *key, size_t len) {
  return &os->buckets[key_hash(key, len) & (os->nbuckets - 1)];
}

/* The object of a key in the given state (0: any, committed first). */
static ecs_obj_t *table_find_state(ecs_objstore_t *os, const void *key, uint16_t len, int state) {
  ecs_obj_t *other = NULL;
  for (ecs_obj_t *o = *bucket_of(os, key, len); o; o = o->hnext) {
    if (o->key_len != len || memcmp(o->key, key, len) != 0)
      continue;
    if (state ? o->state == state : o->state == ECS_OBJ_COMMITTED)
      return o;
    if (!state)
      other = o;
  }
  return other;
}

static ecs_obj_t *table_find(ecs_objstore_t *os, const void *key, uint16_t len) {
  return table_find_state(os, key, len, 0);
}

/* Doubles the table.  When the new array cannot be had the old one stays:
 * chains get longer, nothing breaks, so insertion never fails. */
static void table_grow(ecs_objstore_t *os) {
  size_t n = os->nbuckets * 2;
  ecs_obj_t **nb = calloc(n, sizeof *nb);
  if (!nb)
    return;
  for (size_t i = 0; i < os->nbuckets; i++) {
    ecs_obj_t *o = os->buckets[i];
    while (o) {
      ecs_obj_t *next = o->hnext;
      ecs_obj_t **b = &nb[key_hash(o->key, o->key_len) & (n - 1)];
      o->hnext = *b;
      *b = o;
      o = next;
    }
  }
  free(os->buckets);
  os->buckets = nb;
  os->nbuckets = n;
}

static void table_insert(ecs_objstore_t *os, ecs_obj_t *o) {
  if (os->nkeys >= os->nbuckets) /* keep the load factor at most 1 */
    table_grow(os);
  ecs_obj_t **b = bucket_of(os, o->key, o->key_len);
  o->hnext = *b;
  *b = o;
  os->nkeys++;
}

static void table_unlink(ecs_objstore_t *os, ecs_obj_t *o) {
  ecs_obj_t **p = bucket_of(os, o->key, o->key_len);
  while (*p != o) {
    assert(*p);
    p = &(*p)->hnext;
  }
  *p = o->hnext;
  o->hnext = NULL;
  os->nkeys--;
}

/* ---- eviction classes and the doomed list -------------------------------- */

/* Which list a committed object is on.  The class is fixed before commit
 * (hard pin at reserve, soft pin before commit, owners' quotas before any
 * reserve), so it is the same at unlink. */
static int has_quota(const ecs_objstore_t *os, uint16_t owner) {
  return owner && owner <= os->nowners && os->owner_quota[owner];
}

static olist_t *list_of(ecs_objstore_t *os, const ecs_obj_t *o) {
  if (o->hard_pin)
    return &os->hard;
  if (has_quota(os, o->owner))
    return &os->owned[o->owner];
  return o->keep_until_ms ? &os->soft : &os->fifo;
}

/* Adds a just-committed object to its list: at the tail (commit order),
 * except on the soft list, which stays in the order the pins end (with one
 * TTL for all that is commit order too, and the walk back is one step). */
static void list_add(ecs_objstore_t *os, ecs_obj_t *o) {
  olist_t *l = list_of(os, o);
  ecs_obj_t *after = l->tail;
  if (l == &os->soft)
    while (after && after->keep_until_ms > o->keep_until_ms)
      after = after->fprev;
  o->fprev = after;
  o->fnext = after ? after->fnext : l->head;
  if (o->fnext)
    o->fnext->fprev = o;
  else
    l->tail = o;
  if (after)
    after->fnext = o;
  else
    l->head = o;
  if (!o->refs)
    l->free_bytes += granted(os, o->nbytes);
}

static void list_unlink(ecs_objstore_t *os, ecs_obj_t *o) {
  olist_t *l = list_of(os, o);
  if (o->fprev)
    o->fprev->fnext = o->fnext;
  else
    l->head = o->fnext;
  if (o->fnext)
    o->fnext->fprev = o->fprev;
  else
    l->tail = o->fprev;
  o->fprev = o->fnext = NULL;
  if (!o->refs)
    l->free_bytes -= granted(os, o->nbytes);
}

/* The doomed list is kept only so that destroy() finds these objects;
 * doubly linked so that a last release unlinks in O(1). */
static void doomed_push(ecs_objstore_t *os, ecs_obj_t *o) {
  o->fprev = NULL;
  o->fnext = os->doomed;
  if (os->doomed)
    os->doomed->fprev = o;
  os->doomed = o;
}

static void doomed_unlink(ecs_objstore_t *os, ecs_obj_t *o) {
  if (o->fprev)
    o->fprev->fnext = o->fnext;
  else
    os->doomed = o->fnext;
  if (o->fnext)
    o->fnext->fprev = o->fprev;
  o->fprev = o->fnext = NULL;
}

/* ---- dropping and eviction ---------------------------------------------- */

/* Takes a reserved object's bytes off its owner's and the hard pins'
 * accounts (pending objects count, as they hold their block). */
static void owner_sub(ecs_objstore_t *os, const ecs_obj_t *o) {
  if (o->owner && o->owner <= os->nowners) {
    os->owner_bytes[o->owner] -= o->nbytes;
    if (o->hard_pin)
      os->owner_hard[o->owner] -= o->nbytes;
  }
  if (o->hard_pin)
    os->hard_bytes -= o->nbytes;
}

/* Takes a committed object out of the index and its list, tells the
 * callback, and frees it now or, when readers hold it, at its last release.
 * Returns the bytes given back to the pool now. */
static uint64_t drop(ecs_objstore_t *os, ecs_obj_t *o, ecs_drop_reason_t why) {
  assert(o->state == ECS_OBJ_COMMITTED);
  assert(why != ECS_DROP_EVICTED || !o->hard_pin);
  table_unlink(os, o);
  list_unlink(os, o);
  owner_sub(os, o);
  if (o->keep_until_ms)
    os->kept--;
  os->st.objects--;
  os->st.bytes_live -= o->nbytes;
  if (why == ECS_DROP_EVICTED)
    os->st.evictions++;
  else if (why == ECS_DROP_REPLACED)
    os->st.replaces++;
  else
    os->st.removes++;
  o->state = ECS_OBJ_DOOMED;
  if (o->refs) {
    doomed_push(os, o);
    os->st.doomed++;
  }
  if (os->opts.on_drop)
    os->opts.on_drop(os->opts.cb_ctx, o, why);
  return o->refs ? 0 : obj_free(os, o);
}

/* A victim search.  Victims come from at most three lists: the FIFO
 * (anyone's to evict), the soft pins (their expired prefix first, all of
 * them in the second pass) and, for an evictor with a quota, its own list;
 * the oldest head of the three goes first.  Hard pins and other tenants'
 * quota'd objects are on lists the search never opens, so neither a put
 * nor the background tick pays for them however many there are (a single
 * FIFO made every background tick walk past all of them). */
typedef struct scan {
  ecs_obj_t *at[3]; /* the next object to look at: FIFO, soft pins, own list */
  olist_t *own;     /* the evictor's own list (a tenant with a quota), or NULL */
  uint64_t now;     /* wall-clock ms for soft pins (read once, when any exists) */
  int pinned_too;   /* second pass: live soft pins may go too */
  int fifo_too;     /* the FIFO and the soft pins are open to this evictor */
} scan_t;

static void scan_init(ecs_objstore_t *os, scan_t *sc, uint16_t evictor, int fifo_too) {
  sc->own = has_quota(os, evictor) ? &os->owned[evictor] : NULL;
  sc->fifo_too = fifo_too;
  sc->at[0] = fifo_too ? os->fifo.head : NULL;
  sc->at[1] = fifo_too ? os->soft.head : NULL;
  sc->at[2] = sc->own ? sc->own->head : NULL;
  sc->now = os->kept ? now_ms() : 0;
  sc->pinned_too = !os->kept; /* no soft pin anywhere: one pass */
}

/* The first object at or after sc->at[i] that this pass may evict; stops
 * the soft list at its first live pin in the first pass (the rest end
 * later).  Counts what it passes over. */
static ecs_obj_t *scan_head(ecs_objstore_t *os, scan_t *sc, int i) {
  ecs_obj_t *o = sc->at[i];
  for (; o; o = o->fnext) {
    int live = o->keep_until_ms > sc->now;
    if (i == 1 && live && !sc->pinned_too)
      return sc->at[i] = NULL;
    if (!o->refs && (sc->pinned_too || !live))
      break;
    os->st.evict_skipped++;
  }
  return sc->at[i] = o;
}

static ecs_obj_t *next_victim(ecs_objstore_t *os, scan_t *sc) {
  for (;;) {
    ecs_obj_t *v = NULL;
    int from = -1;
    for (int i = 0; i < 3; i++) {
      ecs_obj_t *h = scan_head(os, sc, i);
      if (h && (!v || h->seq < v->seq)) {
        v = h;
        from = i;
      }
    }
    if (v) {
      sc->at[from] = v->fnext;
      return v;
    }
    if (sc->pinned_too)
      return NULL;
    sc->pinned_too = 1; /* the pinned, from the start of their lists */
    sc->at[1] = sc->fifo_too ? os->soft.head : NULL;
    sc->at[2] = sc->own ? sc->own->head : NULL;
  }
}

/* Whether evicting everything owner may evict could give the pool room for
 * nbytes, counted in bytes before anything is evicted: an eviction that
 * cannot end in room only loses objects (issue 25 O1: a tenant over its
 * quota evicted its own objects, then failed ENOSPC anyway).  Exact in
 * bytes (the lists count their unreferenced bytes); the one case it cannot
 * see is a pool with the bytes free but no block of the size, which the
 * buddy allocator's merging makes rare. */
static int room_possible(ecs_objstore_t *os, uint64_t nbytes, uint16_t owner) {
  if (!nbytes || ecs_pool_can_fit(os->pool, nbytes))
    return 1;
  ecs_pool_stats_t ps;
  ecs_pool_stats(os->pool, &ps);
  uint64_t can = ps.bytes_free + os->fifo.free_bytes + os->soft.free_bytes;
  if (has_quota(os, owner))
    can += os->owned[owner].free_bytes;
  return can >= granted(os, nbytes);
}

/* Evicts oldest-first (soft-pinned objects last, other tenants' quota'd
 * objects and hard pins never) until the pool can serve nbytes and the
 * index has room for one more object.  The count matters for zero-byte
 * objects, which hold no block: bounded by bytes alone, a flood of them
 * grew the index (host memory) without end and was never evicted.  The
 * scan resumes after the last victim instead of at the head: the
 * referenced objects it skipped cannot be released meanwhile (one thread,
 * and the callback must not call back), so one reserve costs
 * O(skipped + evicted), twice that when it reaches the soft-pinned. */
static int make_room(ecs_objstore_t *os, uint64_t nbytes, uint16_t owner) {
  scan_t sc;
  int started = 0;
  while (os->nkeys >= os->max_objects || (nbytes && !ecs_pool_can_fit(os->pool, nbytes))) {
    if (!started++)
      scan_init(os, &sc, owner, 1);
    ecs_obj_t *victim = next_victim(os, &sc);
    if (!victim)
      return ECS_ENOSPC;
    drop(os, victim, ECS_DROP_EVICTED);
  }
  return ECS_OK;
}

/* ---- public API --------------------------------------------------------- */

void ecs_objstore_opts_init(ecs_objstore_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->high_watermark = 0.95;
  o->low_watermark = 0.85;
}

static int opts_valid(const ecs_objstore_opts_t *o) {
  return o->low_watermark >= 0.0 && o->low_watermark <= o->high_watermark && o->high_watermark <= 1.0;
}

int ecs_objstore_create(ecs_pool_t *pool, const ecs_objstore_opts_t *o, ecs_objstore_t **out) {
  ecs_objstore_opts_t defaults;
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!o) {
    ecs_objstore_opts_init(&defaults);
    o = &defaults;
  }
  if (!pool || !opts_valid(o))
    return ECS_EINVAL;
  ecs_objstore_t *os = calloc(1, sizeof *os);
  if (!os)
    return ECS_ENOMEM;
  os->buckets = calloc(OS_INITIAL_BUCKETS, sizeof *os->buckets);
  if (!os->buckets) {
    free(os);
    return ECS_ENOMEM;
  }
  ecs_pool_stats_t ps;
  ecs_pool_stats(pool, &ps);
  os->pool = pool;
  os->opts = *o;
  os->min_block = ps.min_block ? ps.min_block : 1;
  os->max_alloc = largest_block(ps.size, os->min_block);
  os->max_objects = o->max_objects ? o->max_objects : ps.size / os->min_block;
  if (!os->max_objects)
    os->max_objects = 1;
  /* Integer thresholds: bytes_in_use > high * size <=> > floor(high * size). */
  os->high_bytes = (uint64_t)(o->high_watermark * (double)ps.size);
  os->low_bytes = (uint64_t)(o->low_watermark * (double)ps.size);
  os->nbuckets = OS_INITIAL_BUCKETS;
  os->next_seq = 1;
  os->hard_max = ps.size / 2;
  *out = os;
  return ECS_OK;
}

static void objstore_free_all(ecs_objstore_t *os, int give_back) {
  if (!os)
    return;
  for (size_t i = 0; i < os->nbuckets; i++) {
    ecs_obj_t *o = os->buckets[i];
    while (o) {
      ecs_obj_t *next = o->hnext;
      if (give_back)
        obj_free(os, o);
      else
        free(o);
      o = next;
    }
  }
  while (os->doomed) {
    ecs_obj_t *o = os->doomed;
    os->doomed = o->fnext;
    if (give_back)
      obj_free(os, o);
    else
      free(o);
  }
  free(os->buckets);
  free(os->owned);
  free(os->owner_quota);
  free(os->owner_bytes);
  free(os->owner_hard_max);
  free(os->owner_hard);
  free(os);
}

void ecs_objstore_destroy(ecs_objstore_t *os) {
  objstore_free_all(os, 1);
}

void ecs_objstore_abandon(ecs_objstore_t *os) {
  objstore_free_all(os, 0);
}

ecs_obj_t *ecs_objstore_find(ecs_objstore_t *os, const void *key, uint16_t key_len) {
  if (ecs_key_check(key, key_len) != ECS_OK)
    return NULL;
  return table_find(os, key, key_len);
}

/* An owner with a quota first makes room under it from its own objects,
 * oldest first (FIFO within the tenant), soft-pinned ones last, hard-pinned
 * ones never.  Nothing is evicted unless enough of the owner's objects can
 * go: its pending puts and hard pins count against the quota but cannot be
 * evicted, and evicting the rest for a put that is refused anyway would
 * only lose them. */
static int quota_room(ecs_objstore_t *os, uint16_t owner, uint64_t nbytes) {
  uint64_t q = os->owner_quota[owner];
  if (os->owner_bytes[owner] <= q - nbytes)
    return ECS_OK;
  uint64_t need = os->owner_bytes[owner] - (q - nbytes), can = 0;
  for (ecs_obj_t *o = os->owned[owner].head; o && can < need; o = o->fnext)
    can += o->refs ? 0 : o->nbytes;
  if (can < need)
    return ECS_EQUOTA;
  scan_t sc;
  scan_init(os, &sc, owner, 0);
  while (os->owner_bytes[owner] > q - nbytes) {
    ecs_obj_t *victim = next_victim(os, &sc);
    if (!victim)
      break;
    drop(os, victim, ECS_DROP_EVICTED);
  }
  return os->owner_bytes[owner] > q - nbytes ? ECS_EQUOTA : ECS_OK;
}

/* What may be refused before anything is evicted: a quota the object alone
 * exceeds or its owner cannot get under, hard pins past their quota, and a
 * pool that no eviction open to owner could give room. */
static int admissible(ecs_objstore_t *os, uint64_t nbytes, uint16_t owner, int hard) {
  int quota = has_quota(os, owner);
  if (quota && nbytes > os->owner_quota[owner])
    return ECS_EQUOTA;
  if (hard && (os->hard_bytes > os->hard_max || nbytes > os->hard_max - os->hard_bytes))
    return ECS_EPINQUOTA;
  if (hard && quota &&
      (os->owner_hard[owner] > os->owner_hard_max[owner] ||
       nbytes > os->owner_hard_max[owner] - os->owner_hard[owner]))
    return ECS_EPINQUOTA;
  if (!room_possible(os, nbytes, owner))
    return ECS_ENOSPC;
  return ECS_OK;
}

/* The struct is allocated before any eviction so that running out of host
 * memory never costs an object its place in the pool. */
static int reserve(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes, unsigned flags,
                   uint16_t owner, ecs_obj_t **out) {
  *out = NULL;
  int replace = (flags & ECS_RESERVE_REPLACE) != 0, hard = (flags & ECS_RESERVE_HARD_PIN) != 0;
  if (owner > os->nowners)
    owner = 0;
  if (ecs_key_check(key, key_len) != ECS_OK)
    return ECS_EKEY;
  if (table_find_state(os, key, key_len, ECS_OBJ_PENDING))
    return ECS_EBUSY;
  if (!replace && table_find_state(os, key, key_len, ECS_OBJ_COMMITTED))
    return ECS_ECONFLICT;
  if (nbytes > os->max_alloc)
    return ECS_ETOOBIG;
  int rc = admissible(os, nbytes, owner, hard);
  if (rc != ECS_OK)
    return rc;
  ecs_obj_t *o = calloc(1, sizeof *o);
  if (!o)
    return ECS_ENOMEM;
  if (has_quota(os, owner))
    rc = quota_room(os, owner, nbytes);
  if (rc == ECS_OK)
    rc = make_room(os, nbytes, owner);
  if (rc == ECS_OK && nbytes)
    rc = ecs_pool_alloc(os->pool, nbytes, &o->off);
  if (rc != ECS_OK) {
    free(o);
    return rc;
  }
  memcpy(o->key, key, key_len);
  o->key_len = key_len;
  o->state = ECS_OBJ_PENDING;
  o->replace = (uint8_t)replace;
  o->hard_pin = (uint8_t)hard;
  o->refs = 1;
  o->nbytes = nbytes;
  o->owner = owner;
  if (owner) {
    os->owner_bytes[owner] += nbytes;
    if (hard)
      os->owner_hard[owner] += nbytes;
  }
  if (hard)
    os->hard_bytes += nbytes;
  table_insert(os, o);
  os->st.pending++;
  *out = o;
  return ECS_OK;
}

int ecs_objstore_reserve(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                         ecs_obj_t **out) {
  return reserve(os, key, key_len, nbytes, 0, 0, out);
}

int ecs_objstore_reserve_as(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                            unsigned flags, uint16_t owner, ecs_obj_t **out) {
  return reserve(os, key, key_len, nbytes, flags, owner, out);
}

/* Each owner with a quota may hard-pin the share of its quota that
 * hard_max is of the pool: with the quotas within the pool, the shares add
 * up to at most hard_max, so no tenant's hard pins take another's. */
static void hard_shares(ecs_objstore_t *os) {
  double frac = (double)os->hard_max / (double)ecs_pool_size(os->pool);
  for (unsigned i = 1; i <= os->nowners; i++)
    os->owner_hard_max[i] = (uint64_t)(frac * (double)os->owner_quota[i]);
}

int ecs_objstore_set_owners(ecs_objstore_t *os, unsigned n, const uint64_t *quota) {
  if (n > UINT16_MAX)
    return ECS_EINVAL;
  if (os->nkeys)
    return ECS_EBUSY; /* the objects' lists depend on their owners' quotas */
  uint64_t *q = calloc((size_t)n + 1, sizeof *q), *b = calloc((size_t)n + 1, sizeof *b);
  uint64_t *hm = calloc((size_t)n + 1, sizeof *hm), *hb = calloc((size_t)n + 1, sizeof *hb);
  olist_t *ol = calloc((size_t)n + 1, sizeof *ol);
  if (!q || !b || !hm || !hb || !ol) {
    free(q);
    free(b);
    free(hm);
    free(hb);
    free(ol);
    return ECS_ENOMEM;
  }
  for (unsigned i = 0; i < n; i++)
    q[i + 1] = quota ? quota[i] : 0;
  free(os->owner_quota);
  free(os->owner_bytes);
  free(os->owner_hard_max);
  free(os->owner_hard);
  free(os->owned);
  os->owner_quota = q;
  os->owner_bytes = b;
  os->owner_hard_max = hm;
  os->owner_hard = hb;
  os->owned = ol;
  os->nowners = n;
  hard_shares(os);
  return ECS_OK;
}

void ecs_objstore_set_hard_max(ecs_objstore_t *os, uint64_t bytes) {
  uint64_t size = ecs_pool_size(os->pool);
  os->hard_max = bytes && bytes < size ? bytes : (bytes ? size : size / 2);
  if (os->nowners)
    hard_shares(os);
}

uint64_t ecs_objstore_owner_bytes(const ecs_objstore_t *os, uint16_t owner) {
  return owner && owner <= os->nowners ? os->owner_bytes[owner] : 0;
}

uint64_t ecs_objstore_hard_bytes(const ecs_objstore_t *os) {
  return os->hard_bytes;
}

int ecs_objstore_reserve_replace(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                                 ecs_obj_t **out) {
  return reserve(os, key, key_len, nbytes, ECS_RESERVE_REPLACE, 0, out);
}

/* A replacing commit drops the old version first, in the same call: there
 * is no moment at which neither (or both) can be acquired.  The old one may
 * already be gone (removed or evicted meanwhile); then this is a plain
 * commit. */
void ecs_objstore_commit(ecs_objstore_t *os, ecs_obj_t *obj) {
  assert(obj->state == ECS_OBJ_PENDING && obj->refs >= 1);
  if (obj->replace) {
    ecs_obj_t *old = table_find_state(os, obj->key, obj->key_len, ECS_OBJ_COMMITTED);
    if (old)
      drop(os, old, ECS_DROP_REPLACED);
    obj->replace = 0;
  }
  obj->state = ECS_OBJ_COMMITTED;
  obj->seq = os->next_seq++;
  if (!obj->commit_ms) /* a caller may stamp a whole batch with one time */
    obj->commit_ms = now_ms();
  if (obj->keep_until_ms)
    os->kept++;
  obj->refs--;
  list_add(os, obj);
  if (os->bg_stalled && obj->refs == 0)
    os->bg_active = 1; /* the stalled run resumes at its next call */
  os->st.pending--;
  os->st.objects++;
  os->st.bytes_live += obj->nbytes;
}

void ecs_objstore_abort(ecs_objstore_t *os, ecs_obj_t *obj) {
  assert(obj->state == ECS_OBJ_PENDING);
  table_unlink(os, obj);
  os->st.pending--;
  owner_sub(os, obj);
  obj_free(os, obj);
}

ecs_obj_t *ecs_objstore_acquire(ecs_objstore_t *os, const void *key, uint16_t key_len) {
  ecs_obj_t *o = ecs_objstore_find(os, key, key_len); /* the committed one first */
  if (!o || o->state != ECS_OBJ_COMMITTED)
    return NULL;
  if (o->refs++ == 0)
    list_of(os, o)->free_bytes -= granted(os, o->nbytes);
  return o;
}

void ecs_objstore_release(ecs_objstore_t *os, ecs_obj_t *obj) {
  /* A pending object's only reference is the writer's: commit or abort. */
  assert(obj->state != ECS_OBJ_PENDING && obj->refs > 0);
  if (--obj->refs == 0 && obj->state == ECS_OBJ_COMMITTED) {
    list_of(os, obj)->free_bytes += granted(os, obj->nbytes);
    if (os->bg_stalled)
      os->bg_active = 1; /* evictable now: the stalled run resumes at its next call */
  }
  if (obj->refs || obj->state != ECS_OBJ_DOOMED)
    return;
  doomed_unlink(os, obj);
  os->st.doomed--;
  obj_free(os, obj);
}

int ecs_objstore_remove(ecs_objstore_t *os, const void *key, uint16_t key_len) {
  ecs_obj_t *o = ecs_objstore_find(os, key, key_len);
  if (!o || o->state != ECS_OBJ_COMMITTED)
    return ECS_ENOTFOUND;
  drop(os, o, ECS_DROP_REMOVED);
  return ECS_OK;
}

/* One pool stats call per invocation, not per object: the bytes each
 * eviction gives back are known exactly (granted()), so the fill is
 * tracked from there.  The active flag is the hysteresis: once started
 * above high, later calls (bounded by max_objects) go on until low; the
 * stalled flag carries a run that ran out of victims until there is one. */
unsigned ecs_objstore_evict_background(ecs_objstore_t *os, unsigned max_objects) {
  ecs_pool_stats_t ps;
  ecs_pool_stats(os->pool, &ps);
  uint64_t in_use = ps.bytes_in_use;
  if (in_use > os->high_bytes)
    os->bg_active = 1;
  if (!os->bg_active)
    return 0;
  unsigned n = 0;
  scan_t sc;
  scan_init(os, &sc, 0, 1);
  while (in_use > os->low_bytes) {
    if (n == max_objects)
      return n; /* budget spent; stay active for the next call */
    ecs_obj_t *victim = next_victim(os, &sc);
    if (!victim) {
      /* The rest is referenced, or still being written (PENDING objects
       * are not in the FIFO yet).  Stop, and go on once a commit or a last
       * release makes something evictable: else a put that crossed high
       * while its bytes were being written would stay above low. */
      os->bg_active = 0;
      os->bg_stalled = 1;
      return n;
    }
    in_use -= drop(os, victim, ECS_DROP_EVICTED);
    n++;
  }
  os->bg_active = 0;
  os->bg_stalled = 0;
  return n;
}

void ecs_objstore_foreach(ecs_objstore_t *os, void (*fn)(void *ctx, const ecs_obj_t *obj), void *ctx) {
  olist_t *lists[3] = {&os->fifo, &os->soft, &os->hard};
  for (unsigned i = 0; i < 3 + os->nowners; i++)
    for (ecs_obj_t *o = (i < 3 ? lists[i] : &os->owned[i - 2])->head; o; o = o->fnext)
      fn(ctx, o);
}

void ecs_objstore_stats(ecs_objstore_t *os, ecs_objstore_stats_t *st) {
  *st = os->st;
}

/* Zero-byte objects hold no block; they get the pool's base, a valid
 * address to copy 0 bytes from (memcpy with NULL is undefined). */
void *ecs_objstore_data(ecs_objstore_t *os, const ecs_obj_t *obj) {
  if (!obj->nbytes)
    return ecs_pool_base(os->pool);
  return ecs_pool_ptr(os->pool, obj->off);
}
