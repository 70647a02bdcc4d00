/*
 * ecstore memory pool: one pinned host region and a buddy allocator over it.
 *
 * The region is a single contiguous memfd-backed mapping (so a co-located
 * process can map the same pages through the fd), populated up front and
 * mlock'd.  Allocations are exact-size: a request is rounded up to the
 * minimum block only, and the unused tail of the power-of-two block that
 * serves it goes back to the free lists (as Linux's alloc_pages_exact()
 * does), so one allocation wastes less than one minimum block.  The caller
 * frees with the same size it asked for.
 *
 * The pool knows nothing of keys or eviction: when it cannot serve a
 * request it returns ECS_ENOSPC (or ECS_ETOOBIG when no amount of freeing
 * could ever serve it) and the store decides what to evict.
 *
 * Offsets, not pointers, name blocks: offsets travel to other processes
 * (shared memory, RDMA) and to Redis.  ecs_pool_ptr() turns one into an
 * address in this process.
 *
 * Thread safety: every function may be called from any thread; alloc, free,
 * can_fit, stats and validate take the pool's internal lock.  create and
 * destroy must not race with anything else on the same pool.
 */
#ifndef ECSTORE_POOL_H
#define ECSTORE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/export.h"
#include "ecstore/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ECS_POOL_MAX_ORDERS 48

typedef struct ecs_pool ecs_pool_t;

typedef enum ecs_pool_huge {
  ECS_POOL_HUGE_OFF = 0,    /* normal pages */
  ECS_POOL_HUGE_TRY = 1,    /* huge pages when the system has them, else normal */
  ECS_POOL_HUGE_REQUIRE = 2 /* huge pages or ECS_ENOMEM */
} ecs_pool_huge_t;

typedef struct ecs_pool_opts {
  size_t size;          /* region bytes; rounded up to a multiple of min_block */
  size_t min_block;     /* smallest block, a power of two >= 4096 (default 4096) */
  ecs_pool_huge_t huge; /* huge pages policy (default OFF) */
  int lock;             /* 1: mlock the region (default); 0: don't try */
  int cuda_register;    /* 1: cudaHostRegister the region when libcudart loads */
  const char *name;     /* memfd name, for /proc/PID/fd (default "ecstore-pool") */
  /* Called from ecs_pool_create(), on its caller's thread, as the region
   * is faulted in (by one thread per CPU): after each chunk of a few hundred
   * MiB and at the end, with done increasing up to total.  Populating
   * gigabytes takes seconds, and a server says so.  NULL (the default): no
   * calls. */
  void (*on_populate)(void *ctx, size_t done, size_t total);
  void *populate_ctx; /* passed to on_populate */
} ecs_pool_opts_t;

typedef struct ecs_pool_stats {
  uint64_t size;                            /* region bytes managed by the allocator */
  uint64_t min_block;                       /* minimum block bytes */
  uint64_t bytes_in_use;                    /* bytes granted (multiples of min_block) */
  uint64_t bytes_free;                      /* size - bytes_in_use */
  uint64_t largest_free;                    /* largest single free block */
  uint64_t bytes_requested;                 /* sum of the sizes callers asked for, live */
  uint64_t bytes_granted;                   /* == bytes_in_use; kept for the ratio */
  uint64_t live_allocs;                     /* allocations not yet freed */
  uint64_t alloc_calls;                     /* successful allocations since create */
  uint64_t alloc_failures;                  /* ENOSPC/ETOOBIG answers since create */
  uint32_t orders;                          /* number of orders in free_count[] */
  uint32_t free_count[ECS_POOL_MAX_ORDERS]; /* free blocks of min_block << i */
  int locked;                               /* 1 when mlock succeeded (pages pinned) */
  int hugepages;                            /* 1 when backed by huge pages */
  int cuda_registered;                      /* 1 when cudaHostRegister succeeded */
} ecs_pool_stats_t;

/* Fills opts with the defaults (size 0 must still be set by the caller). */
ECS_API void ecs_pool_opts_init(ecs_pool_opts_t *opts);

/* Creates a pool.  On success *out owns the region; on failure *out is NULL.
 * When mlock is refused (RLIMIT_MEMLOCK), prints one warning on stderr and
 * goes on unpinned; stats.locked says which. */
ECS_API int ecs_pool_create(const ecs_pool_opts_t *opts, ecs_pool_t **out);

/* Unmaps and frees everything; accepts NULL.  Live blocks are dropped. */
ECS_API void ecs_pool_destroy(ecs_pool_t *pool);

/* Allocates size bytes.  On success *off is the block's offset, aligned to
 * min_block at least (and to the largest power of two <= its size, capped
 * by the power-of-two block it came from).  Errors: ECS_EINVAL (size 0),
 * ECS_ETOOBIG (larger than the region), ECS_ENOSPC (not now). */
ECS_API int ecs_pool_alloc(ecs_pool_t *pool, size_t size, uint64_t *off);

/* Frees the block at off, which must have been allocated with exactly
 * size.  Errors, all of which change nothing: ECS_EBADFREE (off was never
 * handed out, or is inside a block), ECS_EDOUBLEFREE (already free),
 * ECS_EBADSIZE (size differs from the allocation's). */
ECS_API int ecs_pool_free(ecs_pool_t *pool, uint64_t off, size_t size);

/* 1 when an allocation of size bytes would succeed now, else 0.  O(1). */
ECS_API int ecs_pool_can_fit(ecs_pool_t *pool, size_t size);

/* Address of offset off in this process (no bounds check beyond assert). */
ECS_API void *ecs_pool_ptr(const ecs_pool_t *pool, uint64_t off);

/* Base address, region size, and the memfd (owned by the pool; dup it to
 * keep it past destroy). */
ECS_API void *ecs_pool_base(const ecs_pool_t *pool);
ECS_API size_t ecs_pool_size(const ecs_pool_t *pool);
ECS_API int ecs_pool_fd(const ecs_pool_t *pool);

/* Snapshot of the counters above. */
ECS_API void ecs_pool_stats(ecs_pool_t *pool, ecs_pool_stats_t *st);

/* Walks every free list and the block map and checks every invariant.
 * Returns 0, or ECS_ECORRUPT after printing what is wrong on stderr. */
ECS_API int ecs_pool_validate(ecs_pool_t *pool);

#ifdef __cplusplus
}
#endif
#endif /* ECSTORE_POOL_H */
