/*
 * ecstore-server internals, shared by the files that make the server up and
 * by nothing else.  One concern per file, as redis splits ae.c, networking.c
 * and the command table:
 *
 *   server.c        the loop and the life cycle: create, run, tick, stop,
 *                   destroy, and the glue to the Redis metadata layer
 *   server_conn.c   the per-connection state machine: accept, read a
 *                   request (HDR -> META -> DATA), write its reply (WRITE)
 *   server_ops.c    the opcode handlers behind one static const table
 *   server_auth.c   HELLO (the token proof), UPGRADE, the failed-auth throttle
 *   server_lease.c  the per-connection lease / reservation table (pins)
 *   server_pub.c    replies that wait (for Redis, for a pull's holders)
 *   server_pull.c   PULL: objects fetched from other servers, its threads
 *
 * Threads (--threads N): N event loops, each with its own epoll; loop 0
 * also owns the listeners, the Redis link and the metrics endpoint, and
 * hands each accepted connection to a loop in turn.  A connection lives on
 * one loop all its life: only that loop's thread reads, writes, ticks or
 * closes it.  Everything shared (the object index, the pool's accounting,
 * the pins, the Redis link, the counters, the conns array) is guarded by
 * the one server lock s->mu, which a loop holds while it handles an event
 * and drops around the payload syscalls (read_data's readv into reserved
 * pool blocks, conn_flush's sendmsg out of referenced blocks): a pending
 * object is freed only by its reserver and a referenced one never, so the
 * bytes under those syscalls stay allocated without the lock.  Another
 * thread touches a connection only under the lock, and only what its owner
 * never uses without the lock: a parked reply not yet answered (rq[], by
 * the Redis acknowledgement that answers it) and the epoll arming; or a
 * connection it dooms at accept.
 *
 * PULL adds threads that are no event loops (server_pull.c): pull threads,
 * which talk to other servers with blocking sockets under deadlines and
 * take the server lock only to reserve, commit and answer (a parked PULL,
 * like a Redis acknowledgement does); and a registry reader with its own
 * blocking Redis link, which takes the lock only to swap in its copy.
 */
#ifndef ECS_SERVER_INTERNAL_H
#define ECS_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "ecstore/pool.h"
#include "store/redis/meta.h"
#include "store/core/checksum.h"
#include "store/server/acl.h"
#include "store/server/metrics.h"
#include "store/server/objstore.h"
#include "store/core/proto.h"
#include "store/rdma/rdma.h"
#include "store/server/server.h"

#define SCRATCH_SIZE (256u << 10) /* discard buffer for refused payloads */
#define IOV_BATCH 64              /* iovecs built per readv/sendmsg */
#define TICK_MS 100               /* timer work period */
#define PREAUTH_MAX_META 4096u    /* bound on what is read before HELLO: a HELLO is < 500 bytes */
#define ACCEPT_PAUSE_MS 100       /* out of file descriptors: stop accepting this long */
#define ACCEPT_LOG_MS 10000       /* ...and say so at most once this often */
#define AUTH_FAIL_SLOTS 256       /* sources remembered by the failed-auth throttle */
#define AUTH_FAIL_BURST 5         /* bad tokens a source may send at once before it is throttled */
#define AUTH_GLOBAL_BURST 64      /* bad tokens all sources together may send at once... */
#define AUTH_GLOBAL_PER_DELAY 10  /* ...then this many per --auth-fail-delay-ms */
#define AUTH_GOOD_SLOTS 64        /* sources that proved a token lately (they pass a global throttle) */
#define AUTH_GOOD_MS 600000       /* ...for this long */
#define DEBUG_CORRUPT 1           /* DEBUG subcode: flip a byte of an object */
#define UPGRADE_TTL_MS 10000      /* a HELLO's shm upgrade secret is good this long, once */
#define SHM_MAP 1u                /* conn_t.shm_rights: may ATTACH (map the pool read-only) */
#define SHM_WRITE 2u              /* ...and map it writable (--shm-write-uid) */
_Static_assert(ECS_UPGRADE_SECRET_SIZE == 32 && ECS_UPGRADE_NONCE_SIZE == 32, "conn_t's upgrade fields");

/* Internal per-item status for a key that appears twice in one PUT batch. */
#define SLOT_DUP_PENDING 1

/* The state of the request being read (HDR, META, DATA) or of the reply
 * being written (WRITE).  A request whose reply waits for Redis (a PUT,
 * COMMIT or REMOVE: pub_wait_t) is parked in the connection's reply queue
 * (rq[]) and the connection goes on reading; see server_conn.c. */
typedef enum conn_state { C_HDR, C_META, C_DATA, C_WRITE } conn_state_t;

/* Requests a connection may have parked (waiting for Redis) at once: past
 * that it stops reading until the oldest is answered, so what one client
 * can make the server hold stays bounded. */
#define RQ_MAX 8

typedef struct conn conn_t;

/* One event-loop thread (server.c). */
typedef struct ecs_loop {
  struct ecs_server *s;  /* the server */
  unsigned idx;          /* 0..nloops-1; 0 also runs the listeners, Redis and metrics */
  int epfd;              /* its epoll instance */
  int evfd;              /* eventfd that wakes it for stop */
  pthread_t th;          /* its thread (loops 1..n-1, while started) */
  int started;           /* th is running */
  uint8_t *scratch;      /* its discard buffer for refused payloads */
  uint64_t last_tick_ms; /* when its timer work last ran */
} ecs_loop_t;

/* A reply that waits for its records' acknowledgements.  One per parked
 * request; each record in flight points at its item.  The connection may
 * close meanwhile (c becomes NULL); the last acknowledgement frees it. */
typedef struct pub_wait {
  ecs_server_t *s;   /* the server */
  conn_t *c;         /* the waiting connection, or NULL once it closed */
  struct parked *pk; /* its parked reply (once parked), or NULL */
  uint32_t n;        /* items in the reply */
  uint32_t pending;  /* records not yet acknowledged (or failed) */
  struct pub_item {
    struct pub_wait *w; /* back to the wait */
    uint32_t idx;       /* the item */
  } * items;            /* one per item */
  int *status;          /* the reply's per-item statuses */
} pub_wait_t;

/* A parked reply: the reply of a request that waits for Redis (w), in the
 * connection's queue in request order.  The acknowledgement that answers
 * it builds hdr and body (on the loop that owns the Redis link, under the
 * lock) and sets ready; only then does the owner send it, and only after
 * every older reply. */
typedef struct parked {
  pub_wait_t *w;                   /* the acknowledgements awaited; NULL once answered */
  int ready;                       /* hdr and body are built: it may be sent */
  uint8_t opcode;                  /* the request's opcode... */
  uint32_t req_id;                 /* ...and id, echoed in the reply */
  uint64_t t0_ns;                  /* when the request was dispatched (latency) */
  uint8_t hdr[ECS_PROTO_HDR_SIZE]; /* the reply header */
  ecs_wbuf_t body;                 /* the reply records (per-item statuses) */
} parked_t;

/* One item of a PUT in flight, or of a COMMIT being settled. */
typedef struct put_slot {
  ecs_put_item_t item; /* decoded record (key points into conn->meta) */
  ecs_obj_t *obj;      /* reserved object, or NULL when the payload is discarded */
  int status;          /* per-item status so far */
  uint64_t sum;        /* the payload's checksum, once it is all in */
  int summed;          /* sum is set: hashed as the bytes landed (read_data) */
  uint64_t resv_id;    /* COMMIT: the reservation this item settles */
  int abort;           /* COMMIT: drop the reservation instead */
} put_slot_t;

/* A pin: an object a client holds through a lease (a committed object it
 * reads in place: shm or RDMA) or a reservation (a pending object it is
 * writing in place).  Pins live in a per-connection slot table; a pin's id
 * is (generation << 32 | slot + 1), so a stale or forged id is refused in
 * O(1).  Closing the connection or the pin's expiry drops it. */
enum { PIN_LEASE = 1, PIN_RESV = 2 };

typedef struct pin {
  ecs_obj_t *obj;      /* NULL: the slot is free */
  ecs_rdma_mr *win;    /* RDMA window over the object's block, or NULL */
  uint64_t expires_ms; /* monotonic deadline */
  uint32_t gen;        /* bumped at every reuse of the slot */
  uint32_t next_free;  /* free-list link */
  uint8_t kind;        /* PIN_LEASE or PIN_RESV */
} pin_t;

#define PIN_NONE UINT32_MAX

/* A token's account (server_auth.c): its owner id in the object index and
 * its quota (--acl-file); what its connections hold pinned, all together
 * (under the server lock). */
typedef struct tenant {
  uint16_t id;        /* owner in the objstore, 1.. */
  ecs__acl_quota_t q; /* limits (0: none) */
  uint64_t pinned;    /* bytes its connections hold pinned */
  uint64_t pins;      /* pins they hold */
} tenant_t;

struct conn {
  int fd;                              /* the socket */
  ecs_loop_t *loop;                    /* the loop that owns it (its epoll, its thread) */
  int doomed;                          /* evicted from another loop: its owner closes it */
  int local;                           /* came in on the Unix socket (shm allowed) */
  uint32_t events;                     /* what epoll watches now (EPOLLIN or EPOLLOUT) */
  int send_fd;                         /* fd to pass with the reply (ATTACH), or -1 */
  pin_t *pins;                         /* lease/reservation slots */
  uint32_t npins, pins_cap;            /* slots used (high-water), allocated */
  uint32_t pin_free;                   /* first free slot or PIN_NONE */
  uint32_t live_pins;                  /* pins held */
  uint64_t pinned_bytes;               /* bytes of the objects those pins hold */
  ecs_rdma_ep *ep;                     /* RDMA endpoint of this client, or NULL */
  uint64_t id;                         /* for logs */
  int authed;                          /* HELLO accepted */
  unsigned rights;                     /* ECS__RIGHT_* its token holds (store/server/acl.h), set by HELLO */
  tenant_t *tenant;                    /* its token's account (NULL: a server without tokens) */
  tenant_t *auth_tenant;               /* TCP: the account of the key a CHALLENGE named */
  int refuse;                          /* PUT refused for want of a right: this status per item */
  uint64_t accept_ms;                  /* when accepted, for the HELLO deadline */
  uint64_t src;                        /* the peer's address folded to 64 bits (0: Unix socket) */
  unsigned peer_uid;                   /* Unix socket: the peer's uid (SO_PEERCRED) */
  unsigned shm_rights;                 /* Unix socket: SHM_MAP, SHM_WRITE for that uid */
  uint64_t up_expires_ms;              /* TCP: the upgrade secret's deadline (0: none, or spent) */
  uint8_t up_secret[32];               /* TCP: that secret (ECS_UPGRADE_SECRET_SIZE bytes) */
  int up_nonce_set;                    /* Unix: a challenge is outstanding */
  uint8_t up_nonce[32];                /* Unix: that challenge (ECS_UPGRADE_NONCE_SIZE bytes) */
  uint64_t up_id;                      /* TCP: the secret's random id (never 0 while live) */
  int auth_pending;                    /* TCP: a CHALLENGE was answered; PROVE must follow */
  unsigned auth_rights;                /* ...the rights of the key it named */
  uint8_t auth_key[32];                /* ...that key (ECS_AUTH_KEY_SIZE) */
  uint8_t auth_cn[32], auth_sn[32];    /* ...the client's and the server's nonces */
  int close_after_write;               /* drop the connection once the reply is out */
  conn_state_t st;                     /* where the state machine is */
  uint64_t last_ms;                    /* last progress, for the stall timeout */
  uint8_t hdrbuf[ECS_PROTO_HDR_SIZE];  /* the request header being read */
  size_t hdr_got;                      /* header bytes read so far */
  ecs_hdr_t hdr;                       /* the decoded header */
  uint8_t *meta;                       /* item records (meta_len bytes) */
  size_t meta_cap;                     /* bytes allocated for meta */
  size_t meta_got;                     /* meta bytes read so far */
  put_slot_t *slots;                   /* PUT items */
  size_t nslots;                       /* number of PUT items */
  size_t slots_cap;                    /* allocated slots */
  size_t data_item;                    /* DATA: item being read */
  uint64_t data_off;                   /* DATA: bytes of that item already read */
  ecs_sum_t *sum;                      /* DATA: running hash of an item that spans reads */
  uint8_t out_hdr[ECS_PROTO_HDR_SIZE]; /* reply header */
  ecs_wbuf_t out;                      /* reply records */
  struct iovec *wiov;                  /* reply iovecs: header, records, blocks */
  int wcnt;                            /* iovecs in wiov */
  int wcap;                            /* allocated iovecs */
  int wpos;                            /* first iovec not fully sent */
  ecs_obj_t **held;                    /* references to release after the reply */
  size_t nheld, held_cap;              /* count and capacity of held */
  uint64_t req_t0_ns;                  /* when the request being served was dispatched */
  parked_t rq[RQ_MAX];                 /* parked replies, a ring in request order */
  unsigned rq_head;                    /* the oldest */
  unsigned rq_n;                       /* how many */
  size_t rq_sent;                      /* bytes of the oldest already sent */
};

struct ecs_server {
  ecs_server_opts_t o;   /* options (copied) */
  int lfd;               /* listening socket */
  int ufd;               /* Unix listening socket for shm clients, or -1 */
  char shm_path[108];    /* its path ("" when off) */
  char shm_tmpdir[108];  /* the directory it made with mkdtemp, removed at exit ("" none) */
  ecs_rdma_ctx *rdma;    /* RDMA device context, or NULL */
  int port;              /* bound port */
  int epfd;              /* loop 0's epoll instance (listeners, Redis, metrics) */
  int evfd;              /* loop 0's eventfd */
  ecs_loop_t *loops;     /* the event loops (--threads) */
  unsigned nloops;       /* how many */
  unsigned next_loop;    /* round-robin cursor for accepted connections */
  pthread_mutex_t mu;    /* the server lock: everything shared (see the top of this file) */
  int mu_init;           /* mu is initialized */
  size_t ndoomed;        /* connections doomed but not yet closed by their loop */
  uint64_t lock_t0_ns;   /* when mu was last taken (under mu) */
  uint64_t lock_held_ns; /* total time mu was held (under mu), for /metrics and the bench's model */
  uint64_t lock_wait_ns; /* total time spent waiting for it (under mu) */
  uint64_t lock_n;       /* acquisitions (under mu) */
  atomic_int stopping;   /* set by ecs_server_stop (any thread, or a signal handler) */
  ecs_pool_t *pool;      /* the pinned pool */
  ecs_objstore_t *os;    /* objects over the pool */
  ecs_meta_t *meta;      /* Redis link (NULL when running without) */
  uint64_t epoch;        /* this process's epoch (start time, µs) */
  conn_t **conns;        /* open connections (unordered) */
  size_t nconns;         /* count */
  uint64_t next_conn_id; /* for logs */
  size_t npreauth;       /* connections yet to say HELLO */
  struct {
    uint64_t src;                         /* the source (conn_t.src) */
    uint64_t tat_ms;                      /* its bucket's theoretical arrival time (GCRA) */
  } auth_fail[AUTH_FAIL_SLOTS];           /* failed-auth throttle, hashed by source */
  uint64_t auth_global_tat_ms;            /* the failed-auth throttle of all sources together (GCRA) */
  uint64_t auth_good[AUTH_GOOD_SLOTS];    /* sources that proved a token lately */
  uint64_t auth_good_ms[AUTH_GOOD_SLOTS]; /* ...and when */
  struct ecs__auth_key *auth_keys;        /* every token's key in the namespace served (server_auth.c) */
  tenant_t *tenants;                      /* one per key, the same order */
  size_t nauth_keys;                      /* how many */
  uint64_t accept_resume_ms;              /* listeners paused (out of fds) until then; 0: not paused */
  uint64_t accept_log_ms;                 /* when a pause was last logged */
  uint64_t accept_unlogged;               /* pauses since, not logged one by one */
  uint64_t auth_log_ms;                   /* when a failed HELLO was last logged */
  uint64_t auth_unlogged;                 /* failed HELLOs since, not logged one by one */
  uint64_t denied;                        /* requests refused for want of a right (ACL) */
  uint64_t denied_log_ms;                 /* when such a refusal was last logged */
  uint64_t denied_unlogged;               /* refusals since, not logged one by one */
  pub_wait_t *pub_cur;                    /* a REMOVE under way: its deletes are awaited here... */
  uint32_t pub_cur_idx;                   /* ...as this item */
  /* counters for STAT */
  uint64_t puts, gets, hits, misses;
  int redis_was_up;                    /* link state at the last tick, to log each change once */
  uint64_t pop_t0_ms;                  /* pool population: when it began */
  uint64_t pop_log_ms;                 /* ...and when progress was last logged */
  ecs_metrics_srv_t *metrics;          /* the Prometheus endpoint, or NULL */
  ecs_hist_t latency[ECS_OP_PULL + 1]; /* per opcode: dispatch to reply built */
  struct ecs__pull *pull;              /* PULL's threads and registry copy (server_pull.c), or NULL */
};

/* Monotonic ns, for request latencies. */
static inline uint64_t ecs__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* server.c: the lock (pthread_mutex; uncontended with --threads 1). */
/* server_mem.c: "NAME: N" of /proc/meminfo (0 when absent); and whether a
 * pool of o->pool_size fits in the memory available (ECS_OK), or
 * ECS_ENOMEM after logging the numbers and a --pool-size that fits. */
unsigned long long ecs__meminfo(const char *name);
int ecs__server_pool_fits(const ecs_server_opts_t *o);

void ecs__lock(ecs_server_t *s);
void ecs__unlock(ecs_server_t *s);

/* server.c: the Redis glue (the waits are in server_pub.c). */

/* The record that publishes obj (this node, this process's epoch). */
void ecs__server_rec(const ecs_server_t *s, const ecs_obj_t *obj, ecs_meta_rec_t *rec);
/* Whether o holds exactly this content: payload size, checksum, codec, raw
 * size and tensor description (a PUT's or a pulled GET reply's word). */
int ecs__obj_same(const ecs_obj_t *o, uint64_t nbytes, uint64_t checksum, int codec, uint64_t raw_nbytes,
                  const ecs_tensor_desc_t *desc);
/* Sends the queued record writes and deletions (a no-op without Redis). */
void ecs__server_meta_flush(ecs_server_t *s);
/* A wait for the records of a PUT or COMMIT of n items, statuses all
 * ECS_OK; NULL without Redis (or memory): nothing will be waited for. */
pub_wait_t *ecs__pub_begin(ecs_server_t *s, conn_t *c, uint32_t n);
/* server_pub.c: the same wait whether or not there is Redis (n > 0): a
 * PULL waits for its holders; NULL when out of memory. */
pub_wait_t *ecs__pub_alloc(ecs_server_t *s, conn_t *c, uint32_t n);
/* One awaited thing of w settled (ctx: &w->items[idx]); an rc other than
 * ECS_OK makes an OK item ECS_EREDIS.  The last one builds the reply (when
 * its connection is still there) and frees w.  Under the lock. */
void ecs__pub_done(void *ctx, int rc);
/* Publishes obj as item idx of w (w may be NULL: sent, not awaited).
 * ECS_OK, or ECS_EREDIS when it could not be sent (the link is down: the
 * re-sync publishes it). */
int ecs__pub_record(ecs_server_t *s, pub_wait_t *w, uint32_t idx, const ecs_obj_t *obj);
/* The request's items are settled: returns 0 when the caller replies now
 * (nothing pending, nothing parked before it), else parks the request in
 * c's reply queue, answered with w->status once the last acknowledgement
 * came and sent after every older reply (returns 1; c reads on meanwhile).
 * Frees w or hands it to the queue. */
int ecs__pub_end(ecs_server_t *s, conn_t *c, pub_wait_t *w);
/* REMOVE of one key as item idx of w (NULL: not awaited): the local
 * status, or ECS_EREDIS when removed here but the record's delete could
 * not be sent. */
int ecs__pub_remove(ecs_server_t *s, pub_wait_t *w, uint32_t idx, const uint8_t *key, uint16_t klen);
/* Forgets c in its wait (a closing connection, or a request that failed
 * after records were sent); the wait frees itself. */
void ecs__pub_abandon(pub_wait_t *w);

/* server_conn.c: the connection state machine. */

/* Accepts every pending connection on lfd (local: the Unix socket). */
void ecs__conn_accept_all(ecs_server_t *s, int lfd, int local);
/* Puts paused listeners back into epoll once their pause is over (loop 0's tick). */
void ecs__conn_accept_resume(ecs_server_t *s, uint64_t now);
/* Runs c as far as the epoll events ev allow; closes it on error or EOF. */
void ecs__conn_event(ecs_server_t *s, conn_t *c, uint32_t ev);
/* Releases everything c holds (references, reservations, pins) and frees it. */
void ecs__conn_close(ecs_server_t *s, conn_t *c);
/* Marks c authenticated (it no longer counts against --max-preauth-conns). */
void ecs__conn_authed(ecs_server_t *s, conn_t *c);
/* Parks the request being served in c's reply queue (the caller checked
 * that there is room: c reads only while there is) and returns its slot;
 * c goes on reading its next request. */
parked_t *ecs__conn_park(ecs_server_t *s, conn_t *c);
/* A parked reply of c was answered: sends it when the socket is writable
 * (and every older one is out). */
void ecs__conn_unpark(ecs_server_t *s, conn_t *c);
/* Keeps a reference to release once the reply has left. */
int ecs__conn_hold(conn_t *c, ecs_obj_t *obj);
/* Appends n bytes at p to the reply. */
int ecs__conn_wiov_add(conn_t *c, void *p, size_t n);
/* Starts a reply: the header and records slots; payload iovecs follow. */
void ecs__reply_begin(conn_t *c);
/* Encodes the reply header; the connection goes to WRITE. */
void ecs__reply_finish(ecs_server_t *s, conn_t *c, int status, uint32_t count, uint64_t data_len);
/* A reply carrying only a status, for whole-request failures. */
void ecs__reply_error(ecs_server_t *s, conn_t *c, int status, int close_after);

/* server_ops.c: the opcode handlers. */

/* The header and records of a request are in: run its handler. */
void ecs__server_dispatch(ecs_server_t *s, conn_t *c);
/* server_auth.c: the HELLO and UPGRADE handlers; the key table built
 * from --auth-token-file and --acl-file at start (ECS_OK or ECS_ENOMEM),
 * and its wiping free. */
void ecs__handle_hello(ecs_server_t *s, conn_t *c);
void ecs__handle_upgrade(ecs_server_t *s, conn_t *c);
int ecs__auth_init(ecs_server_t *s);
void ecs__auth_free(ecs_server_t *s);
/* PUT, step 3, once the payload is in: verify, commit, publish, reply. */
void ecs__server_put_end(ecs_server_t *s, conn_t *c);
/* The body of a /metrics scrape (an ecs_metrics_render_fn). */
void ecs__server_render_metrics(void *ctx, ecs_mbuf_t *b);

/* server_pull.c: PULL, objects fetched from the namespace's other
 * servers into this pool.  start: the registry reader and the pull
 * threads (none without Redis or with --pull-threads 0: PULL is then
 * refused); stop: ends them, a fetch under way included, and answers
 * what was queued ECS_ECANCELED (called without the lock; accepts a
 * server that never started them). */
void ecs__handle_pull(ecs_server_t *s, conn_t *c);
void ecs__pull_start(ecs_server_t *s);
void ecs__pull_stop(ecs_server_t *s);

/* server_lease.c: leases and reservations. */

/* Whether c may pin nbytes more: ECS_OK, or ECS_EBUSY past its quota
 * (--max-pins-per-conn, --max-pinned-per-conn). */
int ecs__pin_room(const ecs_server_t *s, const conn_t *c, uint64_t nbytes);
/* Pins obj for c until expires_ms; returns its id, 0 when out of memory. */
uint64_t ecs__pin_add(conn_t *c, ecs_obj_t *obj, uint8_t kind, uint64_t expires_ms);
/* On an RDMA connection, opens the window of pin id (remote read for a
 * lease, remote write for a reservation) and sets *rkey; 0 elsewhere or
 * for an empty object.  ECS_OK, or the window's error (the caller then
 * takes the pin back). */
int ecs__pin_window(ecs_server_t *s, conn_t *c, uint64_t id, uint8_t kind, uint32_t *rkey);
/* Removes the pin named id if it is of the given kind, closing its RDMA
 * window; returns its object. */
ecs_obj_t *ecs__pin_take(conn_t *c, uint64_t id, uint8_t kind);
/* Drops every pin past its deadline (all of them when now is UINT64_MAX). */
void ecs__pins_expire(ecs_server_t *s, conn_t *c, uint64_t now);
/* The deadline of a pin taken now. */
uint64_t ecs__pin_deadline(const ecs_server_t *s);

#endif
