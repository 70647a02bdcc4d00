/*
 * Copy and hash in one pass (not installed).
 *
 * A verified shm get copies an object out of the pool and checks its
 * XXH3-64.  ecs_copy_checksum (store/core/checksum.h) does that slice by slice:
 * memcpy 256 KiB, then hash it back out of L2.  Measured on 1..16 MiB
 * objects that second pass cost 30-40% of the copy's time (get at 62-77%
 * of memcpy, against 90-105% with verification off;
 * docs/bench-results/2026-11-25-pool-and-shm-copy.md).  Here each 64-byte stripe is
 * loaded once into vector registers, stored to the destination and fed to
 * the XXH3 accumulators from the same registers, so the hash rides on the
 * copy's loads and costs a few ALU operations per stripe.
 */
#ifndef ECS_COPY_H
#define ECS_COPY_H

#include <stddef.h>
#include <stdint.h>

/* Objects of at least this many bytes are stored with non-temporal
 * stores (when dst is 16-byte aligned): about the L2 size of current
 * server cores. */
#define ECS__COPY_NT_MIN ((size_t)4 << 20)

/* memcpy(dst, src, n) and returns XXH3-64 (seed 0, default secret) of the
 * bytes: the same value as ecs_checksum(src, n).  dst and src must not
 * overlap; any alignment.  One pass on x86-64 CPUs with AVX2 for n > 240
 * (XXH3's long-input path); elsewhere it is ecs_copy_checksum. */
uint64_t ecs__copy_hash(void *dst, const void *src, size_t n);

/* 1 when ecs__copy_hash takes the one-pass path for large n on this CPU
 * (tests and the benchmark say which they measured). */
int ecs__copy_hash_fused(void);

#endif
