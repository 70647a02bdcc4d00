/*
 * The Redis link: the one piece of code that connects to Redis, waits for
 * its replies and says what went wrong, for the metadata layer
 * (store/meta.c: object records, node registry) and the connector (the
 * redis backend and the KV handoff).
 *
 * Connects within connect_timeout_ms; every reply is awaited until a
 * deadline (the socket timeout is set to what is left of it before each
 * blocking read); any I/O error, timeout or malformed reply drops the link
 * (a pipeline cut half-way leaves the stream out of step), and the next
 * call reconnects.  Keys and values go through the Argv forms only, so
 * they are binary-safe.  Deadlines are on the monotonic clock of
 * ecs_now_ms() (store/net.h).
 *
 * Errors, one mapping for every caller (docs/redis-schema.md, "Errors"):
 *   ECS_ECONN      refused, reset, closed, unreachable, or the link is down:
 *                  transient, the next call reconnects
 *   ECS_ETIMEDOUT  no connection or no reply by the deadline (a stopped
 *                  Redis): transient, the link is dropped
 *   ECS_EREDIS     Redis answered with an error reply (-ERR, WRONGTYPE,
 *                  OOM: the link stays up), or with bytes that are not
 *                  RESP (the link is dropped)
 *   ECS_ENOMEM, ECS_EINVAL (a bad URL)
 * ecs__rds_errmsg() says what happened, naming the Redis address.
 *
 * Thread safety: none; one link per thread or a lock around it.
 */
#ifndef ECS_STORE_RDS_H
#define ECS_STORE_RDS_H

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
  int used;               /* a reply arrived since the connect (a later EOF may be a stale link) */
  char err[256];          /* last error */
} ecs__rds_t;

/* Parses url: "redis://HOST:PORT[/DB]", "HOST:PORT[/DB]" or "HOST" (port
 * 6379); HOST may be a bracketed IPv6 literal; no user or password (an '@'
 * is refused).  Returns ECS_OK or ECS_EINVAL. */
int ecs__rds_parse_url(const char *url, char *host, size_t hostcap, int *port, int *db);

/* A number as Redis sends it: decimal digits only (no sign, at most 20, no
 * overflow), len bytes at s, not NUL-terminated.  0, or -1 when it is not
 * one. */
int ecs__rds_parse_u64(const char *s, size_t len, uint64_t *out);

/* Parses url (as above) into r; does not connect. */
int ecs__rds_init(ecs__rds_t *r, const char *url, int connect_timeout_ms, int timeout_ms);

/* Drops the link; the struct may be re-used (the next call reconnects). */
void ecs__rds_close(ecs__rds_t *r);

/* 1 while connected. */
int ecs__rds_up(const ecs__rds_t *r);

/* Connects (and SELECTs the db) when down. */
int ecs__rds_connect(ecs__rds_t *r);

/* Queues one command (pipelining: replies are read with ecs__rds_reply),
 * connecting first when down.  lens NULL: NUL-terminated arguments. */
int ecs__rds_append(ecs__rds_t *r, int argc, const char **argv, const size_t *lens);

/* Reads the next reply, waiting until the monotonic deadline_ms.  An
 * error reply is returned as ECS_EREDIS with the reply freed. */
int ecs__rds_reply(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out);

/* As ecs__rds_reply, but an error reply is a reply (ECS_OK), for callers
 * that look inside it (NOSCRIPT, a failed item of a pipeline). */
int ecs__rds_reply_any(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out);

/* append + reply with the default timeout.  lens NULL: NUL-terminated. */
int ecs__rds_cmd(ecs__rds_t *r, redisReply **out, int argc, const char **argv, const size_t *lens);

/* Monotonic deadline timeout_ms from now. */
uint64_t ecs__rds_deadline(const ecs__rds_t *r);

/* Records a message of the caller's (a reply it could not use). */
__attribute__((format(printf, 2, 3))) void ecs__rds_seterr(ecs__rds_t *r, const char *fmt, ...);

const char *ecs__rds_errmsg(const ecs__rds_t *r);

#endif
