/*
 * Redis metadata internals, shared by the files that make store/redis/meta.h
 * up and by nothing else (tests/fuzz reaches ecs__meta_parse_rec through
 * meta.h).  One concern per file:
 *
 *   meta_core.c      the blocking link (every command, its reply and the
 *                    error mapping), open / close, tick
 *   meta_records.c   record format and parse, the check script's batches:
 *                    exists_batch, lookup_batch
 *   meta_registry.c  the node registry: register, heartbeat, nodes,
 *                    unregister
 *   meta_write.c     writes: the blocking write queue, the asynchronous
 *                    puts and the batched record deletes
 *   meta_resync.c    the re-sync sweep, blocking and asynchronous
 *   meta_async.c     the asynchronous mode on the server's loop: attach,
 *                    link up / down, heartbeat, event, poll, tick
 *   meta_lua.c       the two Lua scripts (check, delete)
 *   meta_suspect.c   clients' suspicion marks: publish, withdraw, read
 *
 * The schema, the staleness rule and the re-sync after an outage are
 * described in docs/redis-schema.md; these files are the only code that
 * reads or writes those keys.
 */
#ifndef ECS_STORE_META_INTERNAL_H
#define ECS_STORE_META_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "store/redis/meta.h"
#include "store/redis/rds.h"

#define META_DEFAULT_TIMEOUT_MS 500
#define META_DEFAULT_TTL_S 10
#define META_MIN_TTL_MS 1000 /* a heartbeat every ttl/3: at least every 333 ms */
#define META_DEFAULT_RECONNECT_MS 1000
#define META_NS_MAX 64            /* namespace bytes */
#define META_CHUNK 1000           /* keys per script call; a batch pipelines its chunks */
#define META_QUEUE_AUTOFLUSH 4096 /* queued commands that trigger a flush from queue_put */
#define META_SCAN_COUNT "1000"    /* SCAN COUNT hint per re-sync step */
#define META_SCAN_STEPS 64        /* SCAN calls per tick while re-syncing */
#define META_REC_FIELDS 10        /* fields of an object record */
#define META_REC_ARGC 24          /* HSET, the key, the fields and this node's holder entry */
#define META_KEY_MAX 400          /* "ecs:" ns ":obj:" key, with room to spare */

/* A queued command: argv and lengths point into the same allocation. */
typedef struct meta_cmd {
  int argc;          /* number of arguments */
  const char **argv; /* argument bytes (not NUL-terminated) */
  size_t *lens;      /* argument lengths */
} meta_cmd_t;

struct ecs_meta {
  char ns[META_NS_MAX + 1]; /* namespace */
  char node_id[64];         /* server: this node ("" for clients) */
  char addr[128];           /* server: advertised "HOST:PORT" */
  uint64_t pool_size;       /* server: pool bytes */
  uint64_t free_bytes;      /* server: pool bytes free, published with each heartbeat */
  uint64_t epoch;           /* server: this process's epoch */
  uint64_t started_ms;      /* server: wall-clock ms at open, for the registry */
  int timeout_ms;           /* bound on each call */
  int ttl_ms;               /* registry TTL (PEXPIRE) */
  int reconnect_ms;         /* least time between reconnects in tick() */
  int server;               /* node_id given: writes records and a registry entry */
  int no_marks;             /* ecs_meta_nodes() reads no suspicion marks (ecs_meta_opts_t) */

  ecs__rds_t link; /* the Redis link (store/redis/rds.h): down until connected */
  char sha[41];    /* SHA1 of ecs__meta_check_lua, loaded on the link */

  char obj_pfx[META_NS_MAX + 16];   /* "ecs:{ns}:obj:" */
  size_t obj_pfx_len;               /* its length */
  char node_pfx[META_NS_MAX + 16];  /* "ecs:{ns}:node:" */
  char node_key[META_NS_MAX + 96];  /* "ecs:{ns}:node:{id}" */
  char nodes_key[META_NS_MAX + 16]; /* "ecs:{ns}:nodes" */
  char sus_pfx[META_NS_MAX + 24];   /* "ecs:{ns}:suspect:" (suspicion marks, meta_suspect.c) */
  char match[2 * META_NS_MAX + 16]; /* SCAN pattern for records, ns escaped */

  meta_cmd_t *q; /* queued writes */
  size_t qn;     /* queued count */
  size_t qcap;   /* queue capacity */
  int busy;      /* replies pending on c: queue_put must not auto-flush */

  int want_reg;        /* server: keep the registry entry (cleared by unregister) */
  int resync_owed;     /* records may be missing or wrong: sweep + publish owed */
  int sweeping;        /* a sweep is under way at cursor */
  char cursor[32];     /* SCAN cursor of the sweep */
  int hb_valid;        /* last_hb_ms is set */
  uint64_t last_hb_ms; /* caller's clock at the last heartbeat */
  int rc_valid;        /* last_rc_ms is set */
  uint64_t last_rc_ms; /* caller's clock at the last reconnect attempt */

  char errstr[128]; /* last Redis error */

  /* Server, asynchronous mode (ecs_meta_attach_loop): every command goes
   * over alink and nothing waits; the sync link above is used only before
   * the attach (open, the first register) and at shutdown (unregister). */
  int async;                /* attached to a loop: alink carries the traffic */
  ecs__rdsa_t alink;        /* the asynchronous link (store/redis/rds.h) */
  ecs_meta_resync_t rs;     /* the server's re-sync callbacks (copied in tick) */
  int hb_inflight;          /* a heartbeat's replies are awaited */
  int hb_expire_ok;         /* its EXPIRE found the entry */
  int hb_epoch_ok;          /* its HGET found our epoch */
  int sweep_busy;           /* a sweep step's replies are awaited */
  char del_sha[41];         /* SHA1 of ecs__meta_del_lua once SCRIPT LOAD answered ("": send the body) */
  struct meta_del_call *dq; /* eviction deletes not sent yet (one script call at the next flush) */
  size_t dq_cap;            /* bytes allocated for dq's keys */
};

#define META_FIELD(e, j) ((e)->element[j]->type == REDIS_REPLY_STRING)

/* The two Lua scripts (meta_lua.c) and their lengths. */
extern const char ecs__meta_check_lua[]; /* the read check: exists, lookup, sweep */
extern const size_t ecs__meta_check_lua_len;
extern const char ecs__meta_del_lua[]; /* record deletes on behalf of one holder */
extern const size_t ecs__meta_del_lua_len;

/* ---- the blocking link (meta_core.c) ----------------------------------- */

__attribute__((format(printf, 2, 3))) void ecs__meta_seterr(ecs_meta_t *m, const char *fmt, ...);
void ecs__meta_queue_clear(ecs_meta_t *m);
int ecs__meta_not_connected(ecs_meta_t *m);
int ecs__meta_append(ecs_meta_t *m, int argc, const char **argv, const size_t *lens);
int ecs__meta_reply(ecs_meta_t *m, redisReply **out, uint64_t deadline);
uint64_t ecs__meta_deadline(const ecs_meta_t *m);
int ecs__meta_cmd(ecs_meta_t *m, redisReply **out, int argc, const char **argv, const size_t *lens);
int ecs__meta_cmdv(ecs_meta_t *m, redisReply **out, int argc, const char **argv);
int ecs__meta_reply_err(ecs_meta_t *m, const redisReply *r, const char *what);
int ecs__meta_load_script(ecs_meta_t *m);
int ecs__meta_connect(ecs_meta_t *m);
int ecs__meta_ensure_link(ecs_meta_t *m);

/* ---- records and the check script (meta_records.c) --------------------- */

/* The HSET of one record, formatted into f (which argv points into). */
typedef struct meta_rec_fmt {
  char key[META_KEY_MAX], epoch[24], off[24], len[24], raw[24], dtype[8], shape[ECS_MAX_DIMS * 21 + 1],
      csum[17], codec[8], t[24];
  char holder[2 + 64];             /* "h:{node}": this node holds a copy (replicas) */
  const char *argv[META_REC_ARGC]; /* HSET key field value ... */
  size_t lens[META_REC_ARGC];      /* their lengths */
} meta_rec_fmt_t;

/*
 * ecs__meta_run_check runs ecs__meta_check_lua in `mode` over keys[0..n)
 * (each 1..ECS_MAX_KEY bytes, already checked), as pipelined chunks of
 * META_CHUNK keys: one round trip.  Calls each(ctx, i, element) for every
 * key's result.  On failure nothing has been passed to each() for sure, so
 * callers reset their outputs.
 */
typedef void (*meta_each_fn)(void *ctx, size_t i, const redisReply *e);

typedef struct meta_batch {
  const uint8_t *const *keys; /* the caller's keys */
  const uint16_t *lens;       /* their lengths */
  const size_t *idx;          /* positions of the valid keys */
  size_t n;                   /* number of valid keys */
  char mode[2];               /* "e", "l" or "s" */
  char nk[24];                /* scratch: one chunk's key count */
  const char **argv;          /* scratch: one chunk's arguments */
  size_t *argl;               /* scratch: their lengths */
  char *kbuf;                 /* scratch: one chunk's Redis keys */
} meta_batch_t;

size_t ecs__meta_obj_key(const ecs_meta_t *m, char *buf, const void *key, uint16_t key_len);
int ecs__meta_rec_format(const ecs_meta_t *m, const ecs_meta_rec_t *rec, meta_rec_fmt_t *f);
int ecs__meta_chunk_argv(ecs_meta_t *m, meta_batch_t *b, size_t ci, int eval);
int ecs__meta_is_noscript(const redisReply *r);
int ecs__meta_run_check(ecs_meta_t *m, meta_batch_t *b, meta_each_fn each, void *ctx);
size_t *ecs__meta_valid_idx(const uint16_t *lens, size_t n, size_t *nvalid);

/* ---- suspicion marks (meta_suspect.c) ----------------------------------- */

/* Appends GET and PTTL of node id's mark (id_len bytes) to the pipeline. */
int ecs__meta_suspect_append(ecs_meta_t *m, const char *id, size_t id_len);
/* Reads those two replies into *ms: the mark's time left when it names
 * epoch and has a TTL, else 0.  ECS_OK or the link's error (link down). */
int ecs__meta_suspect_read(ecs_meta_t *m, uint64_t epoch, uint64_t deadline, uint64_t *ms);

/* ---- the rest ---------------------------------------------------------- */

int ecs__meta_heartbeat(ecs_meta_t *m); /* meta_registry.c */
void ecs__meta_async_write(ecs_meta_t *m, int argc, const char **argv, const size_t *lens); /* meta_write.c */
void ecs__meta_dq_flush(ecs_meta_t *m);                                                     /* meta_write.c */
int ecs__meta_sweep_step(ecs_meta_t *m, const ecs_meta_resync_t *rs, int *done); /* meta_resync.c */
int ecs__meta_resync(ecs_meta_t *m, const ecs_meta_resync_t *rs);                /* meta_resync.c */
void ecs__meta_sweep_start(ecs_meta_t *m);                                       /* meta_resync.c */
int ecs__meta_acmd(ecs_meta_t *m, ecs__rdsa_fn fn, void *ctx, int argc, const char **argv,
                   const size_t *lens);                                                /* meta_async.c */
int ecs__meta_tick_async(ecs_meta_t *m, uint64_t now_ms, const ecs_meta_resync_t *rs); /* meta_async.c */

/* How often a server checks its registry entry: every ttl/3, and at least
 * once a second, so that an entry deleted (or rewritten) by anyone else
 * who may write the namespace's keys is put back within a second, not at
 * the next ttl/3 (issue 23 N9: live objects read as absent meanwhile). */
static inline uint64_t ecs__meta_hb_period_ms(const ecs_meta_t *m) {
  uint64_t p = (uint64_t)m->ttl_ms / 3u;
  return p < 1000u ? p : 1000u;
}

/* Whether an HMGET epoch addr reply names this server's epoch and
 * address: else the entry was lost or rewritten by someone else, and the
 * heartbeat registers it again (meta_registry.c). */
int ecs__meta_entry_ours(const ecs_meta_t *m, const struct redisReply *r);

/* 0 when s is printable ASCII without spaces, 1..max bytes; else -1
 * (namespaces, node ids). */
int ecs__meta_check_name(const char *s, size_t max);

#endif
