/*
 * Buddy core over offsets: per-order free sets, split, coalesce, exact-size
 * trimming and the block map that lets free() refuse bad calls.  See
 * buddy.h for the layout; everything here works in min-block indices.
 */
#include "mempool/buddy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAP_FREE 0x80u  /* first block of a free block; low 6 bits: order */
#define MAP_ALLOC 0x40u /* first block of an allocation */
#define MAP_ORDER(e) ((unsigned)(e)&0x3fu)
#define NONE UINT64_MAX

static unsigned floor_log2(uint64_t n) {
  return 63u - (unsigned)__builtin_clzll(n);
}

static unsigned ceil_log2(uint64_t n) {
  return n <= 1 ? 0u : 64u - (unsigned)__builtin_clzll(n - 1);
}

static unsigned ctz64(uint64_t n) {
  return (unsigned)__builtin_ctzll(n);
}

/* ---- ordered bit set ---------------------------------------------------- */

static int bset_init(ecs__bset_t *s, uint64_t cap) {
  memset(s, 0, sizeof *s);
  s->cap = cap;
  uint64_t n = cap;
  while (n > 0) {
    if (s->nlv == ECS__BSET_MAXLV)
      return ECS_EINVAL;
    uint64_t words = (n + 63) / 64;
    s->w[s->nlv] = calloc(words, sizeof(uint64_t));
    if (!s->w[s->nlv])
      return ECS_ENOMEM;
    s->nwords[s->nlv++] = words;
    if (words == 1)
      break;
    n = words;
  }
  return 0;
}

static void bset_fini(ecs__bset_t *s) {
  for (unsigned i = 0; i < ECS__BSET_MAXLV; i++)
    free(s->w[i]);
  memset(s, 0, sizeof *s);
}

static int bset_has(const ecs__bset_t *s, uint64_t i) {
  return i < s->cap && (s->w[0][i >> 6] >> (i & 63)) & 1u;
}

static void bset_add(ecs__bset_t *s, uint64_t i) {
  for (unsigned lv = 0; lv < s->nlv; lv++) {
    uint64_t *word = &s->w[lv][i >> 6];
    uint64_t was = *word;
    *word = was | (1ull << (i & 63));
    if (was)
      return; /* the levels above already say this word is non-empty */
    i >>= 6;
  }
}

static void bset_del(ecs__bset_t *s, uint64_t i) {
  for (unsigned lv = 0; lv < s->nlv; lv++) {
    uint64_t *word = &s->w[lv][i >> 6];
    *word &= ~(1ull << (i & 63));
    if (*word)
      return;
    i >>= 6;
  }
}

/* Smallest element >= i, or NONE.  Climbs until a word has a bit at or
 * after the position, then descends by lowest set bits: O(levels). */
static uint64_t bset_next(const ecs__bset_t *s, uint64_t i) {
  if (i >= s->cap)
    return NONE;
  unsigned lv = 0;
  for (;;) {
    uint64_t wi = i >> 6;
    uint64_t m = s->w[lv][wi] & (~0ull << (i & 63));
    if (m) {
      i = (wi << 6) | ctz64(m);
      break;
    }
    if (lv + 1 == s->nlv)
      return NONE;
    i = wi + 1;
    lv++;
    if (i >= s->nwords[lv] * 64)
      return NONE;
  }
  while (lv > 0) {
    lv--;
    i = (i << 6) | ctz64(s->w[lv][i]);
  }
  return i;
}

/* Largest element, or NONE: highest set bits from the top level down. */
static uint64_t bset_last(const ecs__bset_t *s) {
  if (s->nlv == 0)
    return NONE;
  unsigned lv = s->nlv - 1;
  uint64_t i = 0;
  if (!s->w[lv][0])
    return NONE;
  for (;;) {
    i = (i << 6) | (63u - (unsigned)__builtin_clzll(s->w[lv][i]));
    if (lv == 0)
      return i;
    lv--;
  }
}

/* ---- runs (RUN placement) ----------------------------------------------- */

/* Adds the maximal free run [s, e) to the index. */
static void run_insert(ecs__buddy_t *b, uint64_t s, uint64_t e) {
  uint64_t len = e - s;
  b->run_end[s] = (uint32_t)e;
  b->run_start[e - 1] = (uint32_t)s;
  uint32_t head = b->len_head[len];
  b->run_prev[s] = ECS__RUN_NIL;
  b->run_next[s] = head;
  if (head != ECS__RUN_NIL)
    b->run_prev[head] = (uint32_t)s;
  else
    bset_add(&b->lens, len);
  b->len_head[len] = (uint32_t)s;
  if (len > b->max_run)
    b->max_run = len;
  b->nruns++;
}

/* Removes the run starting at s (which must be one) from the index. */
static void run_remove(ecs__buddy_t *b, uint64_t s) {
  uint64_t e = b->run_end[s], len = e - s;
  uint32_t next = b->run_next[s], prev = b->run_prev[s];
  if (prev != ECS__RUN_NIL)
    b->run_next[prev] = next;
  else
    b->len_head[len] = next;
  if (next != ECS__RUN_NIL)
    b->run_prev[next] = prev;
  if (b->len_head[len] == ECS__RUN_NIL) {
    bset_del(&b->lens, len);
    if (len == b->max_run) {
      uint64_t m = bset_last(&b->lens);
      b->max_run = m == NONE ? 0 : m;
    }
  }
  b->run_end[s] = 0;
  b->run_start[e - 1] = ECS__RUN_NIL;
  b->nruns--;
}

/* ---- free blocks ------------------------------------------------------- */

static void free_insert(ecs__buddy_t *b, uint64_t idx, unsigned j) {
  b->map[idx] = (uint8_t)(MAP_FREE | j);
  if (b->sets)
    bset_add(&b->free[j], idx >> j);
  b->nfree[j]++;
  b->nonempty |= 1ull << j;
}

static void free_remove(ecs__buddy_t *b, uint64_t idx, unsigned j) {
  b->map[idx] = 0;
  if (b->sets)
    bset_del(&b->free[j], idx >> j);
  if (--b->nfree[j] == 0)
    b->nonempty &= ~(1ull << j);
}

/* Frees the aligned block (idx, order j) and merges it with its buddy for as
 * long as the buddy is a free block of the same order inside the region. */
static void free_coalesce(ecs__buddy_t *b, uint64_t idx, unsigned j) {
  while (j < b->top) {
    uint64_t buddy = idx ^ (1ull << j);
    if (buddy + (1ull << j) > b->nblocks || b->map[buddy] != (MAP_FREE | j))
      break;
    free_remove(b, buddy, j);
    idx &= ~(1ull << j);
    j++;
  }
  free_insert(b, idx, j);
}

/* The free block containing block idx, if any: free blocks are aligned to
 * their order, so only one candidate head per order.  O(top). */
static int free_containing(const ecs__buddy_t *b, uint64_t idx, uint64_t *head, unsigned *order) {
  for (unsigned j = 0; j <= b->top; j++) {
    uint64_t h = idx & ~((1ull << j) - 1);
    if (b->map[h] == (MAP_FREE | j)) {
      *head = h;
      *order = j;
      return 1;
    }
  }
  return 0;
}

/* Frees [idx, end) as aligned power-of-two chunks.  idx and end come from
 * one allocation inside a block of order k aligned to 2^k, so the chunks are
 * whole buddy-system blocks. */
static void free_range(ecs__buddy_t *b, uint64_t idx, uint64_t end) {
  while (idx < end) {
    unsigned j = floor_log2(end - idx);
    if (idx && ctz64(idx) < j)
      j = ctz64(idx);
    free_coalesce(b, idx, j);
    idx += 1ull << j;
  }
}

/* ---- init --------------------------------------------------------------- */

int ecs__buddy_init(ecs__buddy_t *b, uint64_t size, uint64_t min_block) {
  memset(b, 0, sizeof *b);
  if (min_block < 4096 || (min_block & (min_block - 1)) || size == 0 || size % min_block)
    return ECS_EINVAL;
  b->shift = floor_log2(min_block);
  b->nblocks = size >> b->shift;
  b->size = size;
  b->top = floor_log2(b->nblocks);
  if (b->top >= ECS_POOL_MAX_ORDERS)
    return ECS_ETOOBIG;
  if (b->nblocks >= ECS__RUN_NIL)
    return ECS_ETOOBIG;
  b->policy = ECS__BUDDY_RUN;
  int rc = ECS_ENOMEM;
  b->map = calloc(b->nblocks, 1);
  b->req = calloc(b->nblocks, sizeof *b->req);
  b->run_end = calloc(b->nblocks, sizeof *b->run_end);
  b->run_start = malloc(b->nblocks * sizeof *b->run_start);
  b->run_next = malloc(b->nblocks * sizeof *b->run_next);
  b->run_prev = malloc(b->nblocks * sizeof *b->run_prev);
  b->len_head = malloc((b->nblocks + 1) * sizeof *b->len_head);
  if (!b->map || !b->req || !b->run_end || !b->run_start || !b->run_next || !b->run_prev || !b->len_head)
    goto out_fini;
  memset(b->run_start, 0xff, b->nblocks * sizeof *b->run_start);
  memset(b->len_head, 0xff, (b->nblocks + 1) * sizeof *b->len_head);
  for (unsigned j = 0; j <= b->top; j++)
    if ((rc = bset_init(&b->free[j], b->nblocks >> j)) != 0)
      goto out_fini;
  if ((rc = bset_init(&b->lens, b->nblocks + 1)) != 0)
    goto out_fini;
  run_insert(b, 0, b->nblocks);
  /* Largest first from 0: each block is then aligned to its own size.  The
   * free sets get this first state, which is what set_policy() finds
   * whenever it may change the policy (before the first allocation). */
  b->sets = 1;
  for (uint64_t idx = 0; idx < b->nblocks;) {
    unsigned j = floor_log2(b->nblocks - idx);
    free_insert(b, idx, j);
    idx += 1ull << j;
  }
  b->sets = 0; /* RUN finds blocks through the map and the run index */
  return 0;
out_fini:
  ecs__buddy_fini(b);
  return rc;
}

void ecs__buddy_fini(ecs__buddy_t *b) {
  if (!b)
    return;
  for (unsigned j = 0; j < ECS_POOL_MAX_ORDERS; j++)
    bset_fini(&b->free[j]);
  bset_fini(&b->lens);
  free(b->map);
  free(b->req);
  free(b->run_end);
  free(b->run_start);
  free(b->run_next);
  free(b->run_prev);
  free(b->len_head);
  memset(b, 0, sizeof *b);
}

int ecs__buddy_set_policy(ecs__buddy_t *b, ecs__buddy_policy_t policy) {
  if (b->alloc_calls)
    return ECS_EBUSY;
  b->policy = policy;
  b->sets = policy != ECS__BUDDY_RUN;
  return 0;
}

/* ---- alloc -------------------------------------------------------------- */

static uint64_t blocks_for(const ecs__buddy_t *b, uint64_t size) {
  return (size >> b->shift) + ((size & ((1ull << b->shift) - 1)) != 0);
}

uint64_t ecs__buddy_granted(const ecs__buddy_t *b, uint64_t size) {
  return blocks_for(b, size) << b->shift;
}

uint64_t ecs__buddy_largest_free(const ecs__buddy_t *b) {
  return b->nonempty ? (1ull << floor_log2(b->nonempty)) << b->shift : 0;
}

int ecs__buddy_can_fit(const ecs__buddy_t *b, uint64_t size) {
  if (size == 0 || size > b->size)
    return 0;
  if (b->policy == ECS__BUDDY_RUN)
    return blocks_for(b, size) <= b->max_run;
  unsigned k = ceil_log2(blocks_for(b, size));
  return k <= b->top && (b->nonempty >> k) != 0;
}

/* Lowest-addressed free block of order >= k whose start is >= from (in
 * blocks).  O(orders * levels). */
static uint64_t first_free_from(const ecs__buddy_t *b, unsigned k, uint64_t from, unsigned *order) {
  uint64_t best = NONE;
  for (unsigned j = k; j <= b->top; j++) {
    if (!(b->nonempty >> j & 1))
      continue;
    uint64_t p = bset_next(&b->free[j], (from + (1ull << j) - 1) >> j);
    if (p != NONE && (p << j) < best) {
      best = p << j;
      *order = j;
    }
  }
  return best;
}

/* Picks where an order-k block goes: *parent and *porder name the free block it
 * is carved from, the return value its index (aligned to 2^k). */
static uint64_t place(ecs__buddy_t *b, unsigned k, uint64_t *parent, unsigned *porder) {
  if (b->policy == ECS__BUDDY_BEST_FIT) {
    unsigned j = ctz64(b->nonempty >> k << k);
    *parent = bset_next(&b->free[j], 0) << j;
    *porder = j;
    return *parent;
  }
  if (b->policy == ECS__BUDDY_FIRST_FIT) {
    *parent = first_free_from(b, k, 0, porder);
    return *parent;
  }
  /* NEXT_FIT: the free block under the cursor may hold an aligned order-k
   * block after it; otherwise the first block at or after it; else wrap. */
  uint64_t c = b->cursor, h, best = NONE;
  unsigned j = 0; /* set by every path that uses it; -O3 cannot see that */
  if (c < b->nblocks && free_containing(b, c, &h, &j) && j >= k) {
    uint64_t p = (c + (1ull << k) - 1) & ~((1ull << k) - 1);
    if (p + (1ull << k) <= h + (1ull << j)) {
      best = p;
      *parent = h;
      *porder = j;
    }
  }
  uint64_t q = first_free_from(b, k, c, &j);
  if (q < best) {
    best = q;
    *parent = q;
    *porder = j;
  }
  if (best == NONE)
    best = *parent = first_free_from(b, k, 0, porder);
  return best;
}

/* RUN: takes n blocks from the start of the shortest run that holds them.
 * The run is tiled by whole free blocks (free space is fully merged, so
 * any aligned, entirely free block is one free block): remove those the
 * allocation covers, and give back the tail of the last one. */
static uint64_t alloc_run(ecs__buddy_t *b, uint64_t n) {
  uint64_t len = bset_next(&b->lens, n);
  uint64_t s = b->len_head[len], e = b->run_end[s];
  run_remove(b, s);
  if (s + n < e)
    run_insert(b, s + n, e);
  for (uint64_t x = s; x < s + n;) {
    unsigned j = MAP_ORDER(b->map[x]);
    free_remove(b, x, j);
    if (x + (1ull << j) > s + n)
      free_range(b, s + n, x + (1ull << j));
    x += 1ull << j;
  }
  return s;
}

/* Block policies: an order-k block at p, carved out of the free block
 * (h, j) that place() picked, keeping the first n blocks. */
static uint64_t alloc_block(ecs__buddy_t *b, uint64_t n, unsigned k) {
  uint64_t h, p;
  unsigned j;
  p = place(b, k, &h, &j);
  /* Split the parent down to order k around p; the halves not holding p
   * go back whole (their buddies are in use, so no merge to try). */
  free_remove(b, h, j);
  while (j > k) {
    j--;
    uint64_t half = 1ull << j;
    if (p < h + half) {
      free_insert(b, h + half, j);
    } else {
      free_insert(b, h, j);
      h += half;
    }
  }
  free_range(b, p + n, p + (1ull << k));
  return p;
}

int ecs__buddy_alloc(ecs__buddy_t *b, uint64_t size, uint64_t *off) {
  if (size == 0)
    return ECS_EINVAL;
  uint64_t n = size > b->size ? 0 : blocks_for(b, size);
  unsigned k = n ? ceil_log2(n) : 0;
  int run = b->policy == ECS__BUDDY_RUN;
  if (n == 0 || (!run && k > b->top)) {
    b->alloc_failures++;
    return ECS_ETOOBIG;
  }
  if (run ? n > b->max_run : (b->nonempty >> k) == 0) {
    b->alloc_failures++;
    return ECS_ENOSPC;
  }
  uint64_t p = run ? alloc_run(b, n) : alloc_block(b, n, k);
  b->map[p] = MAP_ALLOC;
  b->req[p] = size;
  b->used_blocks += n;
  b->bytes_requested += size;
  b->live_allocs++;
  b->alloc_calls++;
  b->cursor = p + n < b->nblocks ? p + n : 0;
  *off = p << b->shift;
  return 0;
}

/* ---- free --------------------------------------------------------------- */

int ecs__buddy_free(ecs__buddy_t *b, uint64_t off, uint64_t size) {
  if (size == 0)
    return ECS_EINVAL;
  if (off >= b->size || (off & ((1ull << b->shift) - 1)))
    return ECS_EBADFREE;
  uint64_t idx = off >> b->shift, h;
  unsigned j;
  if (b->map[idx] != MAP_ALLOC) {
    /* Free space where a live allocation once started: a second free.
     * Anything else (inside an allocation, never a head) is a bad free. */
    if (b->req[idx] && free_containing(b, idx, &h, &j))
      return ECS_EDOUBLEFREE;
    return ECS_EBADFREE;
  }
  if (b->req[idx] != size)
    return ECS_EBADSIZE;
  uint64_t n = blocks_for(b, size);
  b->map[idx] = 0;
  free_range(b, idx, idx + n);
  if (b->policy == ECS__BUDDY_RUN) {
    /* Join the runs that end right before and start right after. */
    uint64_t s = idx, e = idx + n;
    if (s > 0 && b->run_start[s - 1] != ECS__RUN_NIL) {
      s = b->run_start[s - 1];
      run_remove(b, s);
    }
    if (e < b->nblocks && b->run_end[e] != 0) {
      uint64_t e2 = b->run_end[e];
      run_remove(b, e);
      e = e2;
    }
    run_insert(b, s, e);
  }
  b->used_blocks -= n;
  b->bytes_requested -= size;
  b->live_allocs--;
  return 0;
}

/* ---- validator ---------------------------------------------------------- */

#define BAD(...)                                                                                             \
  do {                                                                                                       \
    snprintf(why, cap, __VA_ARGS__);                                                                         \
    return ECS_ECORRUPT;                                                                                     \
  } while (0)

/* Walks the map head to head: every block belongs to exactly one free block
 * or allocation, free blocks are aligned, in bounds, in their set and not
 * mergeable with a free buddy; allocations sit at the start of an aligned
 * block of their order. */
static int validate_map(const ecs__buddy_t *b, char *why, size_t cap, uint64_t nfree[], uint64_t *used,
                        uint64_t *live, uint64_t *req) {
  for (uint64_t idx = 0; idx < b->nblocks;) {
    uint8_t e = b->map[idx];
    uint64_t len;
    if (e & MAP_FREE) {
      unsigned j = MAP_ORDER(e);
      len = 1ull << j;
      if (j > b->top || (idx & (len - 1)) || idx + len > b->nblocks)
        BAD("free block at %llu order %u misaligned or out of bounds", (unsigned long long)idx, j);
      if (b->sets && !bset_has(&b->free[j], idx >> j))
        BAD("free block at %llu order %u missing from its free set", (unsigned long long)idx, j);
      uint64_t buddy = idx ^ len;
      if (j < b->top && buddy + len <= b->nblocks && b->map[buddy] == (MAP_FREE | j))
        BAD("free buddies at %llu and %llu order %u not merged", (unsigned long long)idx,
            (unsigned long long)buddy, j);
      nfree[j]++;
    } else if (e == MAP_ALLOC) {
      uint64_t r = b->req[idx];
      len = blocks_for(b, r);
      if (r == 0 || idx + len > b->nblocks)
        BAD("allocation at %llu of %llu bytes out of bounds", (unsigned long long)idx, (unsigned long long)r);
      if (b->policy != ECS__BUDDY_RUN && (idx & ((1ull << ceil_log2(len)) - 1)))
        BAD("allocation at %llu of %llu blocks misaligned", (unsigned long long)idx, (unsigned long long)len);
      *used += len;
      *req += r;
      (*live)++;
    } else {
      BAD("block %llu is neither free nor allocated (map 0x%02x)", (unsigned long long)idx, e);
    }
    for (uint64_t i = idx + 1; i < idx + len; i++)
      if (b->map[i])
        BAD("block %llu inside the block at %llu has map 0x%02x (overlap)", (unsigned long long)i,
            (unsigned long long)idx, b->map[i]);
    idx += len;
  }
  return 0;
}

/* Walks every free set (and its summary levels) against the map. */
static int validate_sets(const ecs__buddy_t *b, char *why, size_t cap) {
  for (unsigned j = 0; j < ECS_POOL_MAX_ORDERS; j++) {
    const ecs__bset_t *s = &b->free[j];
    uint64_t count = 0;
    for (uint64_t p = bset_next(s, 0); j <= b->top && p != NONE; p = bset_next(s, p + 1)) {
      if (b->map[p << j] != (MAP_FREE | j))
        BAD("free set %u names block %llu, which the map says is 0x%02x", j, (unsigned long long)(p << j),
            b->map[p << j]);
      count++;
    }
    if (count != b->nfree[j] || (count != 0) != ((b->nonempty >> j) & 1))
      BAD("order %u: set holds %llu, counter %llu, mask bit %u", j, (unsigned long long)count,
          (unsigned long long)b->nfree[j], (unsigned)((b->nonempty >> j) & 1));
    for (unsigned lv = 1; lv < s->nlv; lv++)
      for (uint64_t w = 0; w < s->nwords[lv - 1]; w++)
        if (((s->w[lv][w >> 6] >> (w & 63)) & 1) != (s->w[lv - 1][w] != 0))
          BAD("order %u: summary level %u disagrees at word %llu", j, lv, (unsigned long long)w);
  }
  return 0;
}

/* RUN: the maximal runs of free blocks in the map are exactly the indexed
 * ones: tags at both ends and nowhere else, each in its length's list, the
 * length set and max_run right. */
static int validate_runs(const ecs__buddy_t *b, char *why, size_t cap) {
  uint64_t runs = 0, maxlen = 0;
  for (uint64_t idx = 0; idx < b->nblocks;) {
    if (!(b->map[idx] & MAP_FREE)) {
      idx += blocks_for(b, b->req[idx]);
      continue;
    }
    uint64_t s = idx;
    while (idx < b->nblocks && (b->map[idx] & MAP_FREE))
      idx += 1ull << MAP_ORDER(b->map[idx]);
    if (b->run_end[s] != idx || b->run_start[idx - 1] != s)
      BAD("run [%llu,%llu) has tags %u/%u", (unsigned long long)s, (unsigned long long)idx, b->run_end[s],
          b->run_start[idx - 1]);
    runs++;
    maxlen = idx - s > maxlen ? idx - s : maxlen;
  }
  uint64_t listed = 0, tags = 0;
  for (uint64_t len = bset_next(&b->lens, 0); len != NONE; len = bset_next(&b->lens, len + 1)) {
    if (b->len_head[len] == ECS__RUN_NIL)
      BAD("run length %llu in the set with an empty list", (unsigned long long)len);
    for (uint32_t r = b->len_head[len], prev = ECS__RUN_NIL; r != ECS__RUN_NIL;
         prev = r, r = b->run_next[r]) {
      if (b->run_prev[r] != prev || b->run_end[r] != r + len || !(b->map[r] & MAP_FREE))
        BAD("run list of length %llu is broken at %u", (unsigned long long)len, r);
      if (++listed > runs)
        BAD("run lists hold more runs than the map has (%llu)", (unsigned long long)runs);
    }
  }
  for (uint64_t i = 0; i < b->nblocks; i++)
    tags += (b->run_end[i] != 0) + (b->run_start[i] != ECS__RUN_NIL);
  for (uint64_t len = 0; len <= b->nblocks; len++)
    if ((b->len_head[len] != ECS__RUN_NIL) != bset_has(&b->lens, len))
      BAD("run length %llu: list and set disagree", (unsigned long long)len);
  if (listed != runs || b->nruns != runs || tags != 2 * runs || b->max_run != maxlen)
    BAD("runs: map %llu, listed %llu, counter %llu, tags %llu, max %llu/%llu", (unsigned long long)runs,
        (unsigned long long)listed, (unsigned long long)b->nruns, (unsigned long long)tags,
        (unsigned long long)maxlen, (unsigned long long)b->max_run);
  return 0;
}

int ecs__buddy_validate(const ecs__buddy_t *b, char *why, size_t cap) {
  uint64_t nfree[ECS_POOL_MAX_ORDERS] = {0}, used = 0, live = 0, req = 0, freeb = 0;
  int rc = validate_map(b, why, cap, nfree, &used, &live, &req);
  if (rc == 0 && b->sets)
    rc = validate_sets(b, why, cap);
  if (rc == 0 && b->policy == ECS__BUDDY_RUN)
    rc = validate_runs(b, why, cap);
  if (rc)
    return rc;
  for (unsigned j = 0; j < ECS_POOL_MAX_ORDERS; j++) {
    if (nfree[j] != b->nfree[j])
      BAD("order %u: map has %llu free blocks, counter %llu", j, (unsigned long long)nfree[j],
          (unsigned long long)b->nfree[j]);
    if ((nfree[j] != 0) != ((b->nonempty >> j) & 1)) /* validate_sets checks it too, when the sets are kept */
      BAD("order %u: %llu free blocks, mask bit %u", j, (unsigned long long)nfree[j],
          (unsigned)((b->nonempty >> j) & 1));
    freeb += nfree[j] << j;
  }
  if (used != b->used_blocks || live != b->live_allocs || req != b->bytes_requested)
    BAD("counters: used %llu/%llu live %llu/%llu requested %llu/%llu (map/counter)", (unsigned long long)used,
        (unsigned long long)b->used_blocks, (unsigned long long)live, (unsigned long long)b->live_allocs,
        (unsigned long long)req, (unsigned long long)b->bytes_requested);
  if (used + freeb != b->nblocks)
    BAD("used %llu + free %llu != %llu blocks", (unsigned long long)used, (unsigned long long)freeb,
        (unsigned long long)b->nblocks);
  return 0;
}
