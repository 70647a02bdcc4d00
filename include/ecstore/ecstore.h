/*
 * libecstore: the client library of the ecstore tensor store.
 *
 * A client holds one connection per configured server (TCP) and optionally
 * one to Redis.  Every data call takes a batch of N items and fills N
 * per-item statuses, so one bad item never fails its neighbours; the return
 * value is ECS_OK when every server answered, or the first whole-batch
 * error (ECS_ETIMEDOUT, ECS_ECONN, ...) -- the items that error touched
 * carry it as their status too.
 *
 * Placement, with a servers list: an object lives on the server chosen by
 * hashing its key over the list, so every client of one store must list
 * the same servers in the same order.  With only a Redis URL (discovery,
 * docs/multihost.md): the servers are those live in Redis's node registry
 * (joins and departures seen without a restart), a put goes where
 * config.placement says and the server records it in Redis, and a get
 * looks each key's holder up in Redis (one round trip per batch) and
 * fetches from the holders in parallel; an object whose holder died or
 * restarted is a miss (ECS_ENOTFOUND), never an error for the batch.
 *
 * Deadlines: every call finishes within config.timeout_ms, a connect and
 * HELLO it makes included (each connect attempt also within
 * connect_timeout_ms, and never past what is left of the call's deadline);
 * ecs_client_connect() is a call too: timeout_ms for all its servers.  A
 * dead or stopped server or Redis becomes ECS_ETIMEDOUT or ECS_ECONN, never
 * a hang.  A connection that failed is dropped and re-opened by the next
 * call.
 *
 * Ownership: the library never keeps pointers to keys, tensors or buffers
 * after a call returns.  Buffers filled by ecs_get_batch_alloc() belong to
 * the caller, who frees them with ecs_free().
 *
 * Thread safety: a client handle must not be used by two threads at once;
 * use one handle per thread (they are cheap) or a lock of your own.
 * Different handles are independent.
 */
#ifndef ECSTORE_ECSTORE_H
#define ECSTORE_ECSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/export.h"
#include "ecstore/error.h"
#include "ecstore/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ECS_VERSION_STRING "0.1.0"

typedef struct ecs_client ecs_client_t;

typedef struct ecs_client_config {
  const char *servers;      /* "HOST:PORT[,HOST:PORT...]", or NULL (the default): with a
                               redis_url, the servers come from Redis's node registry
                               (discovery, docs/multihost.md); without one, "127.0.0.1:7700" */
  const char *redis_url;    /* "redis://HOST:PORT[/DB]" or NULL: exists_batch then asks the servers */
  const char *ns;           /* namespace, e.g. the model name (default "default") */
  const char *auth_token;   /* token the servers require, or NULL */
  int connect_timeout_ms;   /* per connection attempt (default 2000) */
  int timeout_ms;           /* deadline of one call (default 10000) */
  int verify_checksum;      /* 1: check xxh3 of every object received (default 1) */
  const char *transport;    /* "auto" (default: shm when the server is on this host, else
                               tcp), "tcp", "shm" (fails connect with ECS_ENOTSUP, saying
                               why, when it cannot be used) or "rdma" (without a device,
                               or against a server without one: one line on stderr, then
                               tcp) */
  const char *rdma_device;  /* RDMA device name (NULL: the first one) */
  int rdma_port;            /* RDMA port number (default 1) */
  int rdma_gid_index;       /* RoCE GID index (default 0) */
  const char *compression;  /* "none" (default), "lz4", "zstd" or "auto" (zstd where a sample
                               shrinks >= 1.1x): codec for puts over TCP, with a byte shuffle
                               for 16/32-bit dtypes; objects are stored as sent and every get
                               returns the raw tensor (docs/codec.md); shm puts stay raw */
  int shm_read_only;        /* 1: map the shared pool read-only (puts then go through the
                               socket); for clients that only get (default 0) */
  uint64_t max_object_size; /* the largest object ecs_get_batch_alloc allocates for (default
                               ECS_DEFAULT_MAX_OBJECT_SIZE; 0: the default); a larger one
                               gets ECS_EBUFSMALL with nbytes set, so a server's word alone
                               never sizes a malloc */
  int shm_server_uid;       /* shm: a uid trusted to own the server's Unix socket besides
                               root and this process's own (default -1: none); a socket
                               held by any other uid is refused before the HELLO (and its
                               token) is sent */
  const char *placement;    /* discovery: where a put goes: "hash" (default: rendezvous
                               hashing over the live servers), "local" (a server on this
                               host, else hash) or "least-loaded" (most free bytes in the
                               registry); ignored with a servers list (key hash) */
  int registry_refresh_ms;  /* discovery: how often the registry is read again (default
                               2000; also re-read after a server fails) */
  int replicas;             /* discovery: copies of each put, on distinct servers (default
                               1, at most ECS_MAX_REPLICAS); an item is ECS_OK when at
                               least one copy is stored (ecs_client_put_copies() counts
                               them); a get reads the nearest live copy and falls back to
                               the others.  Above 1 with a servers list: connect refuses */
} ecs_client_config_t;

/* The most copies config.replicas may ask for. */
#define ECS_MAX_REPLICAS 8

/* max_object_size's default: 4 GiB, far above any embedding tensor. */
#define ECS_DEFAULT_MAX_OBJECT_SIZE (UINT64_C(4) << 30)

/* A key: 1..ECS_MAX_KEY opaque bytes (borrowed for the call). */
typedef struct ecs_key {
  const void *data;
  size_t len;
} ecs_key_t;

/* A tensor to put: nbytes must equal the byte size of desc. */
typedef struct ecs_tensor {
  const void *data;       /* the bytes (borrowed for the call) */
  uint64_t nbytes;        /* byte count */
  ecs_tensor_desc_t desc; /* dtype and shape */
} ecs_tensor_t;

/* One item of a get: in, where to put the bytes; out, what came back. */
typedef struct ecs_get_buf {
  void *data;             /* in: destination (get_batch); out: malloc'd (get_batch_alloc) */
  uint64_t capacity;      /* in: bytes available at data (ignored by get_batch_alloc) */
  int status;             /* out: ECS_OK, ECS_ENOTFOUND, ECS_EBUFSMALL, ECS_ECHECKSUM, ... */
  uint64_t nbytes;        /* out: bytes written (OK) or needed (EBUFSMALL) */
  ecs_tensor_desc_t desc; /* out: dtype and shape (OK and EBUFSMALL) */
} ecs_get_buf_t;

/* A server's counters (see docs/protocol.md, STAT). */
typedef struct ecs_server_stat {
  uint64_t pool_size, bytes_in_use, bytes_free, largest_free, bytes_requested;
  uint64_t objects, puts, gets, hits, misses, evictions, removes;
  uint64_t connections, epoch, redis_ok, pool_locked;
  char node_id[64];
  char address[160];
} ecs_server_stat_t;

/* A counter the server's STAT reply did not carry (a server older than it). */
#define ECS_STAT_UNKNOWN UINT64_MAX

/* The counters STAT gained after ecs_server_stat_t was laid out.  That
 * struct keeps its size and layout, so programs built against an older
 * header still work with this library; the later counters come here, and
 * reserved is room for more without another struct (zeros until then). */
typedef struct ecs_server_stat_ext {
  uint64_t pool_cuda_registered; /* 1 when the pool is registered with CUDA (the server's
                                    --cuda-register took: libcudart loaded, cudaHostRegister
                                    succeeded), 0 when not; ECS_STAT_UNKNOWN from a server
                                    that predates the counter */
  uint64_t reserved[15];         /* 0 */
} ecs_server_stat_ext_t;

/* Fills cfg with the defaults above. */
ECS_API void ecs_client_config_init(ecs_client_config_t *cfg);

/* Connects to every server (HELLO: namespace and token) and to Redis when
 * configured.  A Redis that is down is not a failure: puts and gets need
 * only the servers, and exists asks the servers until Redis answers again.
 * On failure *out is NULL and, when errbuf is given, it says which server
 * failed and why. */
ECS_API int ecs_client_connect(const ecs_client_config_t *cfg, ecs_client_t **out, char *errbuf,
                               size_t errlen);

/* Closes every connection and frees the handle; accepts NULL. */
ECS_API void ecs_client_close(ecs_client_t *c);

/* Detail of the last whole-batch error of this handle ("" if none). */
ECS_API const char *ecs_client_errmsg(const ecs_client_t *c);

/* Soft pin: on (non-zero), every later put and upsert on this handle asks
 * the servers to evict its objects only when no unpinned object can be
 * evicted, for the server's --soft-pin-ttl-ms (Mooncake's soft pin;
 * docs/mooncake.md); off (0) stops asking.  A server older than the flag
 * fails such an item with ECS_EINVAL.  Returns ECS_OK, or ECS_EINVAL for a
 * NULL handle. */
ECS_API int ecs_client_set_soft_pin(ecs_client_t *c, int on);

/* Pins for every later put and upsert on this handle (docs/protocol.md,
 * PUT item flags), until the next call:
 *   ECS_PIN_NONE  none (the default);
 *   ECS_PIN_SOFT  a soft pin (as ecs_client_set_soft_pin), for soft_ttl_ms
 *                 (rounded up to a second; past 32767 s to a minute; at
 *                 most 22 days) or, with 0, the server's --soft-pin-ttl-ms;
 *   ECS_PIN_HARD  a hard pin: the server never evicts the object (FIFO,
 *                 background or a tenant's quota) until it is removed or
 *                 replaced.  Hard pins are bounded by the server's
 *                 --hard-pin-max (a tenant with a quota: its share of it):
 *                 an item past it fails alone with ECS_EPINQUOTA.
 * A server older than these flags fails such items with ECS_EINVAL.
 * Returns ECS_OK, or ECS_EINVAL (NULL handle, unknown kind, a TTL with
 * another kind than ECS_PIN_SOFT). */
#define ECS_PIN_NONE 0
#define ECS_PIN_SOFT 1
#define ECS_PIN_HARD 2
ECS_API int ecs_client_set_pin(ecs_client_t *c, int kind, uint64_t soft_ttl_ms);

/* Copies stored by the last put or upsert on this handle, and the copies
 * it asked for (items sent x config.replicas; without replicas both count
 * items).  stored < wanted: some items have fewer copies than asked for (a
 * server failed, or fewer live servers than replicas); ecs_client_errmsg()
 * then says how many, even when every item is ECS_OK. */
ECS_API void ecs_client_put_copies(const ecs_client_t *c, size_t *stored, size_t *wanted);

/* Stores n tensors.  status[i]: ECS_OK (stored, or already stored with the
 * same content), ECS_ECONFLICT (the key holds different content),
 * ECS_ENOSPC / ECS_ETOOBIG, ECS_EKEY / ECS_EDTYPE / ECS_EINVAL (bad item,
 * never sent), ECS_EREDIS (stored, but Redis did not acknowledge its record
 * within the server's Redis timeout: gets find it, exists through Redis
 * says 0 until the server re-publishes it; ecs_client_errmsg() says so),
 * ECS_EBUSY (another request, from this client or another, was writing the
 * same key and had not stored it when this item's bytes were in: this item
 * stored nothing; retry, and the retry gets ECS_OK when the other write
 * stored the same content, ECS_ECONFLICT when it stored other content), or
 * the whole-batch error. */
ECS_API int ecs_put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                          int *status);

/* As ecs_put_batch, but a key that holds different content is replaced
 * (insert or update) instead of ECS_ECONFLICT.  The new version becomes
 * visible atomically when its bytes are in and checksummed: a get sees the
 * old bytes or the new ones, never a miss or a mix; a reader holding the old
 * version (a get being sent, a shm/RDMA lease or view) finishes on the old
 * bytes, which are freed after it.  The Redis record is overwritten with the
 * new version's.  status[i] as for a put, plus ECS_EBUSY when another
 * request is writing the same key at the moment (retry).  The same key twice
 * in one batch: the first item is written, a repeat with other content gets
 * ECS_ECONFLICT (shm/RDMA paths) or ECS_EBUSY (tcp). */
ECS_API int ecs_upsert_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                             int *status);

/* Fetches n objects into caller buffers: the bytes go from the socket
 * straight into bufs[i].data.  A buffer smaller than the object gives
 * ECS_EBUFSMALL with bufs[i].nbytes = the size needed (no bytes sent).  A
 * checksum mismatch gives ECS_ECHECKSUM (the buffer's contents are then
 * undefined and nbytes is 0). */
ECS_API int ecs_get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n);

/* As ecs_get_batch, but allocates each found object's buffer (one round
 * trip: the sizes arrive before the bytes).  bufs[i].data is NULL unless
 * status is ECS_OK; free it with ecs_free().  An object over the config's
 * max_object_size gives ECS_EBUFSMALL with bufs[i].nbytes its size; a
 * reply whose sizes exceed what was asked, the reply's data section or a
 * codec's bound fails the batch with ECS_EPROTO before any byte is read. */
ECS_API int ecs_get_batch_alloc(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n);

/* A zero-copy view of a stored object (shared-memory path only). */
typedef struct ecs_view {
  const void *data;       /* out: the bytes, in the server's pool, read-only */
  uint64_t nbytes;        /* out: byte count */
  ecs_tensor_desc_t desc; /* out: dtype and shape */
  int status;             /* out: ECS_OK, ECS_ENOTFOUND, ECS_ENOTSUP (not on shm), ... */
  uint64_t lease_;        /* internal: the server-side pin */
  void *map_;             /* internal: the mapping data points into */
  uint32_t srv_;          /* internal: which server */
} ecs_view_t;

/* Pins n objects in the server's shared pool and points views[i].data at
 * them: no byte moves.  A view stays valid until ecs_view_release(), but a
 * server drops a pin held longer than its --lease-timeout-ms (default 30 s)
 * or whose connection broke, after which the bytes may be reused: release
 * views promptly.  Needs the shm transport (items on servers reached over
 * TCP get ECS_ENOTSUP).  With verify_checksum on, each view's bytes are
 * checked once here. */
ECS_API int ecs_get_view_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_view_t *views, size_t n);

/* Releases views (those with status ECS_OK; others are ignored) and clears
 * them.  Never blocks on the server (the release is one-way). */
ECS_API int ecs_view_release(ecs_client_t *c, ecs_view_t *views, size_t n);

/* DLPack tensors over views, for bindings that hand a view's bytes to a
 * framework (torch.from_dlpack) without a copy and must learn when the
 * framework let go of them.  A box makes the tensors; each tensor's deleter
 * (called by the framework when the last tensor over the bytes died, on any
 * thread) queues the item's token in the box, and the owner drains the
 * tokens and releases those views (ecs_view_release, on the views' thread).
 * The box itself is freed once closed and every tensor it made was deleted.
 * Thread safety: drain and the deleters may run concurrently; wrap, drain
 * and close are the owner's (one thread at a time). */
typedef struct ecs_dlbox ecs_dlbox_t;

/* A new, empty box in *out.  ECS_ENOMEM. */
ECS_API int ecs_dlbox_new(ecs_dlbox_t **out);

/* For each view i with status ECS_OK whose description covers exactly its
 * bytes, managed[i] receives a DLManagedTensor * (DLPack's unversioned ABI,
 * CPU device, compact row-major) over views[i].data, with its shape and
 * dtype: f32, f16, bf16, f64, i8, u8, i16, i32, i64 as themselves; f8e4m3,
 * f8e5m2 and bool as uint8, u16/u32/u64 as the signed type of their size
 * (the caller views them as the stored dtype).  Others get NULL.  Item
 * i's deleter queues the token first_token + i.  The views are not taken: keep
 * them pinned until their token comes back.  A made tensor the caller
 * cannot hand over must be deleted through its own deleter.
 * ECS_ENOMEM, ECS_EINVAL (closed box): none made. */
ECS_API int ecs_dlbox_wrap(ecs_dlbox_t *box, const ecs_view_t *views, size_t n, uint64_t first_token,
                           void **managed);

/* Moves up to cap queued tokens (oldest first) into tokens; returns how many. */
ECS_API size_t ecs_dlbox_drain(ecs_dlbox_t *box, uint64_t *tokens, size_t cap);

/* The owner lets go: queued and later tokens are dropped; the box goes
 * with the last tensor it made (at once when none lives).  NULL is fine. */
ECS_API void ecs_dlbox_close(ecs_dlbox_t *box);

/* Registers [ptr, ptr + len) for RDMA transfers (like Mooncake Store's
 * register_buffer): gets into and puts from registered memory go straight
 * to and from the NIC.  Unregistered buffers still work over RDMA, but are
 * registered for each call (slow).  Without RDMA the region is only
 * recorded.  ECS_EBUSY when ptr is already registered. */
ECS_API int ecs_register_buffer(ecs_client_t *c, void *ptr, size_t len);
/* Undoes ecs_register_buffer(ptr).  ECS_ENOTFOUND when it was not registered. */
ECS_API int ecs_unregister_buffer(ecs_client_t *c, void *ptr);

/* "tcp", "shm", "rdma", "unix" (transport shm for a uid the server does
 * not let map its pool: copies over its Unix socket), or "mixed" when
 * servers are reached differently: the data path this handle uses now
 * (discovery: over the servers it is connected to). */
ECS_API const char *ecs_client_transport(const ecs_client_t *c);

/* Frees a buffer from ecs_get_batch_alloc(); accepts NULL. */
ECS_API void ecs_free(void *p);

/* exists[i] = 1 when the object is stored.  Answered from Redis when a
 * Redis URL is configured (the scheduler's call: it does not touch the
 * data servers), else by the servers; when Redis fails or times out (one
 * attempt, bounded by 500 ms and by the call's deadline), the servers
 * answer instead: with a servers list each key's server, with discovery
 * every server of the last registry read, item by item (a server that
 * cannot be reached answers 0 for what it held).  On
 * a whole-batch error every exists[i] is 0 and the error is returned (the
 * message names Redis's failure and the servers'): an error is never
 * "exists". */
ECS_API int ecs_exists_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists);

/* Removes n objects.  status[i]: ECS_OK (removed; with replicas, from at
 * least one holder), ECS_ENOTFOUND (no holder had it, or, with discovery,
 * its holder refused the connection: the copy went with its process),
 * ECS_ETIMEDOUT (with discovery: its holder did not answer within the
 * deadline, stopped or cut off, and may still hold it), ECS_EREDIS
 * (removed, but Redis did not acknowledge the record's delete; the server's
 * re-sync deletes it), ECS_EKEY.  With discovery an unreachable holder
 * never fails the whole call; with a servers list a failed server is the
 * whole-batch error, as for every call. */
ECS_API int ecs_remove_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *status);

/* Where an object is: the holder a get would read it from. */
typedef struct ecs_holder {
  int status;       /* ECS_OK, ECS_ENOTFOUND (no live holder), ECS_EKEY, or the call's error */
  char node_id[64]; /* the holder's node id (the registry's; with a servers list, its HELLO's) */
  char addr[160];   /* its "HOST:PORT" as the registry advertises it (or as configured) */
  int local;        /* 1: that address is on this host */
} ecs_holder_t;

/* Finds each object's holder: with discovery, from its Redis record (one
 * round trip for the batch; the nearest live holder, one on this host
 * first); with a servers list, the server its key hashes to (not asked).
 * out[i].status per item; the return value is Redis's error for the whole
 * batch (every item then carries it), else ECS_OK. */
ECS_API int ecs_locate_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, ecs_holder_t *out);

/* Asks server number `server` of this handle (as ecs_stat numbers them) to
 * fetch n objects from their holders (holders[i]: "HOST:PORT" as
 * ecs_locate_batch gives it) into its own pool, server to server: the
 * bytes travel once, straight into the pool block, checksum-verified, and
 * become ordinary objects of that server (a view on its host then pins
 * them).  The server dials only addresses in its namespace's node
 * registry (and not its own), needs the token's read and write rights,
 * and bounds each fetch by what is left of this call's deadline (and its
 * --pull-timeout-ms).  status[i]: ECS_OK (there now, or already),
 * ECS_ENOTFOUND (the holder has no such object), ECS_EPERM (the address
 * is no registered server of the namespace, or the token lacks a right),
 * ECS_EINVAL (an empty or over-long address, or the server's own),
 * ECS_ETIMEDOUT / ECS_ECONN / ECS_EAUTH (the holder did not answer in
 * time, refused, or did not prove itself), ECS_ECHECKSUM, ECS_ENOSPC,
 * ECS_EQUOTA, ECS_EBUSY (retry: the key is being written there, or the
 * server just started and has not read the registry yet), ECS_EKEY.
 * Returns ECS_OK or the whole-call error: ECS_ENOTSUP when the server
 * cannot pull (it runs without Redis, or is older than PULL: then use get
 * and put), or a transport error. */
ECS_API int ecs_pull_batch(ecs_client_t *c, size_t server, const ecs_key_t *keys, const char *const *holders,
                           size_t n, int *status);

/* Number of configured servers (discovery: server slots seen so far,
 * departed ones included), and the counters of server i. */
ECS_API size_t ecs_client_server_count(const ecs_client_t *c);
ECS_API int ecs_stat(ecs_client_t *c, size_t server, ecs_server_stat_t *st);
/* As ecs_stat, in the same round trip, and the later counters into *ext
 * (which may be NULL). */
ECS_API int ecs_stat_ext(ecs_client_t *c, size_t server, ecs_server_stat_t *st, ecs_server_stat_ext_t *ext);

/* Round trip to every server. */
ECS_API int ecs_ping(ecs_client_t *c);

#ifdef __cplusplus
}
#endif
#endif /* ECSTORE_ECSTORE_H */
