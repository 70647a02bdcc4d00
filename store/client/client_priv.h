/*
 * Internals shared by the client's modules.  Not installed.
 *
 * The files and who calls whom (no cycles; each uses only those below it):
 *
 *   client.c        the batch calls: put, upsert, get, view, exists,
 *                   remove, stat, ping; per-item statuses; calls a data
 *                   path only through its ecs_cli_ops_t table
 *   client_route.c  route by key or by the holders Redis lists, split a
 *                   batch by server, run the shares (threads, deadline),
 *                   try an item's other copies
 *   client_setup.c  config defaults and checks, connect / close, choosing
 *                   the path, connecting a server on demand
 *   client_place.c  servers from the Redis registry, put placement
 *                   (hash / local / least-loaded), locating a get's keys
 *   client_tcp.c    the socket path (tcp, and a read-only shm mapping's puts)
 *   client_shm.c    the shared-memory path (a server on this host)
 *   client_rdma.c   the RDMA path
 *   client_lease.c  LEASE / RELEASE and RESERVE -> write -> COMMIT, which
 *                   the shm and RDMA paths share
 *   client_conn.c   one connection: send a request, read and check a reply,
 *                   HELLO, drop; delivering a stored object to a buffer
 */
#ifndef ECS_CLIENT_PRIV_H
#define ECS_CLIENT_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ecstore/ecstore.h"
#include "store/redis/meta.h"
#include "store/core/net.h"
#include "store/core/proto.h"

#define ECS_CLI_MAX_SERVERS 64
#define ECS_CLI_IOV_CHUNK 256

/* A mapping of a server's pool (shm).  Views keep it alive: after a
 * reconnect the old mapping is retired, and unmapped when its last view is
 * released. */
typedef struct ecs_shm_map {
  uint8_t *base;  /* mmap'd pool */
  size_t len;     /* bytes mapped */
  int writable;   /* mapped PROT_WRITE (we may put in place) */
  uint32_t views; /* views handed out and not yet released */
  int retired;    /* replaced by a newer mapping */
} ecs_shm_map_t;

typedef struct ecs_cli_srv ecs_cli_srv_t;

/*
 * A data path: what differs between tcp, shm and RDMA.  One static const
 * table per path (client_tcp.c, client_shm.c, client_rdma.c); a connected
 * server points at the table of the path it is on.  Everything else (HELLO,
 * exists, remove, stat, ping) is the same request over the server's socket
 * whatever the path.
 *
 * Every data op handles one server's share of a batch: the items idx[0..m)
 * (indices into the caller's arrays, at most ECS_PROTO_MAX_ITEMS), on a
 * server that is connected and greeted.  Like a syscall, it returns 0 or a
 * negative ECS_E* code: 0 when every item has its own status (which may be
 * an error); an error when the share failed as a whole, in which case the
 * connection has been dropped (ecs__cli_fail) unless the error is
 * ECS_ENOMEM before anything was sent, and the driver gives the items that
 * error.  An op may be re-run on a fresh connection after ECS_ECONN (every
 * request is idempotent).
 */
typedef struct ecs_cli_ops {
  /* What ecs_client_transport() reports for a server on this path. */
  const char *name;
  /* Moves server s, connected and greeted over TCP, onto this path.
   * ECS_OK: s->ops is now this path's table (or a variant of it).  An
   * error: c->errmsg says why, and s is left on TCP: still connected,
   * unless the failure broke the connection (then s->fd is -1).  NULL:
   * nothing to set up (tcp). */
  int (*upgrade)(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);
  /* Stores ts[idx[j]] under keys[idx[j]]; sets status[idx[j]]. */
  int (*put)(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
             const size_t *idx, size_t m, int *status, uint64_t deadline);
  /* Fetches keys[idx[j]] into bufs[idx[j]] (the caller's buffer, or, with
   * alloc, one it mallocs); sets each buffer's status, nbytes and desc. */
  int (*get)(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs, const size_t *idx,
             size_t m, int alloc, uint64_t deadline);
  /* Leases keys[idx[j]] and points views[idx[j]] at the bytes in place.
   * NULL: the path has no views (every item gets ECS_ENOTSUP). */
  int (*view)(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_view_t *views, const size_t *idx,
              size_t m, uint64_t deadline);
  /* Frees what the path holds for s (an endpoint, a mapping) when its
   * connection closes; s->fd is already closed.  NULL: nothing. */
  void (*drop)(ecs_cli_srv_t *s);
} ecs_cli_ops_t;

struct ecs_cli_srv {
  char host[128];           /* from the config */
  int port;                 /* from the config */
  char addr[160];           /* "HOST:PORT" as configured */
  int fd;                   /* the connection (TCP, or the Unix socket on the shm path); -1 */
  const ecs_cli_ops_t *ops; /* the data path while connected; NULL while not */
  char node_id[64];         /* from HELLO */
  uint64_t epoch;           /* from HELLO */
  uint64_t max_data;        /* from HELLO */
  char shm_path[108];       /* the server's Unix socket, from HELLO over TCP */
  uint64_t up_id;           /* the shm upgrade secret's id, from that HELLO (0: none) */
  uint8_t up_secret[32];    /* that one-time secret (ECS_UPGRADE_SECRET_SIZE), wiped once used */
  ecs_shm_map_t *map;       /* the pool mapping while on the shm path */
  struct ecs_rdma_ep *ep;   /* RDMA endpoint while on the RDMA path */
  struct ecs_client *cli;   /* the owning client (for the RDMA exchange callback) */
  /* discovery (client_place.c): the slot's node as the registry lists it */
  char reg_id[64];     /* its node id in the registry ("" for a configured server) */
  uint64_t reg_epoch;  /* its epoch in the registry */
  uint64_t free_bytes; /* pool bytes free at its last heartbeat */
  int live;            /* 1: usable (configured, or in the registry at the last refresh) */
  int local;           /* 1: its address is one of this host's */
  uint64_t down_until; /* it refused or timed out: suspect until then (ms): placement skips
                          it, and with discovery calls answer its items at once */
  unsigned fails;      /* failures in a row: the suspicion's back-off doubles with each */
  int down_rc;         /* the last failure: ECS_ECONN (refused) or ECS_ETIMEDOUT */
  /* other clients' suspicion, from their marks in Redis (client_place.c) */
  uint64_t mark_until;  /* a mark makes it suspect until then (ms; 0: none) */
  uint64_t mark_since;  /* when this client began to follow marks of it (0: not now) */
  uint64_t trust_until; /* it answered this client after a suspicion: marks ignored until then */
  int publish;          /* ECS_CLI_PUB_*: what to tell Redis after the batch (set by its share) */
  int pub_ttl_ms;       /* ...this client's back-off (the mark lives a deadline longer) */
};

/* What a share found out that other clients should learn (published by the
 * calling thread once the batch's threads are joined; client_route.c). */
#define ECS_CLI_PUB_NONE 0
#define ECS_CLI_PUB_MARK 1  /* it failed: mark it suspect for pub_ttl_ms */
#define ECS_CLI_PUB_CLEAR 2 /* it answered after a suspicion: withdraw the mark */

/* What to do when a server cannot be moved onto the path asked for. */
typedef enum ecs_cli_fallback {
  ECS_FALLBACK_QUIET = 0, /* stay on TCP (transport "auto") */
  ECS_FALLBACK_SAY = 1,   /* stay on TCP and say so on stderr ("rdma") */
  ECS_FALLBACK_NONE = 2   /* fail the connection ("shm") */
} ecs_cli_fallback_t;

/* A buffer given to ecs_register_buffer (mr NULL without an RDMA device). */
typedef struct ecs_cli_reg {
  void *ptr;
  size_t len;
  struct ecs_rdma_mr *mr;
} ecs_cli_reg_t;

struct ecs_client {
  ecs_client_config_t cfg; /* strings below are owned copies */
  char *servers_s, *redis_s, *ns_s, *token_s;
  ecs_cli_srv_t srv[ECS_CLI_MAX_SERVERS];
  size_t nsrv;
  const ecs_cli_ops_t *path;   /* the path asked for (tcp: nothing to upgrade to) */
  ecs_cli_fallback_t fallback; /* when a server cannot take that path */
  int codec;                   /* request codec for TCP puts (store/core/codec.h), or ECS_CODEC_NONE */
  uint8_t put_flags;           /* ECS_PUT_F_* for the put in progress (ecs_upsert_batch sets UPSERT) */
  uint8_t sticky_put_flags;    /* ECS_PUT_F_* for every put until changed (ecs_client_set_pin) */
  uint16_t sticky_pin_ttl;     /* the items' pin_ttl with ECS_PUT_F_PIN_TTL (ecs_client_set_pin) */
  struct ecs_rdma_ctx *rdma;   /* RDMA device context (transport rdma), or NULL */
  ecs_cli_reg_t *regs;         /* registered buffers */
  size_t nregs, regs_cap;      /* count and capacity */
  ecs_meta_t *meta;            /* Redis link for exists_batch (and discovery), or NULL */
  int discover;                /* servers come from the Redis registry (no servers configured) */
  int placement;               /* ECS_PLACE_*: where a discovery put goes */
  uint64_t next_refresh_ms;    /* discovery: when the registry is read again */
  uint64_t redis_retry_ms;     /* after a Redis failure, exists asks the servers until then */
  uint64_t call_deadline;      /* the public call under way: its one deadline (ms); 0 outside */
  size_t copies_stored;        /* copies the last put stored (replicas) */
  size_t copies_wanted;        /* copies it asked for: items x replicas */
  uint32_t next_req;           /* request ids */
  uint8_t *rmeta;              /* reply records buffer */
  size_t rmeta_cap;            /* its size */
  ecs_wbuf_t w;                /* request records */
  char errmsg[256];            /* last whole-batch error detail */
};

/* How long exists skips a Redis that just failed (then tries it again). */
#define ECS_CLI_REDIS_RETRY_MS 1000

/* The deadline of the call under way: set once when a public call starts
 * (ecs__cli_begin), so that its phases (the Redis lookup, each round of
 * copies, each server's share) share it instead of each taking a fresh
 * timeout_ms (issue 24: a remove batch overran its deadline by a connect
 * timeout). */
static inline uint64_t ecs__cli_deadline(const ecs_client_t *c) {
  return c->call_deadline ? c->call_deadline : ecs_now_ms() + (uint64_t)c->cfg.timeout_ms;
}

static inline void ecs__cli_begin(ecs_client_t *c) {
  c->call_deadline = ecs_now_ms() + (uint64_t)c->cfg.timeout_ms;
}

static inline int ecs__cli_end(ecs_client_t *c, int rc) {
  c->call_deadline = 0;
  ecs_meta_set_deadline(c->meta, 0); /* the Redis budget was this call's */
  return rc;
}

/* How long a client waits for Redis, at most: the server's default Redis
 * timeout, and half of what is left of the call (the servers answer in the
 * other half: exists when Redis failed, the data after a lookup).  Lookups
 * that find nothing within it fail their batch (gets) or send exists to
 * the servers. */
#define ECS_CLI_REDIS_TIMEOUT_MS 500

/* The end of the Redis budget from now, as above (client_route.c). */
uint64_t ecs__cli_redis_until(const ecs_client_t *c);
/* Caps the Redis handle's waits as above: each step, and all of them
 * together, a (re)connect's included (client_route.c). */
void ecs__cli_redis_budget(ecs_client_t *c);

/* ---- client_place.c: discovery, placement, location ----------------- */

/* Where a put goes when the servers come from the registry. */
enum { ECS_PLACE_HASH = 0, ECS_PLACE_LOCAL = 1, ECS_PLACE_LEAST_LOADED = 2 };

/* No server for an item (none live, or its holder is gone). */
#define ECS_CLI_NOWHERE ((size_t)-1)

/* How long placement avoids a server whose connection just failed. */
#define ECS_CLI_DOWN_MS 3000
/* The longest suspicion: a holder that keeps failing is probed at least
 * this often (by the first call that would use it). */
#define ECS_CLI_DOWN_MAX_MS 24000

/* The longest another client's mark keeps a server suspect here, from the
 * first mark followed; then one call probes it whatever the marks say.
 * So a mark (a rogue one included: anyone who may write the namespace's
 * keys may write one) costs at most this much of a server's items per
 * ECS_CLI_TRUST_MS, and never more than Redis's TTL says. */
#define ECS_CLI_MARK_MAX_MS 8000
/* After a server answered this client following a suspicion (its own or
 * a mark's), marks of it are ignored this long. */
#define ECS_CLI_TRUST_MS 24000

/* Server s refused or timed out: suspect for ECS_CLI_DOWN_MS, doubled for
 * each failure in a row, and published for other clients (client_route.c). */
void ecs__cli_suspect(ecs_cli_srv_t *s, int rc);
/* Whether s is suspect at now: its own failures', or others' marks. */
static inline int ecs__cli_is_suspect(const ecs_cli_srv_t *s, uint64_t now) {
  return s->down_until > now || s->mark_until > now;
}
/* Applies a node's mark (mark_ms: its time left, 0: none) to s at now, as
 * the registry refresh reads it every refresh_ms (client_place.c). */
void ecs__cli_follow_mark(ecs_cli_srv_t *s, uint64_t mark_ms, uint64_t now, uint64_t refresh_ms);

/* Parses cfg.placement into c->placement; ECS_EINVAL with errbuf set. */
int ecs__place_parse(ecs_client_t *c, const char *name, char *errbuf, size_t errlen);
/* Reads the registry into c->srv when it is due (or now, with force):
 * new nodes take a slot, departed ones are marked not live and their
 * connections dropped, a restarted one (new epoch) is reconnected lazily.
 * ECS_OK, or Redis's error (the last known servers are kept). */
int ecs__place_refresh(ecs_client_t *c, int force);
/* Most copies of one object (config.replicas; holders a get tries). */
#define ECS_CLI_MAX_COPIES ECS_META_MAX_HOLDERS

/* The server a put of keys[i] (nbytes) goes to under c->placement, over
 * the live servers other than taken[0..ntaken) (those already chosen for
 * this item's other copies); load[] (c->nsrv entries, the bytes this
 * batch already sent each) is updated.  ECS_CLI_NOWHERE when no server is
 * left. */
size_t ecs__place_put(ecs_client_t *c, const ecs_key_t *k, uint64_t nbytes, uint64_t *load,
                      const size_t *taken, size_t ntaken);
/* The servers holding keys[i] for the items with ok[i] == ECS_OK, from
 * their Redis records in one pipelined round trip: where[i *
 * ECS_CLI_MAX_COPIES + r] for r = 0, 1, ... are the live slots whose node
 * and epoch match a holder of the record, nearest first (this host's, then
 * the others), then ECS_CLI_NOWHERE (where[i * ECS_CLI_MAX_COPIES] is
 * NOWHERE for no record, or holders that all died or restarted: a miss).
 * where must hold n * ECS_CLI_MAX_COPIES entries.  An error is Redis's,
 * for the whole batch (c->errmsg says so). */
int ecs__place_locate(ecs_client_t *c, const ecs_key_t *keys, size_t n, const int *ok, size_t *where);
/* Marks slot s as failing: placement skips it for ECS_CLI_DOWN_MS and the
 * registry is read again on the next call. */
void ecs__place_down(ecs_client_t *c, ecs_cli_srv_t *s);

/* ---- client_setup.c: a handle and its connections ------------------- */

/* Makes sure server s is connected, greeted and on the path asked for (or
 * TCP, as c->fallback allows); ECS_OK, or why not (c->errmsg says so). */
int ecs__cli_ensure(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);

/* ---- client_route.c: where items go, running a batch ----------------- */

/* A kind of batch call (put, get, view, exists/remove): what it does with
 * one server's share of the items (idx: indices into the caller's arrays),
 * and how it reads and sets one item's status there.  arg is the call's
 * own struct of the caller's arrays. */
typedef struct ecs_cli_batch_kind {
  int (*share)(ecs_client_t *c, ecs_cli_srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline);
  int (*status)(void *arg, size_t i);        /* item i's status: only OK items are sent */
  void (*fail)(void *arg, size_t i, int rc); /* an item a whole-share failure took down */
  void (*again)(void *arg, size_t i);        /* item i goes to another copy: status back to OK */
  int parallel;                              /* 1: shares on several servers run at once */
  int miss_when_gone;                        /* discovery, an unreachable holder: ECS_CLI_GONE_* */
} ecs_cli_batch_kind_t;

/* What a discovered holder that cannot be reached (refused, or timed out)
 * means for its items.  Never an error for the whole call but with _ERROR. */
#define ECS_CLI_GONE_ERROR 0 /* the share's error, for the call too */
#define ECS_CLI_GONE_MISS 1  /* a miss: the object went with its server (gets) */
#define ECS_CLI_GONE_ITEM                                                                                    \
  2 /* refused: a miss (the process is gone, and its copy with it);                                          \
       timed out: ECS_ETIMEDOUT for the item alone (a stopped or                                             \
       cut-off holder may still have it) -- remove, exists */

/* The server an object lives on, with a configured servers list. */
size_t ecs__cli_route(const ecs_client_t *c, const ecs_key_t *k);
/* Where each item still OK is: by key hash over the servers list, or,
 * with discovery, where Redis says its copies are (an item with no live
 * holder is a miss: fail(ECS_ENOTFOUND)).  where must hold n *
 * ECS_CLI_MAX_COPIES entries: item i's servers, nearest first, from
 * where[i * ECS_CLI_MAX_COPIES], then ECS_CLI_NOWHERE.  An error is
 * Redis's, for the whole batch: every item still OK is given it. */
int ecs__cli_locate(ecs_client_t *c, const ecs_key_t *keys, size_t n, const ecs_cli_batch_kind_t *kind,
                    void *arg, size_t *where);
/* Runs a batch server by server within the call's deadline: kind->share
 * gets each server's share of the items still OK (where[i]: item i's
 * server, n entries).  The first error that failed a share is returned;
 * other servers still run. */
int ecs__cli_run_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, const ecs_cli_batch_kind_t *kind,
                       void *arg, const size_t *where);
/* A located batch (where: ecs__cli_locate's n * ECS_CLI_MAX_COPIES
 * servers) read from the nearest copy of each item, an item that missed
 * or failed going to its next copy; returns the first whole-share error
 * some item still carries at the end. */
int ecs__cli_run_nearest(ecs_client_t *c, size_t n, const ecs_cli_batch_kind_t *kind, void *arg,
                         const size_t *where);

/* ---- client_conn.c: one connection ---------------------------------- */

void ecs__cli_err(ecs_client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Closes a server's connection and frees what its path holds. */
void ecs__cli_drop(ecs_cli_srv_t *s);
/* Records the error and drops the connection (its stream position is
 * unknown); returns rc. */
int ecs__cli_fail(ecs_client_t *c, ecs_cli_srv_t *s, int rc);
/* Sends header + c->w records + data iovecs; *req_id is the id used.  For
 * a request with a reply use ecs__cli_call; this alone is for one-way
 * messages (RELEASE) and replies that carry a descriptor (ATTACH). */
int ecs__cli_send(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint16_t flags, uint32_t count,
                  const struct iovec *data, int ndata, uint64_t data_len, uint32_t *req_id,
                  uint64_t deadline);

/* How ecs__cli_call checks a reply beyond its header. */
#define ECS_CALL_COUNT 1u   /* it carries as many records as the request */
#define ECS_CALL_PAYLOAD 2u /* it may carry a payload (else data_len must be 0) */

/* One round trip: sends op with count records from c->w (and the data
 * iovecs), reads the reply's header and records (into c->rmeta), and
 * checks it.  Returns ECS_OK; the reply's own status when it refused the
 * request as a whole (h->status, nonzero only then); ECS_EPROTO when its
 * shape disagrees with `check`; or the transport's error.  It drops
 * nothing: the caller decides.  `what` ("get", ...), when not NULL, names
 * the request in c->errmsg when the reply refuses it. */
int ecs__cli_call(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint32_t count, const struct iovec *data,
                  int ndata, uint64_t data_len, unsigned check, const char *what, ecs_hdr_t *h,
                  uint64_t deadline);
/* The second half of ecs__cli_call, for a request sent with ecs__cli_send
 * as id (a pipelined one): reads and checks its reply, as above. */
int ecs__cli_reply(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint32_t id, uint32_t count, unsigned check,
                   const char *what, ecs_hdr_t *h, uint64_t deadline);
/* Reads a reply's m status records (in c->rmeta) into out[idx[j]].
 * ECS_OK, or ECS_EPROTO when the records are short or malformed. */
int ecs__cli_read_statuses(ecs_client_t *c, const ecs_hdr_t *h, const size_t *idx, size_t m, int *out);
/* HELLO on s->fd; fills node_id, epoch, max_data, shm_path. */
int ecs__cli_hello(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);
/* Delivers one stored object at src into b (verify, copy or decompress,
 * capacity against the raw size); returns the item's status. */
int ecs__cli_deliver(ecs_client_t *c, ecs_get_buf_t *b, const void *src, uint8_t codec, uint64_t nbytes,
                     uint64_t raw_nbytes, uint64_t checksum, int alloc);

/* ---- client_lease.c: leases and in-place puts (shm, RDMA) ----------- */

/* LEASE for keys idx[0..m) (records in c->rmeta), and a one-way RELEASE. */
int ecs__cli_lease(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const size_t *idx, size_t m,
                   ecs_hdr_t *h, uint64_t deadline);
void ecs__cli_release(ecs_client_t *c, ecs_cli_srv_t *s, const uint64_t *ids, size_t n, uint64_t deadline);

/* One item of an in-place put that the server reserved a block for. */
typedef struct ecs_cli_wr {
  const ecs_tensor_t *src; /* the caller's tensor */
  uint64_t off;            /* where its block lies in the server's pool */
  uint64_t resv_id;        /* the reservation COMMIT settles */
  uint32_t rkey;           /* RDMA: the reservation's window (written at 0) */
  uint64_t sum;            /* its checksum */
  size_t item;             /* its index into the caller's arrays */
  int status;              /* set by the writer: how moving its bytes went */
} ecs_cli_wr_t;

/* In-place puts: moves w[k].src's bytes to pool offset w[k].off and sets
 * w[k].status; a nonzero return fails the whole call. */
typedef int (*ecs_cli_writer_fn)(ecs_client_t *c, ecs_cli_srv_t *s, ecs_cli_wr_t *w, size_t n,
                                 uint64_t deadline);
/* RESERVE -> write -> COMMIT for one server's share of a batch (a key that
 * repeats in the batch is written once and the repeats settled after); an
 * ecs_cli_ops_t put. */
int ecs__cli_put_inplace(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                         const size_t *idx, size_t m, int *status, uint64_t deadline,
                         ecs_cli_writer_fn write);

/* ---- the paths ------------------------------------------------------- */

extern const ecs_cli_ops_t ecs__cli_tcp_ops;  /* client_tcp.c */
extern const ecs_cli_ops_t ecs__cli_shm_ops;  /* client_shm.c */
extern const ecs_cli_ops_t ecs__cli_rdma_ops; /* client_rdma.c */

/* client_tcp.c: a put over the socket (also the put of a read-only shm
 * mapping, whose socket is the Unix one). */
int ecs__tcp_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                 const size_t *idx, size_t m, int *status, uint64_t deadline);

/* client_tcp.c: one item of a get's reply. */
typedef struct ecs_cli_get_item {
  ecs_get_reply_t rep; /* its record */
  uint64_t zoff;       /* a compressed item: where it lands in the scratch buffer */
} ecs_cli_get_item_t;

/* client_tcp.c: the pure step of a get over the socket, for the fuzz
 * target tests/fuzz/fuzz_client_reply.c.  Reads the reply's records (in
 * c->rmeta) into items[] and sets each bufs[idx[j]] status; points iov[]
 * at where each raw payload goes (allocating it with alloc) and places
 * compressed ones at items[j].zoff in a scratch area of *ztotal bytes.
 * Returns the number of iovecs, or a negative error (ECS_EPROTO for a
 * reply whose sizes break the bounds). */
int ecs__tcp_plan_payloads(ecs_client_t *c, const ecs_hdr_t *h, ecs_get_buf_t *bufs, const size_t *idx,
                           size_t m, int alloc, ecs_cli_get_item_t *items, struct iovec *iov,
                           size_t *iov_item, uint64_t *ztotal);

/* client_shm.c: unmaps a mapping that no view holds any more. */
void ecs__shm_map_put(ecs_shm_map_t *m);

/* client_rdma.c: the client's RDMA device context and registered buffers. */
int ecs__rdma_client_open(ecs_client_t *c, char *errbuf, size_t errlen);
void ecs__rdma_client_close(ecs_client_t *c);

#endif
