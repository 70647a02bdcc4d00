/*
 * A fake Redis that fails part-way through a pipelined batch.
 *
 * Why a fake: the contract under test ("an error is never 'exists'") is
 * about a Redis link that answers the first chunks of a batch and then
 * fails, and a real redis-server cannot be made to do that at an exact
 * reply.  This peer simulates the failing network; it is no Redis we claim
 * compatibility with.  It speaks just enough RESP for the metadata layer
 * and the connector's redis backend: every connection gets `budget` data
 * replies (EVAL/EVALSHA: an array of numkeys ":1"; EXISTS, GET-less
 * one-key commands: ":1"), then each later data command either gets an
 * error reply (FAKE_ERROR) or the connection is closed (FAKE_CLOSE).
 * SCRIPT LOAD gets a made-up sha, PING +PONG, anything else +OK.
 *
 * One thread per connection; stop() joins them all.
 */
#ifndef ECS_TS_FAKEREDIS_H
#define ECS_TS_FAKEREDIS_H

#include <stddef.h>
#include <stdint.h>

enum { ECS_TS_FAKE_ERROR = 1, ECS_TS_FAKE_CLOSE = 2 };

typedef struct ecs_ts_fakeredis ecs_ts_fakeredis_t;

/* Listens on a free 127.0.0.1 port.  ECS_OK or an ECS_E* code. */
int ecs_ts_fakeredis_start(int budget, int mode, ecs_ts_fakeredis_t **out);
int ecs_ts_fakeredis_port(const ecs_ts_fakeredis_t *f);
/* Data replies answered with success so far, over all connections. */
uint64_t ecs_ts_fakeredis_answered(const ecs_ts_fakeredis_t *f);
/* Data commands failed so far (error reply or close). */
uint64_t ecs_ts_fakeredis_failed(const ecs_ts_fakeredis_t *f);
/* A hostile Redis (the point of the test is a hostile peer, so a fake is
 * the peer under test): AUTH, SELECT and PING are answered as Redis does;
 * every other command gets `reply` (len bytes, e.g. "*300000000\r\n"),
 * then up to filler_bytes more made of repeats of `unit` (the elements or
 * string bytes the header announced, so that a victim that believes the
 * header buffers or allocates them), then silence until the victim hangs
 * up.  The strings are copied. */
int ecs_ts_fakeredis_start_hostile(const char *reply, size_t len, const char *unit, uint64_t filler_bytes,
                                   ecs_ts_fakeredis_t **out);
/* Hostile mode on (the default of start_hostile) or off (then the peer
 * answers as the plain fake with an unlimited budget), for a victim that
 * must come up before the attack. */
void ecs_ts_fakeredis_set_hostile(ecs_ts_fakeredis_t *f, int on);
/* Hostile replies sent so far, and bytes of filler the victim took. */
uint64_t ecs_ts_fakeredis_hostile_sent(const ecs_ts_fakeredis_t *f);
uint64_t ecs_ts_fakeredis_filler_taken(const ecs_ts_fakeredis_t *f);
/* Closes every connection and frees f; accepts NULL. */
void ecs_ts_fakeredis_stop(ecs_ts_fakeredis_t *f);

#endif
