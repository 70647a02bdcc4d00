/*
 * Redis metadata: object records and the node registry.
 *
 * Only servers write object records, after the bytes are in the pool and
 * checksummed.  Clients read them: exists_batch() (the scheduler's call,
 * which never touches a data server) and lookup_batch() (routing).  The
 * schema is docs/redis-schema.md:
 *
 *   ecs:{ns}:obj:{key}   hash  node epoch off len raw_len dtype shape csum codec t,
 *                              and h:{id} = epoch for every node holding a copy
 *   ecs:{ns}:node:{id}   hash  addr port pool epoch started free   (TTL heartbeat)
 *   ecs:{ns}:nodes       set   node ids
 *
 * The braces around ns are literal (a Redis Cluster hash tag: a namespace's
 * keys share one slot); {key} and {id} stand for the key and the node id.
 *
 * A record is live when its node's registry hash exists and carries the
 * same epoch; otherwise it is stale (the node restarted or died), reads
 * treat it as a miss and delete it.  exists_batch does this in one round
 * trip with a Lua script.
 *
 * Server side, the link may be down: queued writes are then dropped and
 * the handle remembers that a full re-sync is owed; tick() reconnects (at
 * most once per reconnect interval) and calls the resync callback, which
 * re-publishes every object the server holds, after the records of this
 * node that it no longer holds have been deleted.
 *
 * Every Redis call is bounded by opts.timeout_ms: a dead or unreachable
 * Redis becomes ECS_ECONN, a stopped one ECS_ETIMEDOUT, never a hang; an
 * error reply is ECS_EREDIS (store/redis/rds.h has the one mapping).
 *
 * Thread safety: a handle is used by one thread at a time.
 */
#ifndef ECS_META_H
#define ECS_META_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/tensor.h"

typedef struct ecs_meta ecs_meta_t;

typedef struct ecs_meta_opts {
  const char *redis_url; /* "redis://HOST:PORT[/DB]" or "HOST:PORT"; required */
  const char *ns;        /* namespace; required */
  const char *node_id;   /* server side: this node's id (NULL for clients) */
  const char *addr;      /* server side: advertised "HOST:PORT" */
  uint64_t pool_size;    /* server side: pool bytes, for the registry */
  uint64_t epoch;        /* server side: this process's epoch */
  int timeout_ms;        /* per Redis call (default 500) */
  int heartbeat_ttl_s;   /* registry TTL in s; heartbeat every ttl/3, at least once a second (default 10) */
  int heartbeat_ttl_ms;  /* the same in ms, when > 0 (wins over heartbeat_ttl_s; at least 1000) */
  int reconnect_ms;      /* least time between reconnect attempts (default 1000) */
  uint64_t connect_until_ms; /* 0, or a monotonic ms the open's connect (every step) ends by */
  int no_marks;              /* 1: ecs_meta_nodes() leaves suspicion marks unread (suspect_ms 0):
                                a reader that never uses them (the server's PULL registry copy)
                                saves two commands per node */
} ecs_meta_opts_t;

/* Most holders of one object a lookup reports (replicas). */
#define ECS_META_MAX_HOLDERS 8

/* A node holding a copy of an object, and its epoch when it wrote. */
typedef struct ecs_meta_holder {
  char node_id[64]; /* NUL-terminated */
  uint64_t epoch;
} ecs_meta_holder_t;

/* An object record as stored in Redis. */
typedef struct ecs_meta_rec {
  const uint8_t *key; /* borrowed */
  uint16_t key_len;
  char node_id[64]; /* NUL-terminated; lookup: the last writer if a live holder, else the first */
  uint64_t epoch;
  uint64_t off, nbytes, raw_nbytes, checksum;
  uint8_t codec;
  ecs_tensor_desc_t desc;
  uint64_t t_ms; /* commit time, wall-clock ms */
  /* lookup only: the live holders (replicas; one for a single copy) */
  ecs_meta_holder_t holders[ECS_META_MAX_HOLDERS];
  size_t nholders;
} ecs_meta_rec_t;

typedef struct ecs_meta_node {
  char node_id[64];
  char addr[128]; /* "HOST:PORT" */
  uint64_t epoch, pool_size;
  uint64_t free_bytes; /* pool bytes free at the last heartbeat (pool_size if not published) */
  uint64_t suspect_ms; /* a client's suspicion mark of this node at this epoch: its time left
                          (ms, as Redis says: callers cap it); 0 for none */
} ecs_meta_node_t;

void ecs_meta_opts_init(ecs_meta_opts_t *o);

/* Creates a handle and tries to connect once.  A failed connection is not
 * an error for servers: the handle starts down and tick() retries.  Clients
 * check ecs_meta_is_up().  Returns ECS_OK, ECS_EINVAL or ECS_ENOMEM. */
int ecs_meta_open(const ecs_meta_opts_t *o, ecs_meta_t **out);
void ecs_meta_close(ecs_meta_t *m); /* accepts NULL */
int ecs_meta_is_up(const ecs_meta_t *m);
/* Bounds each later connect and reply wait of the blocking link to ms
 * (clients: what is left of a call's deadline). */
void ecs_meta_set_timeout(ecs_meta_t *m, int ms);
/* Bounds every step of the blocking link, a (re)connect's included (each
 * sentinel, AUTH, SELECT, ROLE, SCRIPT LOAD), and every reply wait by the
 * monotonic until_ms: each takes what is left, at most its own timeout
 * (clients: their call's deadline; review findings C1, C2).  0 lifts it. */
void ecs_meta_set_deadline(ecs_meta_t *m, uint64_t until_ms);
/* Text of the last Redis error ("" if none). */
const char *ecs_meta_errstr(const ecs_meta_t *m);

/* --- server side ------------------------------------------------------ */

/* Writes the registry entry (HSET + EXPIRE + SADD). */
int ecs_meta_register(ecs_meta_t *m);
/* Deletes this node's registry entry and every record this process wrote
 * that is still live (on graceful shutdown), giving up budget_ms from now
 * (every connect and reply is bounded by what is left; ECS_ETIMEDOUT when
 * it ran out).  What it could not delete is stale once the registry entry
 * is gone or has expired (readers drop such records) and is swept by the
 * next start with the same node id; the queued writes are dropped for the
 * same reason. */
int ecs_meta_unregister(ecs_meta_t *m, int budget_ms);
/* Queue a record write / delete; sent by the next flush().  A record always
 * names this node and epoch (rec->node_id and rec->epoch are ignored; a
 * t_ms of 0 means now).  A delete removes the record only while it still
 * names this node.  Dropped while the link is down (a re-sync is owed). */
void ecs_meta_queue_put(ecs_meta_t *m, const ecs_meta_rec_t *rec);
void ecs_meta_queue_del(ecs_meta_t *m, const void *key, uint16_t key_len);
/* Sends every queued command in one pipeline and reads the replies.
 * When the link is down, drops the queue and returns ECS_ECONN (the
 * re-sync will cover it). */
int ecs_meta_flush(ecs_meta_t *m);

/* Re-sync callback: must call ecs_meta_queue_put() for every object the
 * server holds; has_key(key) answers whether the server holds a key. */
typedef struct ecs_meta_resync {
  void (*publish_all)(void *ctx, ecs_meta_t *m);
  int (*has_key)(void *ctx, const void *key, uint16_t key_len);
  void *ctx;
} ecs_meta_resync_t;

/* Pool bytes free, published in the registry entry with the next
 * heartbeat (clients placing puts by load read it). */
void ecs_meta_set_free(ecs_meta_t *m, uint64_t free_bytes);

/* Periodic work, called by the server loop at least every second:
 * heartbeat (EXPIRE + epoch check), reconnect when down, and the re-sync
 * owed after an outage.  Returns ECS_OK when the link is up. */
int ecs_meta_tick(ecs_meta_t *m, uint64_t now_ms, const ecs_meta_resync_t *rs);

/* 1 while a re-sync is owed or under way (a sweep advances a bounded number
 * of SCAN steps per tick), else 0.  A server handle owes one from open(),
 * which clears what an earlier process with the same node id left. */
int ecs_meta_resync_pending(const ecs_meta_t *m);

/* --- server side, asynchronous ---------------------------------------- */

/*
 * A server handle attached to the server's epoll loop never waits for
 * Redis: every write, the registry, the heartbeat and the re-sync sweep
 * become commands on an asynchronous link (store/redis/rds.h, ecs__rdsa_*) whose
 * replies arrive as callbacks from the loop.  Commands sent during one
 * loop iteration leave in one write (group commit).  Once attached,
 * queue_put / queue_del send at once (their failures owe a re-sync),
 * flush() only reports the link, tick() starts work without waiting,
 * unregister() detaches and takes the blocking link (a bounded wait at
 * shutdown).
 */

/* Attaches m (a server handle) to the loop's epoll instance epfd and
 * starts connecting.  The loop must pass events whose data.ptr
 * ecs_meta_owns() to ecs_meta_event(), and call ecs_meta_poll() at least
 * every ~100 ms.  ECS_OK or ECS_EINVAL. */
int ecs_meta_attach_loop(ecs_meta_t *m, int epfd);
int ecs_meta_owns(const ecs_meta_t *m, const void *p);
void ecs_meta_event(ecs_meta_t *m, uint32_t events);
/* Sends the commands queued on the asynchronous link now, from the
 * calling thread (under the lock that guards m); the loops call it after
 * each batch of events (ecs__rdsa_kick). */
void ecs_meta_kick(ecs_meta_t *m);
/* Enforces the Redis timeout on the oldest command in flight: past it,
 * the link drops and every pending callback fails with ECS_ETIMEDOUT.
 * Returns the ms until the next deadline, or -1 when none runs. */
int ecs_meta_poll(ecs_meta_t *m, uint64_t now_ms);

/* Called once with the outcome of a record write: ECS_OK (Redis
 * acknowledged it), ECS_ETIMEDOUT, ECS_ECONN, ECS_ECANCELED (the handle
 * closed) or ECS_EREDIS; on failure a re-sync is owed and publishes it. */
typedef void (*ecs_meta_done_fn)(void *ctx, int rc);

/* Sends rec's record (attached handles only).  ECS_OK: done(ctx, rc) will
 * be called exactly once, from the loop, never from inside this call.
 * Otherwise done is never called: ECS_ENOTCONN (the link is down; a
 * re-sync is owed), ECS_EINVAL, ECS_ENOMEM. */
int ecs_meta_put_async(ecs_meta_t *m, const ecs_meta_rec_t *rec, ecs_meta_done_fn done, void *ctx);
/* As queue_del, awaited like put_async (a REMOVE is answered once its
 * deletes are acknowledged; eviction's deletes are not awaited). */
int ecs_meta_del_async(ecs_meta_t *m, const void *key, uint16_t key_len, ecs_meta_done_fn done, void *ctx);

/* --- client side ------------------------------------------------------ */

/* exists[i] = 1 for live records, 0 for missing or stale ones (stale ones
 * are deleted).  One round trip.  Returns ECS_OK, or ECS_ECONN /
 * ECS_ETIMEDOUT / ECS_EREDIS for the whole batch (exists[] is then all 0). */
int ecs_meta_exists_batch(ecs_meta_t *m, const uint8_t *const *keys, const uint16_t *lens, size_t n,
                          int *exists);

/* Fetches live records: status[i] = ECS_OK (recs[i] filled; recs[i].key
 * is keys[i]), ECS_ENOTFOUND or ECS_ESTALE (or ECS_EKEY for a key of length
 * 0 or over ECS_MAX_KEY, which fails alone).  Returns as exists_batch. */
int ecs_meta_lookup_batch(ecs_meta_t *m, const uint8_t *const *keys, const uint16_t *lens, size_t n,
                          ecs_meta_rec_t *recs, int *status);

/* Lists registered nodes (those whose registry hash is live), at most max
 * of them; *n is the number written.  Each node's suspicion mark (below)
 * is read in the same pipeline (suspect_ms). */
int ecs_meta_nodes(ecs_meta_t *m, ecs_meta_node_t *out, size_t max, size_t *n);

/*
 * Suspicion marks (docs/redis-schema.md, docs/multihost.md): a client that
 * found a node unreachable (refused, or timed out) says so for other
 * clients, ecs:{ns}:suspect:{id} = the node's epoch, with a TTL of the
 * client's back-off; readers (ecs_meta_nodes) report a mark only while it
 * names the node's current epoch and has a TTL.  What a reader does with
 * it is its own policy (the client caps it, and a node that answers it
 * overrides marks for a while).  Both calls are fire-and-forget on the
 * blocking link (ecs__rds_send_noreply): they never connect and never
 * wait, a link that is down drops them (ECS_ENOTCONN), so nothing on a
 * data path waits for Redis.  ECS_OK, ECS_ENOTCONN, ECS_EINVAL.
 */
int ecs_meta_mark_suspect(ecs_meta_t *m, const char *node_id, uint64_t epoch, int ttl_ms);
/* Withdraws a node's mark (DEL): it answered this client. */
int ecs_meta_clear_suspect(ecs_meta_t *m, const char *node_id);

/* --- internal --------------------------------------------------------- */

/* Parses one record as the lookup script returns it (an array of the ten
 * fields node epoch off len raw_len dtype shape csum codec t, as strings)
 * into rec (rec->key untouched).  0, or -1 for anything else: a wrong
 * type or count, an empty or over-long node id, a number that is not
 * decimal or overflows, a dtype or codec over 255, more than ECS_MAX_DIMS
 * dimensions, a checksum that is not 16 hex digits.  Pure; exposed for
 * tests/fuzz/fuzz_redis_record.c. */
struct redisReply;
int ecs__meta_parse_rec(const struct redisReply *e, ecs_meta_rec_t *rec);

#endif /* ECS_META_H */
