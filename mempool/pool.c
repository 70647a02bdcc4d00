/*
 * The public pool API: a region (region.c) and a buddy core (buddy.c)
 * behind one lock.  This file owns the locking, the ASan poisoning of free
 * bytes and the debug-build validation after every operation.
 *
 * The lock is lock.c's (backoff, then a futex), not a pthread mutex: see
 * lock.h for why; the critical sections here stay as short as they were.
 */
#include "ecstore/pool.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mempool/buddy.h"
#include "mempool/lock.h"
#include "mempool/region.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* Free bytes are poisoned in this process's shadow only: other processes
 * that map the memfd see plain memory, and that is fine. */
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct ecs_pool {
  ecs__region_t region; /* the mapping and its fd */
  ecs__buddy_t buddy;   /* who owns which offsets */
  ecs__lock_t lock;     /* guards buddy */
};

void ecs_pool_opts_init(ecs_pool_opts_t *opts) {
  memset(opts, 0, sizeof *opts);
  opts->min_block = 4096;
  opts->huge = ECS_POOL_HUGE_OFF;
  opts->lock = 1;
  opts->cuda_register = 0;
  opts->name = "ecstore-pool";
}

/* In debug builds (ECS_DEBUG) every alloc and free ends with a full check;
 * a broken invariant aborts right where it was broken. */
static void debug_check(ecs_pool_t *pool) {
#ifdef ECS_DEBUG
  char why[256];
  if (ecs__buddy_validate(&pool->buddy, why, sizeof why) != 0) {
    fprintf(stderr, "ecstore: pool invariant violated: %s\n", why);
    abort();
  }
#else
  (void)pool;
#endif
}

int ecs_pool_create(const ecs_pool_opts_t *opts, ecs_pool_t **out) {
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!opts || opts->size == 0 || (unsigned)opts->huge > ECS_POOL_HUGE_REQUIRE)
    return ECS_EINVAL;
  size_t mb = opts->min_block ? opts->min_block : 4096;
  if (mb < 4096 || (mb & (mb - 1)) || opts->size > SIZE_MAX - mb)
    return ECS_EINVAL;
  size_t size = (opts->size + mb - 1) / mb * mb;
  ecs_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool)
    return ECS_ENOMEM;
  int rc = ecs__buddy_init(&pool->buddy, size, mb);
  if (rc)
    goto out_free;
  rc = ecs__region_map(&pool->region, size, opts->huge, opts->lock, opts->cuda_register,
                       opts->name ? opts->name : "ecstore-pool", opts);
  if (rc)
    goto out_buddy;
  ecs__lock_init(&pool->lock);
  POISON(pool->region.base, size);
  *out = pool;
  return 0;
out_buddy:
  ecs__buddy_fini(&pool->buddy);
out_free:
  free(pool);
  return rc;
}

void ecs_pool_destroy(ecs_pool_t *pool) {
  if (!pool)
    return;
  UNPOISON(pool->region.base, pool->region.map_len);
  ecs__region_unmap(&pool->region);
  ecs__buddy_fini(&pool->buddy);
  free(pool);
}

int ecs_pool_alloc(ecs_pool_t *pool, size_t size, uint64_t *off) {
  if (!pool || !off)
    return ECS_EINVAL;
  ecs__lock_acquire(&pool->lock);
  int rc = ecs__buddy_alloc(&pool->buddy, size, off);
  if (rc == 0)
    UNPOISON((char *)pool->region.base + *off, size);
  debug_check(pool);
  ecs__lock_release(&pool->lock);
  return rc;
}

int ecs_pool_free(ecs_pool_t *pool, uint64_t off, size_t size) {
  if (!pool)
    return ECS_EINVAL;
  ecs__lock_acquire(&pool->lock);
  int rc = ecs__buddy_free(&pool->buddy, off, size);
  if (rc == 0)
    POISON((char *)pool->region.base + off, ecs__buddy_granted(&pool->buddy, size));
  debug_check(pool);
  ecs__lock_release(&pool->lock);
  return rc;
}

int ecs_pool_can_fit(ecs_pool_t *pool, size_t size) {
  if (!pool)
    return 0;
  ecs__lock_acquire(&pool->lock);
  int fit = ecs__buddy_can_fit(&pool->buddy, size);
  ecs__lock_release(&pool->lock);
  return fit;
}

void *ecs_pool_ptr(const ecs_pool_t *pool, uint64_t off) {
  assert(off < pool->buddy.size);
  return (char *)pool->region.base + off;
}

void *ecs_pool_base(const ecs_pool_t *pool) {
  return pool->region.base;
}

size_t ecs_pool_size(const ecs_pool_t *pool) {
  return (size_t)pool->buddy.size;
}

int ecs_pool_fd(const ecs_pool_t *pool) {
  return pool->region.fd;
}

void ecs_pool_stats(ecs_pool_t *pool, ecs_pool_stats_t *st) {
  memset(st, 0, sizeof *st);
  ecs__lock_acquire(&pool->lock);
  const ecs__buddy_t *b = &pool->buddy;
  st->size = b->size;
  st->min_block = 1ull << b->shift;
  st->bytes_in_use = b->used_blocks << b->shift;
  st->bytes_free = b->size - st->bytes_in_use;
  st->largest_free = ecs__buddy_largest_free(b);
  st->bytes_requested = b->bytes_requested;
  st->bytes_granted = st->bytes_in_use;
  st->live_allocs = b->live_allocs;
  st->alloc_calls = b->alloc_calls;
  st->alloc_failures = b->alloc_failures;
  st->orders = b->top + 1;
  for (unsigned j = 0; j <= b->top; j++)
    st->free_count[j] = b->nfree[j] > UINT32_MAX ? UINT32_MAX : (uint32_t)b->nfree[j];
  ecs__lock_release(&pool->lock);
  st->locked = pool->region.locked;
  st->hugepages = pool->region.hugepages;
  st->cuda_registered = pool->region.cuda_registered;
}

int ecs_pool_validate(ecs_pool_t *pool) {
  char why[256];
  ecs__lock_acquire(&pool->lock);
  int rc = ecs__buddy_validate(&pool->buddy, why, sizeof why);
  ecs__lock_release(&pool->lock);
  if (rc)
    fprintf(stderr, "ecstore: pool invariant violated: %s\n", why);
  return rc;
}
