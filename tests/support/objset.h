/*
 * A Redis and up to ECS_MFX_MAX_SERVERS ecstore-servers for the tests
 * that spread objects over several servers (test_multihost,
 * test_replicas), and sets of small test objects, "PFX-NNNN" of ECS_OBJSET_BYTES each, every
 * one with a byte pattern of its own (index and salt), so a mix-up
 * between objects, servers or copies is seen.  For the tests that put and
 * get whole batches across several servers (test_multihost,
 * test_replicas).
 */
#ifndef ECS_TESTS_SUPPORT_OBJSET_H
#define ECS_TESTS_SUPPORT_OBJSET_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/ecstore.h"
#include "support/ts.h"

struct redisContext;

#define ECS_MFX_MAX_SERVERS 5

/* The fixture: one Redis, servers started by the test into srv[]. */
typedef struct ecs_mfx {
  ecs_ts_proc_t redis;                    /* its Redis */
  ecs_ts_proc_t srv[ECS_MFX_MAX_SERVERS]; /* servers the test starts (pid 0: none) */
  struct redisContext *r;                 /* a link to that Redis, for looking at records */
} ecs_mfx_t;

/* cmocka setup/teardown: Redis started (and a link to it); at the end
 * every server started is stopped, a failed stop (a crash or a sanitizer
 * report) failing the test, then Redis. */
int ecs_mfx_setup(void **state);
int ecs_mfx_teardown(void **state);

#define ECS_OBJSET_BYTES 4096

/* Object i's key, "pfx-%04d". */
void ecs_objset_key(char *out, size_t cap, const char *pfx, int i);

/* Object i's bytes (ECS_OBJSET_BYTES at p). */
void ecs_objset_fill(uint8_t *p, int i, uint32_t salt);

/* Puts (upsert: upserts) objects 0..n-1 in one batch; statuses into st.
 * Returns the call's result (its message printed when not ECS_OK). */
int ecs_objset_put(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st, int upsert);

/* Gets objects 0..n-1 in one batch; statuses into st; every ECS_OK one's
 * size and bytes are asserted (nothing wrong is ever returned).  Returns
 * the call's result. */
int ecs_objset_get(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st);

#endif
