/*
 * Checksums computed piece by piece (not installed).
 *
 * ecs_checksum (include/ecstore/tensor.h) hashes a whole buffer in one
 * pass.  A get that lands a large object in the caller's buffer and then
 * hashes it reads every byte back from DRAM; hashing each slice while it
 * is still in cache saves that second trip.  These give the same value as
 * ecs_checksum over the concatenation of the pieces.
 */
#ifndef ECS_CHECKSUM_H
#define ECS_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* How much is copied or received before it is hashed: small enough to
 * stay in L2, large enough that the per-slice cost vanishes. */
#define ECS_SUM_SLICE ((size_t)256 << 10)

typedef struct XXH3_state_s ecs_sum_t; /* a running XXH3-64 state (libxxhash's) */

/* NULL when out of memory.  ecs_sum_free(NULL) is a no-op. */
ecs_sum_t *ecs_sum_new(void);
void ecs_sum_free(ecs_sum_t *s);

void ecs_sum_reset(ecs_sum_t *s);
void ecs_sum_update(ecs_sum_t *s, const void *p, size_t n);
uint64_t ecs_sum_digest(const ecs_sum_t *s);

/* memcpy(dst, src, n) and the checksum of the bytes copied, slice by
 * slice, so each slice is hashed while it is in cache. */
uint64_t ecs_copy_checksum(void *dst, const void *src, size_t n);

#endif
