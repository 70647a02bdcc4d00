/*
 * ec_connector: the layer an inference engine calls to move encoder outputs
 * (embeddings keyed by mm_hash) from encoder instances to prefill/decode
 * instances, and KV blocks from prefill to decode.
 *
 * The roles mirror vLLM's ECConnectorBase (docs/connector.md maps them):
 *
 *   producer  (encoder)        ecs_ec_save()        -> save_caches
 *                              ecs_ec_wait_for_save() -> wait_for_save
 *   scheduler                  ecs_ec_has()         -> has_caches
 *   consumer  (prefill/decode) ecs_ec_start_load()  -> start_load_caches
 *                              ecs_ec_wait_for_load(), ecs_ec_poll_load()
 *   P -> D KV handoff          ecs_kv_register(), ecs_kv_lookup(),
 *                              ecs_kv_publish(), ecs_kv_abort(), ecs_kv_fetch()
 *
 * Any connector can play any role; the backend behind it ("ecstore",
 * "disk" or "redis") gives the same semantics for every call.
 *
 * Errors: every function returns ECS_OK (0) or a negative ECS_E* code
 * (ecstore/error.h).  Batch calls also give one status per item: one bad
 * item never fails its neighbours.  For loads, any status other than ECS_OK
 * is a miss the engine recomputes: the bytes at a missed item's destination
 * are unspecified (never reported as data).
 *
 * Deadlines: every wait takes a timeout or is bounded by the configured
 * timeout_ms; a dead server, Redis or peer becomes an error within it.
 * Nothing in this API can block forever.
 *
 * Memory: bounded.  save() copies the caller's bytes into a pinned staging
 * pool of staging_bytes; when the pool or the queue (queue_depth items) is
 * full, save() blocks up to save_timeout_ms for room and then returns
 * ECS_EBUSY.  A tensor larger than the whole staging pool is ECS_ETOOBIG.
 *
 * Ownership: the connector copies every key and every saved tensor; it
 * keeps no pointer to caller memory except the destination buffers of a
 * load, which it writes until that load is complete (every item reported by
 * wait/poll) or released (ecs_ec_load_release()).
 *
 * Thread safety: every function taking a connector may be called from any
 * thread, concurrently with the others (each role uses its own backend
 * handle and lock inside).  ecs_ec_open() and ecs_ec_close() must not race
 * with any other call on the same connector.  A load handle may be used by
 * one thread at a time.  Config functions are pure (no shared state).
 */
#ifndef ECSTORE_EC_CONNECTOR_H
#define ECSTORE_EC_CONNECTOR_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/export.h"
#include "ecstore/ecstore.h"
#include "ecstore/error.h"
#include "ecstore/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ecs_ec_conn ecs_ec_conn_t;
typedef struct ecs_ec_load ecs_ec_load_t;

typedef enum ecs_ec_backend {
  ECS_EC_BACKEND_ECSTORE = 0, /* ecstore-server pool, Redis for metadata (default) */
  ECS_EC_BACKEND_DISK = 1,    /* one file per object in disk_path */
  ECS_EC_BACKEND_REDIS = 2    /* header + bytes in one Redis key per object */
} ecs_ec_backend_t;

/* Configuration.  Strings are stored inline (no ownership to manage); the
 * JSON key of each field is given in brackets, defaults in parentheses.
 * See docs/connector.md for the full table. */
typedef struct ecs_ec_config {
  int backend;            /* [backend] "ecstore" | "disk" | "redis" (ecstore) */
  char servers[1024];     /* [servers] "HOST:PORT[,...]" or a JSON array ("": the servers in
                             redis_url's registry, docs/multihost.md) */
  char redis_url[256];    /* [redis_url] "redis://HOST:PORT[/DB]" or "HOST:PORT" ("") */
  char ns[128];           /* [namespace] key namespace, e.g. the model (default) */
  char auth_token[256];   /* [auth_token] token the ecstore servers require ("") */
  char protocol[16];      /* [protocol] "auto" | "tcp" | "shm" | "rdma" (auto) */
  char device[64];        /* [device] RDMA device name ("" : the first one) */
  int rdma_port;          /* [rdma_port] RDMA port number (1) */
  int rdma_gid_index;     /* [rdma_gid_index] RoCE GID index (0) */
  char compression[16];   /* [compression] "none" | "lz4" | "zstd" | "auto" (none) */
  int connect_timeout_ms; /* [connect_timeout_ms] one connection attempt (2000) */
  int timeout_ms;         /* [timeout_ms] one backend round trip / batch (10000) */
  int save_timeout_ms;    /* [save_timeout_ms] how long save() waits for room (5000; 0: never) */
  int verify_checksum;    /* [verify_checksum] check xxh3 of loaded bytes (true) */
  uint64_t staging_bytes; /* [staging_bytes] pinned staging pool, number or "64M" (64M) */
  int queue_depth;        /* [queue_depth] saves queued or unreported at once (256) */
  int batch_size;         /* [batch_size] items per backend batch (32) */
  char disk_path[512];    /* [disk_path] directory of the disk backend ("") */
  int disk_fsync;         /* [disk_fsync] fsync each file before its rename (false) */
  int redis_ttl_s;        /* [redis_ttl_s] expiry of redis-backend objects (0: none) */
  int kv_ttl_s;           /* [kv_ttl_s] expiry of KV request manifests (600) */
  int lookup_retries;     /* [lookup_retries] KV Redis calls: retries of transient errors (5) */
  int retry_backoff_ms;   /* [retry_backoff_ms] first backoff, doubled per retry (20) */

  /* [redis_password_file] Redis AUTH password: the first line of this file,
   * chmod 600 ("": the URL's, else ECSTORE_REDIS_PASSWORD) */
  char redis_password_file[512];
  char placement[16]; /* [placement] servers from the registry: where a save goes, "hash" |
                         "local" | "least-loaded" (hash; ignored with a servers list) */
  int replicas;       /* [replicas] servers from the registry: copies of each save on
                         distinct servers, 1..8 (1; above 1 with a servers list: open fails) */
  /* [sentinel_password_file] a redis-sentinel:// redis_url: the sentinels'
   * own AUTH password, first line of this file, chmod 600 ("": the URL's
   * sentinel_password, else ECSTORE_SENTINEL_PASSWORD) */
  char sentinel_password_file[512];
} ecs_ec_config_t;

/* Fills cfg with the defaults above. */
ECS_API void ecs_ec_config_init(ecs_ec_config_t *cfg);

/* Applies the JSON object json[0..len) on top of cfg (call config_init
 * first).  Unknown keys and bad values are errors: returns ECS_EINVAL and
 * writes into err a message that names the key (or the byte offset of a
 * JSON syntax error); cfg is then unspecified.  len 0: strlen(json). */
ECS_API int ecs_ec_config_parse_json(ecs_ec_config_t *cfg, const char *json, size_t len, char *err,
                                     size_t errlen);

/* As parse_json, on the contents of a file (at most 1 MiB). */
ECS_API int ecs_ec_config_load_file(ecs_ec_config_t *cfg, const char *path, char *err, size_t errlen);

/* "ecstore", "disk", "redis" (or "?"). */
ECS_API const char *ecs_ec_backend_name(int backend);

/* Opens a connector: checks the config, connects the backend (one handle
 * for saves, one for loads, one for has()), starts the worker threads.  A
 * protocol or compression the build or the server cannot honour fails here
 * with ECS_ENOTSUP and says so in err.  On failure *out is NULL. */
ECS_API int ecs_ec_open(const ecs_ec_config_t *cfg, ecs_ec_conn_t **out, char *err, size_t errlen);

/* config_init + parse_json + open, for bindings (ctypes). */
ECS_API int ecs_ec_open_json(const char *json, ecs_ec_conn_t **out, char *err, size_t errlen);

/* Waits up to timeout_ms for queued saves to finish, stops the workers and
 * frees everything; accepts NULL.  Failures not yet collected by
 * wait_for_save are lost: call it first.  Every load handle must have been
 * released before. */
ECS_API void ecs_ec_close(ecs_ec_conn_t *c);

/* The backend in use ("ecstore", "disk", "redis") and its path
 * ("tcp", "shm", "rdma", "file", "redis"). */
ECS_API const char *ecs_ec_describe(const ecs_ec_conn_t *c);

/* ---------------------------------------------------------------- */
/* Producer                                                           */

/* Queues an asynchronous put of t under mm_hash (a NUL-terminated key of
 * 1..ECS_MAX_KEY bytes).  The bytes are copied into pinned staging memory
 * before this returns, so the caller's buffer is free at once.  Errors:
 * ECS_EKEY, ECS_EDTYPE / ECS_EINVAL (nbytes differs from the shape),
 * ECS_ETOOBIG (larger than staging_bytes), ECS_EBUSY (no room within
 * save_timeout_ms: the queue holds queue_depth items, or the staging pool
 * is full; collect failures with wait_for_save to free their slots).  When
 * save returns an error nothing was queued. */
ECS_API int ecs_ec_save(ecs_ec_conn_t *c, const char *mm_hash, const ecs_tensor_t *t);

/* A save that failed, as reported by wait_for_save. */
typedef struct ecs_ec_save_result {
  char mm_hash[ECS_MAX_KEY + 1]; /* the key given to save() */
  int status;                    /* ECS_ECONN, ECS_ETIMEDOUT, ECS_ENOSPC, ECS_ECONFLICT, ... */
} ecs_ec_save_result_t;

/* Blocks (on a condition variable) until no save is queued or in flight,
 * or timeout_ms passes (< 0: config timeout_ms; 0: don't wait).  Moves up
 * to cap failed saves into failed[] and sets *nfailed (both may be NULL/0);
 * failures that did not fit stay and are reported by the next call, so
 * none is ever dropped.  Returns ECS_OK when every save is stored and no
 * failure is left, ECS_ETIMEDOUT when saves are still pending, ECS_EIO
 * when failures were reported or remain. */
ECS_API int ecs_ec_wait_for_save(ecs_ec_conn_t *c, int timeout_ms, ecs_ec_save_result_t *failed, size_t cap,
                                 size_t *nfailed);

/* Saves queued or in flight now (non-blocking). */
ECS_API size_t ecs_ec_save_pending(ecs_ec_conn_t *c);

/* ---------------------------------------------------------------- */
/* Scheduler                                                          */

/* out[i] = 1 when mm_hashes[i] is stored.  Backend ecstore asks Redis (the
 * data servers only while Redis is down), redis asks Redis, disk looks at
 * the files.  On
 * an error every out[i] is 0 and the error is returned: an error is never
 * "exists".  An invalid key gives out[i] = 0 without failing the batch. */
ECS_API int ecs_ec_has(ecs_ec_conn_t *c, const char *const *mm_hashes, size_t n, int *out);

/* ---------------------------------------------------------------- */
/* Consumer                                                           */

/* One item of a load.  Everything is copied by start_load except dst,
 * which must stay valid until the load is complete or released. */
typedef struct ecs_ec_load_item {
  const char *mm_hash;      /* key (NUL-terminated) */
  void *dst;                /* destination buffer */
  uint64_t capacity;        /* bytes available at dst */
  uint64_t expected_nbytes; /* the size the engine expects, or 0: any that fits */
} ecs_ec_load_item_t;

/* What a load gave for one item. */
typedef struct ecs_ec_load_result {
  int status;             /* ECS_OK (hit) or a miss: ECS_ENOTFOUND (absent, evicted),
                             ECS_ECHECKSUM (corrupt), ECS_EBUFSMALL (capacity too small),
                             ECS_EDTYPE (size differs from expected_nbytes),
                             ECS_ECONN / ECS_ETIMEDOUT (backend unreachable),
                             ECS_ECANCELED (released), ECS_EBUSY (still pending) */
  uint64_t nbytes;        /* bytes written (OK), or the object's size when known */
  ecs_tensor_desc_t desc; /* dtype and shape as stored (OK, EBUFSMALL, EDTYPE) */
} ecs_ec_load_result_t;

/* Queues a load of n items and returns at once with a handle in *out.
 * Errors (nothing queued, *out NULL): ECS_EINVAL (n 0 or a NULL dst with a
 * nonzero capacity), ECS_ENOMEM.  An invalid key is a per-item ECS_EKEY. */
ECS_API int ecs_ec_start_load(ecs_ec_conn_t *c, const ecs_ec_load_item_t *items, size_t n,
                              ecs_ec_load_t **out);

/* Blocks until every item of the load is done or timeout_ms passes (< 0:
 * config timeout_ms; 0: don't wait), then writes n results.  Returns
 * ECS_OK when every item is done (each with its hit or miss status), or
 * ECS_ETIMEDOUT when some are still pending (their status is ECS_EBUSY;
 * wait again or release). */
ECS_API int ecs_ec_wait_for_load(ecs_ec_load_t *ld, int timeout_ms, ecs_ec_load_result_t *results);

/* wait_for_load with timeout 0: ECS_OK when complete, else ECS_EBUSY. */
ECS_API int ecs_ec_poll_load(ecs_ec_load_t *ld, ecs_ec_load_result_t *results);

/* Number of items in the load. */
ECS_API size_t ecs_ec_load_size(const ecs_ec_load_t *ld);

/* Cancels the items not started yet (ECS_ECANCELED), waits for the one in
 * flight (bounded by timeout_ms), frees the handle; accepts NULL.  After it
 * returns the connector never touches the load's buffers again. */
ECS_API void ecs_ec_load_release(ecs_ec_load_t *ld);

/* ---------------------------------------------------------------- */
/* Counters                                                           */

typedef struct ecs_ec_stats {
  uint64_t saves, saves_stored, saves_failed, save_bytes; /* producer */
  uint64_t has_calls, has_errors;                         /* scheduler */
  uint64_t loads, load_hits, load_misses, load_bytes;     /* consumer (items) */
  uint64_t staging_in_use;                                /* bytes held in staging now */
} ecs_ec_stats_t;

ECS_API void ecs_ec_stats(ecs_ec_conn_t *c, ecs_ec_stats_t *st);

/* ---------------------------------------------------------------- */
/* P -> D KV handoff                                                  */

/*
 * Workers register in Redis (redis_url is required, for every backend);
 * KV blocks travel through the connector's backend under keys
 * "kv:<request_id>:<i>"; a manifest in Redis says when a request's blocks
 * are all published (or why the request was aborted).  Every KV function
 * writes a human-readable reason into `reason` when it fails.
 */

typedef enum ecs_kv_role { ECS_KV_PREFILL = 1, ECS_KV_DECODE = 2 } ecs_kv_role_t;

#define ECS_KV_ID_MAX 64
#define ECS_KV_ADDR_MAX 160
#define ECS_KV_REASON_MAX 256

typedef struct ecs_kv_worker {
  char instance_id[ECS_KV_ID_MAX]; /* engine instance, [A-Za-z0-9._-]+ */
  int role;                        /* ECS_KV_PREFILL or ECS_KV_DECODE */
  int dp_rank;                     /* data-parallel rank, >= 0 */
  int tp_rank;                     /* tensor-parallel rank, 0..tp_size-1 */
  int tp_size;                     /* tensor-parallel size, >= 1 */
  char address[ECS_KV_ADDR_MAX];   /* where the worker listens, e.g. "10.0.0.5:8100" */
} ecs_kv_worker_t;

/* "prefill", "decode" (or "?"); parse gives ECS_OK or ECS_EINVAL. */
ECS_API const char *ecs_kv_role_name(int role);
ECS_API int ecs_kv_role_parse(const char *s, int *role);

/* Registers a worker.  Idempotent: the same values again succeed (a retry
 * after a network blip is safe); different values for the same (instance,
 * dp_rank, tp_rank), or a role or tp_size differing from the instance's
 * other workers, give ECS_ECONFLICT with the stored values in reason. */
ECS_API int ecs_kv_register(ecs_ec_conn_t *c, const ecs_kv_worker_t *w, char *reason, size_t cap);

/* Removes a worker's registration (ECS_OK or ECS_ENOTFOUND). */
ECS_API int ecs_kv_unregister(ecs_ec_conn_t *c, const ecs_kv_worker_t *w, char *reason, size_t cap);

/* Finds the worker of instance_id at (dp_rank, tp_rank) for the caller
 * `self` (the peer on the other side, whose tp_size must equal the
 * instance's: a mismatch is ECS_EINVAL, "tp size mismatch ...").
 * Transient Redis errors are retried lookup_retries times with backoff.
 * ECS_ENOTFOUND when no such worker is registered. */
ECS_API int ecs_kv_lookup(ecs_ec_conn_t *c, const ecs_kv_worker_t *self, const char *instance_id, int dp_rank,
                          int tp_rank, ecs_kv_worker_t *out, char *reason, size_t cap);

/* Up to cap registered workers of a role (any role when role is 0) into
 * out[], *n = how many were written. */
ECS_API int ecs_kv_list(ecs_ec_conn_t *c, int role, ecs_kv_worker_t *out, size_t cap, size_t *n, char *reason,
                        size_t rcap);

/* Prefill: stores request_id's n KV blocks (synchronously, through the
 * backend) and then its manifest, which wakes the fetchers.  On failure
 * the request is aborted with the reason, so decode sees it at once. */
ECS_API int ecs_kv_publish(ecs_ec_conn_t *c, const char *request_id, const ecs_tensor_t *blocks, size_t n,
                           char *reason, size_t cap);

/* Prefill: aborts request_id with a reason that decode's fetch returns. */
ECS_API int ecs_kv_abort(ecs_ec_conn_t *c, const char *request_id, const char *why);

/* Decode: waits up to timeout_ms (< 0: config timeout_ms) for request_id's
 * manifest (a blocking Redis wait, no polling), then fetches its blocks
 * into bufs[0..cap) (ecs_get_buf_t: data and capacity in; status, nbytes
 * and desc out) and sets *nblocks.  Any failure ends the request: the
 * return is the error (ECS_ETIMEDOUT: not published in time; ECS_ECANCELED:
 * aborted by prefill; ECS_ENOTFOUND / ECS_ECHECKSUM / ECS_EBUFSMALL: a
 * block; ECS_ECONN / ECS_EREDIS: unreachable) and reason says which and
 * why.  Never hangs. */
ECS_API int ecs_kv_fetch(ecs_ec_conn_t *c, const char *request_id, int timeout_ms, ecs_get_buf_t *bufs,
                         size_t cap, size_t *nblocks, char *reason, size_t rcap);

/* Deletes request_id's blocks and manifest (decode, when done). */
ECS_API int ecs_kv_release(ecs_ec_conn_t *c, const char *request_id, size_t nblocks);

#ifdef __cplusplus
}
#endif
#endif /* ECSTORE_EC_CONNECTOR_H */
