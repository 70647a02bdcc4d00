/*
 * A small Redis link for the connector (the redis backend and the KV
 * handoff): connect lazily within connect_timeout_ms, every reply awaited
 * until a deadline, the link dropped on an I/O error and re-opened by the
 * next call.  Keys and values go through the Argv forms only, so they are
 * binary-safe.
 *
 * Errors: ECS_ECONN (refused, reset, closed: transient), ECS_ETIMEDOUT (no
 * reply by the deadline: transient), ECS_EREDIS (an error reply: the link
 * stays up), ECS_ENOMEM.  ecs__rds_errmsg() says what happened.
 *
 * Thread safety: none; one link per thread or a lock around it.
 */
#ifndef ECS_EC_RDS_H
#define ECS_EC_RDS_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

typedef struct ecs__rds {
  redisContext *c;        /* NULL while down */
  char host[256];         /* from the URL */
  int port;               /* from the URL */
  int db;                 /* SELECTed after connect when nonzero */
  int connect_timeout_ms; /* one connect attempt */
  int timeout_ms;         /* default wait for one reply */
  char err[256];          /* last error */
} ecs__rds_t;

/* Parses url ("redis://HOST:PORT[/DB]" or "HOST:PORT"); does not connect. */
int ecs__rds_init(ecs__rds_t *r, const char *url, int connect_timeout_ms, int timeout_ms);

/* Drops the link; the struct may be re-used (the next call reconnects). */
void ecs__rds_close(ecs__rds_t *r);

/* Connects when down. */
int ecs__rds_connect(ecs__rds_t *r);

/* Queues one command (pipelining: replies are read with ecs__rds_reply). */
int ecs__rds_append(ecs__rds_t *r, int argc, const char **argv, const size_t *lens);

/* Reads the next reply, waiting until the monotonic deadline_ms.  An
 * error reply is returned as ECS_EREDIS with the reply freed. */
int ecs__rds_reply(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out);

/* append + reply with the default timeout.  lens NULL: NUL-terminated. */
int ecs__rds_cmd(ecs__rds_t *r, redisReply **out, int argc, const char **argv, const size_t *lens);

/* Monotonic deadline timeout_ms from now. */
uint64_t ecs__rds_deadline(const ecs__rds_t *r);

const char *ecs__rds_errmsg(const ecs__rds_t *r);

#endif
