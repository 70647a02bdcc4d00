/*
 * RDMA transport: one-sided RDMA READ and WRITE over RC queue pairs.
 *
 * The server gives each client connection an isolated endpoint (its own
 * protection domain) and, per lease and per reservation, a window over
 * that one pool block (ecs_rdma_ep_window: zero-based, remote read for a
 * lease, remote write for a reservation) whose rkey goes back in the
 * LEASE / RESERVE reply and dies at release, commit or expiry; the pool
 * itself is never registered for remote access and its address never
 * leaves the server.  A client registers its own buffers (ecs_rdma_reg,
 * Mooncake's register_buffer); the two ends set up one RC QP pair by
 * swapping fixed-size connection blobs over the TCP control channel; then
 * a get is an RDMA READ from the leased block's window into the client's
 * buffer, and a put is reserve -> RDMA WRITE into the block's window ->
 * commit.  This module moves bytes and nothing else: leases, reservations
 * and commits stay in the TCP protocol.  docs/rdma.md has the design.
 *
 * Every verbs call goes through an operations table (store/rdma/verbs_ops.h)
 * picked at ecs_rdma_ctx_open: libibverbs (ops NULL), or the in-process
 * emulation that the tests use (tests/support/verbs_emu.h).  Built without
 * libibverbs, every call that needs verbs returns ECS_ENOTSUP; the blob
 * codec works in every build.
 *
 * Errors: 0 or a negative ECS_E* code (include/ecstore/error.h).  Batch
 * calls also give one status per item:
 *   ECS_OK         the item's bytes arrived;
 *   ECS_EINVAL     the item was wrong and never posted: local range outside
 *                  its MR, remote range outside the peer's advertised region
 *                  (when it names that region's rkey), or address overflow;
 *   ECS_EIO        the device reported an access or protection error
 *                  (remote access: bad rkey, out of the remote MR's bounds,
 *                  no remote read/write permission; local protection; any
 *                  other error completion);
 *   ECS_ETIMEDOUT  transport retries exceeded (the peer did not answer), or
 *                  the call's deadline passed before the item completed;
 *   ECS_ECANCELED  the item was flushed because another item broke the QP,
 *                  and no reconnect was possible within the call (retry it
 *                  after reconnecting);
 *   ECS_ENOTCONN   the endpoint was not connected and could not reconnect.
 * After an item fails, the bytes of its destination are undefined.
 *
 * Error recovery: any error completion, and any timeout, leaves the QP
 * unusable on both ends (a real RC responder moves to ERR on an access
 * error, and PSNs no longer match).  The endpoint then destroys its QP, after
 * which the device no longer touches the batch's buffers, builds a fresh one
 * (new QP number, new PSN) and needs a new blob exchange.  With an exchange
 * callback set (ecs_rdma_ep_set_exchange) it does that exchange itself,
 * once per call, and retries the flushed items; without one the caller
 * re-exchanges (ecs_rdma_ep_local_blob + the peer's reset + connect).
 *
 * Ownership and lifetime: a context owns its device, PD and nothing else;
 * MRs and endpoints must be destroyed before their context.  An MR must
 * outlive every batch that names it.  Destroy functions accept NULL.
 *
 * Thread safety: a context may be used from several threads for
 * ecs_rdma_reg / ecs_rdma_dereg / ecs_rdma_ep_create (libibverbs is
 * thread-safe there).  An endpoint is used by one thread at a time: its
 * batch calls busy-poll its own CQ up to their deadline.
 */
#ifndef ECS_RDMA_H
#define ECS_RDMA_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/error.h"

struct ecs_verbs_ops;

typedef struct ecs_rdma_ctx ecs_rdma_ctx;
typedef struct ecs_rdma_mr ecs_rdma_mr;
typedef struct ecs_rdma_ep ecs_rdma_ep;

/* Defaults of ecs_rdma_opts (a zeroed struct means all of them). */
#define ECS_RDMA_DEFAULT_PORT 1
#define ECS_RDMA_DEFAULT_SLICE (1u << 20)
#define ECS_RDMA_DEFAULT_OUTSTANDING 16
#define ECS_RDMA_DEFAULT_TIMEOUT_MS 5000
/* Largest slice: one work request's length is 32 bits on the wire. */
#define ECS_RDMA_MAX_SLICE (1u << 30)
/* Largest number of work requests in flight per endpoint. */
#define ECS_RDMA_MAX_OUTSTANDING 1024
/* After a deadline, how long flushed completions may still be collected
 * before the QP is destroyed anyway (the call returns that much late at
 * most). */
#define ECS_RDMA_DRAIN_MS 100

typedef struct ecs_rdma_opts {
  const char *device;  /* device name, e.g. "mlx5_0"; NULL or "": the first one */
  int port;            /* port number; 0: ECS_RDMA_DEFAULT_PORT */
  int gid_index;       /* GID table index (RoCE needs a valid one); default 0 */
  size_t slice_size;   /* bytes per work request; 0: ECS_RDMA_DEFAULT_SLICE */
  int max_outstanding; /* work requests in flight per endpoint; 0: default */
  int timeout_ms;      /* batch deadline when a call passes <= 0; 0: default */
} ecs_rdma_opts;

/* Remote memory permissions for ecs_rdma_reg (local write is always given:
 * READ destinations need it and verbs requires it for remote write). */
#define ECS_RDMA_REMOTE_READ 0x1
#define ECS_RDMA_REMOTE_WRITE 0x2

/* ---- Connection blob ------------------------------------------------------
 *
 * What one end tells the other to connect an RC QP pair, exchanged over the
 * TCP control channel.  Fixed size, little-endian:
 *
 *   off size field
 *     0    4 magic "ECRB" (0x42524345)
 *     4    2 version (1)
 *     6    2 flags: bit 0 = a region follows (an advertised MR; the
 *            store's server sends none: its pool is reached only through
 *            per-lease / per-reservation windows)
 *     8    4 QP number (24 bits, not 0)
 *    12    4 first PSN the sender sends (24 bits)
 *    16    2 LID (0 on RoCE)
 *    18    1 active MTU (IBV_MTU_256..IBV_MTU_4096 = 1..5)
 *    19    1 RDMA READs the sender accepts in flight as responder (>= 1)
 *    20    1 link layer (1 InfiniBand, 2 Ethernet)
 *    21    1 port number
 *    22    2 reserved
 *    24   16 GID (raw, network order as verbs keeps it)
 *    40    8 region address
 *    48    8 region length
 *    56    4 region rkey
 *    60   20 reserved
 *
 * Reserved bytes are sent as zero and ignored on receipt, as are unknown
 * flag bits, so that later fields can be added without a version bump; a
 * change old readers would misread bumps the version.
 */
#define ECS_RDMA_BLOB_SIZE 80
#define ECS_RDMA_BLOB_MAGIC 0x42524345u
#define ECS_RDMA_BLOB_VERSION 1
#define ECS_RDMA_BLOB_F_REGION 0x1

typedef struct ecs_rdma_blob {
  uint32_t qpn;         /* QP number */
  uint32_t psn;         /* first PSN */
  uint16_t lid;         /* LID, 0 on RoCE */
  uint8_t mtu;          /* enum ibv_mtu value */
  uint8_t rd_atom;      /* responder READ depth offered */
  uint8_t link_layer;   /* IBV_LINK_LAYER_* */
  uint8_t port;         /* port number */
  uint8_t gid[16];      /* GID */
  int has_region;       /* 1: the region fields are set */
  uint64_t region_addr; /* advertised region: address */
  uint64_t region_len;  /* length */
  uint32_t region_rkey; /* rkey */
} ecs_rdma_blob;

/* Writes b in the wire format.  ECS_EINVAL when a field does not fit it. */
int ecs_rdma_blob_encode(const ecs_rdma_blob *b, uint8_t out[ECS_RDMA_BLOB_SIZE]);

/* Parses and checks len bytes from the network: ECS_EPROTO when the length,
 * magic or version is wrong or a field is out of range (QP number 0 or over
 * 24 bits, PSN over 24 bits, MTU not 1..5, READ depth 0, link layer
 * unknown, a region of length 0 or that wraps around).  No I/O. */
int ecs_rdma_blob_decode(const void *buf, size_t len, ecs_rdma_blob *out);

/* ---- Context ----------------------------------------------------------- */

/* Opens the device named in opts (NULL opts: all defaults) through ops
 * (NULL: libibverbs).  Errors, with one line in errbuf when given:
 *   ECS_ENODEV   no RDMA device at all ("rdma: no RDMA device found"), the
 *                named device missing, or the port not active: the client
 *                falls back to TCP;
 *   ECS_ENOTSUP  built without libibverbs;
 *   ECS_EINVAL   bad options (port, GID index, empty RoCE GID entry);
 *   ECS_EIO / ECS_ENOMEM  the device refused. */
/* A process-wide verbs table that the server and the client pass to
 * ecs_rdma_ctx_open() instead of libibverbs (NULL: libibverbs).  Tests set
 * it to the in-process emulation before starting either; not for
 * production use.  Not thread-safe against concurrent ctx_open. */
void ecs__rdma_set_ops_override(const struct ecs_verbs_ops *ops);
const struct ecs_verbs_ops *ecs__rdma_ops_override(void);

int ecs_rdma_ctx_open(const ecs_rdma_opts *opts, const struct ecs_verbs_ops *ops, ecs_rdma_ctx **out,
                      char *errbuf, size_t errlen);

/* Closes the device; every MR and endpoint must be gone.  Accepts NULL. */
void ecs_rdma_ctx_close(ecs_rdma_ctx *ctx);

/* The opened device's name, e.g. "mlx5_0" (valid while ctx lives). */
const char *ecs_rdma_ctx_device(const ecs_rdma_ctx *ctx);

/* ---- Memory registration ----------------------------------------------- */

/* Registers [ptr, ptr+len) with local write plus the ECS_RDMA_REMOTE_*
 * permissions in access.  The memory stays pinned until ecs_rdma_dereg and
 * must outlive the MR.  ECS_EINVAL, ECS_ENOMEM or ECS_EIO (errno from the
 * device, e.g. over the memlock limit). */
int ecs_rdma_reg(ecs_rdma_ctx *ctx, void *ptr, size_t len, int access, ecs_rdma_mr **out);

/* Deregisters; no batch may still name the MR.  Accepts NULL. */
void ecs_rdma_dereg(ecs_rdma_mr *mr);

/* What a peer needs to address this MR remotely (the address is 0 for a
 * window: zero-based). */
uint64_t ecs_rdma_mr_addr(const ecs_rdma_mr *mr);
uint64_t ecs_rdma_mr_len(const ecs_rdma_mr *mr);
uint32_t ecs_rdma_mr_rkey(const ecs_rdma_mr *mr);

/* ---- Endpoints ----------------------------------------------------------- */

/* Creates an endpoint: a CQ and an RC QP, ready for a blob exchange.
 * advertise (NULL: none) is the MR that the endpoint's blobs advertise as
 * its region (the store's server advertises none, see
 * ecs_rdma_ep_create_isolated; tests and tools may).  It must outlive the
 * endpoint. */
int ecs_rdma_ep_create(ecs_rdma_ctx *ctx, const ecs_rdma_mr *advertise, ecs_rdma_ep **out);

/* An endpoint with its own protection domain: its QP reaches only memory
 * registered for it with ecs_rdma_ep_window, never the context's MRs nor
 * another endpoint's windows (the responder checks that an rkey belongs to
 * the QP's PD), so a client cannot use an rkey it learned or guessed from
 * another connection.  Its blobs advertise no region.  The server makes
 * one per client connection.  Not for a side that posts work requests
 * from ecs_rdma_reg buffers (those live in the context's PD). */
int ecs_rdma_ep_create_isolated(ecs_rdma_ctx *ctx, ecs_rdma_ep **out);

/* A window over [ptr, ptr+len) for the peer of an isolated endpoint: a
 * registration in the endpoint's PD, zero-based (the peer addresses it as
 * [0, len), so ptr is never revealed), with only the ECS_RDMA_REMOTE_*
 * access asked for.  Give its rkey (ecs_rdma_mr_rkey) to the peer; close it
 * with ecs_rdma_dereg, after which the rkey fails with a remote access
 * error.  Windows must be closed before their endpoint is destroyed and
 * cannot be a local buffer of a batch (ECS_EINVAL).  ECS_EINVAL (not an
 * isolated endpoint, empty range, no access), ECS_ENOMEM or ECS_EIO. */
int ecs_rdma_ep_window(ecs_rdma_ep *ep, void *ptr, size_t len, int access, ecs_rdma_mr **out);

/* Destroys the QP and CQ (and an isolated endpoint's PD); accepts NULL. */
void ecs_rdma_ep_destroy(ecs_rdma_ep *ep);

/* The blob to send to the peer for the endpoint's current QP.  It changes
 * whenever the QP is rebuilt (after an error or ecs_rdma_ep_reset). */
int ecs_rdma_ep_local_blob(ecs_rdma_ep *ep, uint8_t out[ECS_RDMA_BLOB_SIZE]);

/* Connects the current QP to the peer that sent blob (len bytes, straight
 * from the network: checked as ecs_rdma_blob_decode does, and against this
 * port: same link layer, an address it can route to).  ECS_EPROTO for a bad
 * blob, ECS_EBUSY when already connected (reset first), ECS_EIO when the
 * device refuses the transition (the QP is then rebuilt: exchange again). */
int ecs_rdma_ep_connect(ecs_rdma_ep *ep, const void *blob, size_t len);

/* Drops the current QP (connected or not) and builds a fresh one, waiting
 * for a blob exchange.  The server calls it when a client reconnects. */
int ecs_rdma_ep_reset(ecs_rdma_ep *ep);

/* 1 when connected, 0 when a blob exchange is needed. */
int ecs_rdma_ep_connected(const ecs_rdma_ep *ep);

/* The region the peer advertised: ECS_OK, ECS_ENOTCONN before a connect,
 * ECS_ENOTFOUND when its blob had none. */
int ecs_rdma_ep_peer_region(const ecs_rdma_ep *ep, uint64_t *addr, uint64_t *len, uint32_t *rkey);

/* The current QP number (0 while no QP exists), for logs and tests. */
uint32_t ecs_rdma_ep_qpn(const ecs_rdma_ep *ep);

/* A detail line about the endpoint's last error ("" if none). */
const char *ecs_rdma_ep_errmsg(const ecs_rdma_ep *ep);

/* Sends local to the peer over the control channel and fills peer with its
 * answer (the peer resets its endpoint and connects it to local first), in
 * at most timeout_ms.  Returns 0 or an ECS_E* code. */
typedef int (*ecs_rdma_exchange_fn)(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE],
                                    uint8_t peer[ECS_RDMA_BLOB_SIZE], int timeout_ms);

/* Lets batch calls reconnect by themselves (see "Error recovery" above);
 * fn NULL turns it off.  fn runs on the batch's thread. */
void ecs_rdma_ep_set_exchange(ecs_rdma_ep *ep, ecs_rdma_exchange_fn fn, void *arg);

typedef struct ecs_rdma_ep_stats {
  uint64_t items_ok;   /* items that completed */
  uint64_t items_err;  /* items that ended with an error */
  uint64_t bytes;      /* bytes of items that completed */
  uint64_t wrs;        /* work requests posted */
  uint64_t err_wcs;    /* error completions, flushes included */
  uint64_t rebuilds;   /* QPs rebuilt after an error or timeout */
  uint64_t reconnects; /* exchanges made through the exchange callback */
  uint64_t timeouts;   /* calls that hit their deadline */
} ecs_rdma_ep_stats;

void ecs_rdma_ep_get_stats(const ecs_rdma_ep *ep, ecs_rdma_ep_stats *out);

/* ---- Data transfer ----------------------------------------------------- */

/* One transfer between a local registered buffer and peer memory. */
typedef struct ecs_rdma_item {
  ecs_rdma_mr *local;   /* registered local buffer */
  uint64_t local_off;   /* offset of the bytes in it */
  uint64_t remote_addr; /* peer address (offset in a zero-based window, or region address + offset) */
  uint32_t rkey;        /* peer MR key */
  uint64_t len;         /* bytes; 0 moves nothing and succeeds */
} ecs_rdma_item;

/* Reads (peer -> local) or writes (local -> peer) n items.  Each item is
 * cut into slices of the context's slice size; at most max_outstanding
 * slices are in flight; completions are polled until every item is done or
 * timeout_ms (<= 0: the context's default) has passed, never longer (plus
 * at most ECS_RDMA_DRAIN_MS to collect flushes after a timeout).  When the
 * call returns, the device no longer touches any of the items' buffers.
 *
 * Returns 0 when the call ran (status[i] then says how each item ended, see
 * the top of this file), or a whole-call error, also written to every
 * status[i]: ECS_EINVAL (NULL arguments), ECS_ENOMEM, ECS_ENOTCONN (not
 * connected, no exchange callback or it failed), ECS_ENOTSUP. */
int ecs_rdma_read_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms);
int ecs_rdma_write_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms);

#endif /* ECS_RDMA_H */
