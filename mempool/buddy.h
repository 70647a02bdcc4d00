/*
 * Buddy core: exact-size blocks over byte offsets [0, size), no memory.
 *
 * This layer only does arithmetic on offsets; it never touches the region
 * (the pool does, for ASan poisoning), so it can be tested and benchmarked
 * without a mapping.  It is not thread-safe: the pool serialises every call
 * with its mutex.
 *
 * Orders: a block of order j is (min_block << j) bytes and starts at a
 * multiple of its own size.  The region need not be a power of two: it is
 * covered by the binary decomposition of its size in min blocks, largest
 * blocks first from offset 0 (so each is aligned), and a block never merges
 * with a "buddy" that would reach past the end.
 *
 * Free lists: one ordered set of free-block positions per order, kept as a
 * 64-ary summary bitmap (mimalloc/Linux keep linked lists; an ordered set
 * costs the same O(log n) per insert/remove and also answers "the first
 * free block of order j at or after offset x", which the placement policies
 * below need).  A bitmask of non-empty orders makes can_fit O(1).  Only
 * the block placements read the sets, so under RUN (the default) they are
 * not kept: RUN finds its blocks through the map and the run index, and the
 * set updates (a cache line or more each, several per operation) were
 * about 45% of an alloc+free.  The per-order counts and the mask are kept
 * under every policy.
 *
 * Exact size (Linux alloc_pages_exact()): a request of n min blocks takes a
 * free block of order k = ceil(log2 n), keeps its first n blocks and gives
 * the unused tail back as aligned power-of-two blocks; a free takes the exact
 * size back and frees it as aligned power-of-two chunks, each coalescing
 * with its buddies.  One allocation wastes less than one min block.
 *
 * Runs (the default placement, ECS__BUDDY_RUN): needing a whole free block
 * of order ceil(log2 n) strands free space.  On the store's FIFO workload
 * (objects 0.25..16 MiB) no placement among such blocks keeps more than
 * ~72% of the pool live: most objects need an aligned, entirely free window
 * of twice their size on average.  So the buddy also indexes its free space
 * as maximal runs of consecutive free blocks (boundary tags at both ends, a
 * list per run length, an ordered set of the lengths present), and RUN
 * places a request at the start of the shortest run that holds it.  That
 * start is the head of a free block of some order j, so the allocation is
 * aligned to 2^j (the "capped by the block it came from" of pool.h); it is
 * made of at most 2*log2(n) whole free blocks plus the head of one more,
 * whose tail goes back exactly as above.  The buddy blocks, the XOR merge
 * and the map stay the representation; runs are an index over them.
 *
 * Block map: one byte per min block.  It is zero except at the first block
 * of a free block (FREE | order) or of an allocation (ALLOC); a side array
 * holds each allocation's requested bytes (kept after the free, so a free of
 * a freed head is told apart from a free of an offset never handed out).
 * free() checks the map before changing anything.
 */
#ifndef ECS_MEMPOOL_BUDDY_H
#define ECS_MEMPOOL_BUDDY_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/pool.h"

#define ECS__BSET_MAXLV 12

/* An ordered set of integers in [0, cap): level 0 has one bit per element,
 * level i+1 one bit per non-zero word of level i. */
typedef struct ecs__bset {
  uint64_t cap;                     /* elements are < cap */
  unsigned nlv;                     /* levels in use (0 when cap == 0) */
  uint64_t nwords[ECS__BSET_MAXLV]; /* words per level */
  uint64_t *w[ECS__BSET_MAXLV];     /* the bit words of each level */
} ecs__bset_t;

/* Where an allocation is placed among the free blocks that could serve it. */
typedef enum ecs__buddy_policy {
  /* Smallest non-empty order >= k, lowest address in it (classic buddy). */
  ECS__BUDDY_BEST_FIT = 0,
  /* Lowest-addressed free block of any order >= k. */
  ECS__BUDDY_FIRST_FIT = 1,
  /* The first aligned place at or after the end of the previous allocation
   * (wrapping), carving it out of a larger block if need be. */
  ECS__BUDDY_NEXT_FIT = 2,
  /* Start of the shortest free run of >= n blocks (see Runs).  Default. */
  ECS__BUDDY_RUN = 3
} ecs__buddy_policy_t;

#define ECS__RUN_NIL UINT32_MAX

typedef struct ecs__buddy {
  uint64_t size;                         /* managed bytes: nblocks << shift */
  uint64_t nblocks;                      /* min blocks in the region */
  unsigned shift;                        /* log2(min_block) */
  unsigned top;                          /* largest order present: floor(log2(nblocks)) */
  ecs__buddy_policy_t policy;            /* placement, see above */
  uint64_t cursor;                       /* NEXT_FIT: block index after the last allocation */
  uint32_t *run_end;                     /* RUN: at a run's first block, its end; else 0 */
  uint32_t *run_start;                   /* RUN: at a run's last block, its start; else NIL */
  uint32_t *run_next, *run_prev;         /* RUN: list of runs of one length, at run starts */
  uint32_t *len_head;                    /* RUN: first run of each length 1..nblocks, or NIL */
  ecs__bset_t lens;                      /* RUN: run lengths present */
  uint64_t max_run;                      /* RUN: longest run (0 when full) */
  uint64_t nruns;                        /* RUN: number of runs */
  uint8_t *map;                          /* per min block: 0, FREE|order or ALLOC */
  uint64_t *req;                         /* per min block: requested bytes of the allocation there */
  int sets;                              /* 1: free[] kept up to date (block policies only) */
  ecs__bset_t free[ECS_POOL_MAX_ORDERS]; /* free-block positions (index >> j) per order */
  uint64_t nfree[ECS_POOL_MAX_ORDERS];   /* number of free blocks per order */
  uint64_t nonempty;                     /* bit j set when nfree[j] > 0 */
  uint64_t used_blocks;                  /* min blocks granted to live allocations */
  uint64_t bytes_requested;              /* sum of live requested bytes */
  uint64_t live_allocs;                  /* live allocations */
  uint64_t alloc_calls;                  /* successful allocations */
  uint64_t alloc_failures;               /* ENOSPC / ETOOBIG answers */
} ecs__buddy_t;

/* Sets up a buddy over size bytes (a multiple of min_block, a power of two
 * >= 4096, at most 2^32 - 2 min blocks) with everything free and the RUN
 * placement.  0, ECS_EINVAL, ECS_ETOOBIG or ECS_ENOMEM; on error *b holds
 * nothing to release. */
int ecs__buddy_init(ecs__buddy_t *b, uint64_t size, uint64_t min_block);

/* Releases the metadata; accepts a zeroed or already released buddy. */
void ecs__buddy_fini(ecs__buddy_t *b);

/* Changes the placement policy (tests and benchmarks compare them); only
 * before the first allocation (the run index is kept under RUN only).
 * 0 or ECS_EBUSY. */
int ecs__buddy_set_policy(ecs__buddy_t *b, ecs__buddy_policy_t policy);

/* Allocates size bytes.  Under RUN *off is the head of a free block of
 * order j (so aligned to 2^j blocks); under the other policies it is
 * aligned to its order ceil(log2(blocks)).  ECS_EINVAL (0), ECS_ETOOBIG
 * (no amount of freeing could serve it), ECS_ENOSPC (not now). */
int ecs__buddy_alloc(ecs__buddy_t *b, uint64_t size, uint64_t *off);

/* Frees exactly what alloc gave for size.  ECS_EINVAL (size 0),
 * ECS_EBADFREE, ECS_EDOUBLEFREE, ECS_EBADSIZE; errors change nothing. */
int ecs__buddy_free(ecs__buddy_t *b, uint64_t off, uint64_t size);

/* 1 when alloc(size) would succeed now, else 0.  O(1). */
int ecs__buddy_can_fit(const ecs__buddy_t *b, uint64_t size);

/* Bytes actually granted for a request of size bytes (min-block multiple). */
uint64_t ecs__buddy_granted(const ecs__buddy_t *b, uint64_t size);

/* Largest free block in bytes (0 when full). */
uint64_t ecs__buddy_largest_free(const ecs__buddy_t *b);

/* Checks every invariant (map, free sets, counters).  0, or ECS_ECORRUPT
 * with a description of the first violation in why[cap]. */
int ecs__buddy_validate(const ecs__buddy_t *b, char *why, size_t cap);

#endif
