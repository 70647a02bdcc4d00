/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency
 * free.  Used for the shm upgrade's challenge-response (store/server/server_ops.c,
 * store/client/client_shm.c): the client proves it holds the one-time secret the
 * server issued over TCP without sending it.  Not tuned for throughput:
 * it hashes a few dozen bytes per upgrade.
 *
 * Thread safety: pure functions over caller-owned state.
 */
#ifndef ECS_SHA256_H
#define ECS_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define ECS_SHA256_SIZE 32  /* digest bytes */
#define ECS_SHA256_BLOCK 64 /* block bytes */

typedef struct ecs_sha256 {
  uint32_t h[8];                 /* chaining state */
  uint64_t len;                  /* message bytes so far */
  uint8_t buf[ECS_SHA256_BLOCK]; /* a partial block */
  size_t nbuf;                   /* bytes in buf */
} ecs_sha256_t;

void ecs__sha256_init(ecs_sha256_t *s);
void ecs__sha256_update(ecs_sha256_t *s, const void *p, size_t n);
void ecs__sha256_final(ecs_sha256_t *s, uint8_t out[ECS_SHA256_SIZE]);
/* One-shot digest of [p, p+n). */
void ecs__sha256(const void *p, size_t n, uint8_t out[ECS_SHA256_SIZE]);
/* HMAC-SHA256 of msg under key (any length: a key longer than a block is
 * hashed first, as RFC 2104 says). */
void ecs__hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen,
                      uint8_t out[ECS_SHA256_SIZE]);

#endif
