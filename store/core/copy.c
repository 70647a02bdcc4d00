/*
 * Copy and hash in one pass (store/core/copy.h).
 *
 * This is XXH3-64's long-input loop (xxhash.h: XXH3_hashLong_64b_internal
 * with XXH3_accumulate_512_avx2 and the scalar scrambler) with a store of
 * each stripe added: 1 KiB blocks of 16 stripes, the accumulators
 * scrambled after each block, the last partial block, the last stripe
 * (which overlaps bytes already hashed), then the merge and avalanche.
 * The hash value is pinned by tests/test_copy.c against XXH3_64bits on
 * every length class and alignment.
 */
#include "store/core/copy.h"

#include <string.h>

#include "store/core/checksum.h"

/* Inlined, so that the constants and helpers below are this file's own
 * static copies (the library links the same libxxhash for everything else). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_FUSED 1

#define STRIPE 64                                              /* XXH_STRIPE_LEN */
#define STRIPES_PER_BLOCK ((sizeof XXH3_kSecret - STRIPE) / 8) /* 16 with the default secret */
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)

/* One stripe: load, store, accumulate (XXH3_accumulate_512_avx2). */
__attribute__((target("avx2"))) static inline void stripe(__m256i acc[2], uint8_t *dst, const uint8_t *src,
                                                          const uint8_t *secret) {
  for (int i = 0; i < 2; i++) {
    __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32 * i));
    _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * i), d);
    __m256i k = _mm256_loadu_si256((const __m256i *)(const void *)(secret + 32 * i));
    __m256i dk = _mm256_xor_si256(d, k);
    __m256i prod = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
    __m256i swap = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2));
    acc[i] = _mm256_add_epi64(prod, _mm256_add_epi64(acc[i], swap));
  }
}

/* The same with non-temporal stores (dst 16-byte aligned): for objects
 * larger than L2 the destination would be evicted before anyone reads it
 * anyway, and streaming stores skip reading each destination line before
 * writing it.  Measured in-process, 8 objects per round, load ~7: 4 MiB
 * 101-127% of memcpy against 71-117% with plain stores, 16 MiB 125-157%
 * against 90-117%; 1 and 2 MiB no different, so plain stores there (the
 * caller may read a small object while it is in cache). */
__attribute__((target("avx2"))) static inline void stripe_nt(__m256i acc[2], uint8_t *dst, const uint8_t *src,
                                                             const uint8_t *secret) {
  for (int i = 0; i < 2; i++) {
    __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32 * i));
    _mm_stream_si128((__m128i *)(void *)(dst + 32 * i), _mm256_castsi256_si128(d));
    _mm_stream_si128((__m128i *)(void *)(dst + 32 * i + 16), _mm256_extracti128_si256(d, 1));
    __m256i k = _mm256_loadu_si256((const __m256i *)(const void *)(secret + 32 * i));
    __m256i dk = _mm256_xor_si256(d, k);
    __m256i prod = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
    __m256i swap = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2));
    acc[i] = _mm256_add_epi64(prod, _mm256_add_epi64(acc[i], swap));
  }
}

/* The same accumulation without the store (the last stripe, re-read). */
__attribute__((target("avx2"))) static inline void stripe_hash(__m256i acc[2], const uint8_t *src,
                                                               const uint8_t *secret) {
  for (int i = 0; i < 2; i++) {
    __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32 * i));
    __m256i k = _mm256_loadu_si256((const __m256i *)(const void *)(secret + 32 * i));
    __m256i dk = _mm256_xor_si256(d, k);
    __m256i prod = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
    __m256i swap = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2));
    acc[i] = _mm256_add_epi64(prod, _mm256_add_epi64(acc[i], swap));
  }
}

/* XXH3_scrambleAcc, through memory: once per KiB, so its cost is noise. */
__attribute__((target("avx2"))) static inline void scramble(__m256i acc[2], const uint8_t *secret) {
  uint64_t a[8];
  _mm256_storeu_si256((__m256i *)(void *)a, acc[0]);
  _mm256_storeu_si256((__m256i *)(void *)(a + 4), acc[1]);
  XXH3_scrambleAcc_scalar(a, secret);
  acc[0] = _mm256_loadu_si256((const __m256i *)(const void *)a);
  acc[1] = _mm256_loadu_si256((const __m256i *)(const void *)(a + 4));
}

__attribute__((target("avx2"))) static uint64_t copy_hash_avx2(uint8_t *dst, const uint8_t *src, size_t n) {
  const uint8_t *secret = XXH3_kSecret;
  const size_t secret_size = sizeof XXH3_kSecret;
  XXH_ALIGN(32) uint64_t init[8] = XXH3_INIT_ACC;
  __m256i acc[2] = {_mm256_load_si256((const __m256i *)(const void *)init),
                    _mm256_load_si256((const __m256i *)(const void *)(init + 4))};
  size_t nb_blocks = (n - 1) / BLOCK, at = 0;
  int nt = n >= ECS__COPY_NT_MIN && ((uintptr_t)dst & 15) == 0;
  for (size_t b = 0; b < nb_blocks; b++) {
    if (nt)
      for (size_t s = 0; s < STRIPES_PER_BLOCK; s++, at += STRIPE)
        stripe_nt(acc, dst + at, src + at, secret + 8 * s);
    else
      for (size_t s = 0; s < STRIPES_PER_BLOCK; s++, at += STRIPE)
        stripe(acc, dst + at, src + at, secret + 8 * s);
    scramble(acc, secret + secret_size - STRIPE);
  }
  if (nt)
    _mm_sfence();
  size_t last = ((n - 1) - BLOCK * nb_blocks) / STRIPE;
  for (size_t s = 0; s < last; s++, at += STRIPE)
    stripe(acc, dst + at, src + at, secret + 8 * s);
  /* The bytes after the last whole stripe: copied plainly, hashed by the
   * last stripe, which ends at n and so overlaps what came before. */
  memcpy(dst + at, src + at, n - at);
  stripe_hash(acc, src + n - STRIPE, secret + secret_size - STRIPE - XXH_SECRET_LASTACC_START);
  XXH_ALIGN(32) uint64_t a[8];
  _mm256_store_si256((__m256i *)(void *)a, acc[0]);
  _mm256_store_si256((__m256i *)(void *)(a + 4), acc[1]);
  return XXH3_mergeAccs(a, secret + XXH_SECRET_MERGEACCS_START, (uint64_t)n * XXH_PRIME64_1);
}

int ecs__copy_hash_fused(void) {
  static int avx2 = -1; /* racy but idempotent: every thread computes the same */
  int v = __atomic_load_n(&avx2, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") ? 1 : 0;
    __atomic_store_n(&avx2, v, __ATOMIC_RELAXED);
  }
  return v;
}
#else
#define HAVE_FUSED 0
int ecs__copy_hash_fused(void) {
  return 0;
}
#endif

uint64_t ecs__copy_hash(void *dst, const void *src, size_t n) {
#if HAVE_FUSED
  if (n > XXH3_MIDSIZE_MAX && ecs__copy_hash_fused())
    return copy_hash_avx2(dst, src, n);
#endif
  return ecs_copy_checksum(dst, src, n);
}
