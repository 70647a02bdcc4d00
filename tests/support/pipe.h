/*
 * A raw pipelining peer for the server's request pipelining tests
 * (test_pipeline, test_pipeline_attack): requests appended to one buffer
 * and sent back to back, replies read one by one and checked against the
 * request they answer.  Built on support/raw.h's authenticated socket.
 */
#ifndef ECS_TEST_SUPPORT_PIPE_H
#define ECS_TEST_SUPPORT_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/ecstore.h"
#include "store/core/proto.h"
#include "support/fixture.h"

/* Bound on each read or write of these helpers. */
#define ECS_PIPE_IO_MS 15000

/* Appends one request (header with id, records in w, n payload bytes). */
void ecs_pipe_req(ecs_wbuf_t *out, uint8_t op, uint32_t id, uint32_t count, const ecs_wbuf_t *w,
                  const void *data, size_t n);
/* A PUT of one object of n bytes filled from seed (flags: ECS_PUT_F_*). */
void ecs_pipe_put(ecs_wbuf_t *out, uint32_t id, const char *key, uint32_t seed, size_t n, uint8_t flags);
/* A GET of one object, capacity cap. */
void ecs_pipe_get(ecs_wbuf_t *out, uint32_t id, const char *key, size_t cap);
/* A REMOVE or EXISTS of one key. */
void ecs_pipe_key(ecs_wbuf_t *out, uint8_t op, uint32_t id, const char *key);
/* Reads one reply, asserting (cmocka) that it answers (op, id) with one
 * item; returns that item's status, and for a GET that found its object
 * asserts its n bytes are seed's. */
int ecs_pipe_reply(int fd, uint8_t op, uint32_t id, uint32_t seed, size_t n);
/* ecs_pipe_reply for a helper thread (cmocka's asserts belong to the
 * test's thread): 1 when the reply answers (op, id) with status ECS_OK
 * and, for a GET, seed's n bytes; 0 otherwise (said why on stderr). */
int ecs_pipe_reply_ok(int fd, uint8_t op, uint32_t id, uint32_t seed, size_t n);
/* The port of the env's server, and an authenticated raw socket to it. */
int ecs_pipe_port(const ecs_ts_env_t *e);
int ecs_pipe_open(const ecs_ts_env_t *e);
/* Whether key is stored, asked through client c (no Redis). */
int ecs_pipe_stored(ecs_client_t *c, const char *key);

/* Sends all of out on fd from a thread, while the test reads replies (a
 * get's reply would fill the socket buffers otherwise, and the server
 * stops reading while a reply of its cannot leave). */
typedef struct ecs_pipe_sender {
  int fd;                /* where */
  const ecs_wbuf_t *out; /* what */
  int rc;                /* ecs_net_writev_all's */
} ecs_pipe_sender_t;
void *ecs_pipe_send_run(void *sender);

#endif
