/*
 * Sets of small test objects, "PFX-NNNN" of ECS_OBJSET_BYTES each, every
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
