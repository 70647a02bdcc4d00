/*
 * The ecstore server loop: connections, request handling, eviction and the
 * Redis link.  See server.h for the contract and docs/protocol.md for the
 * wire format.
 *
 * A connection is a small state machine:
 *
 *   HDR  -> read exactly 32 header bytes; decode and bound every length
 *   META -> read exactly meta_len bytes of item records; parse them
 *   DATA -> (PUT only) readv the payload straight into the reserved pool
 *           blocks, or into a scratch buffer for items that were refused
 *   WRITE-> sendmsg the reply header, records and (GET) pool blocks
 *
 * Exactly the bytes of one request are read before its reply is written,
 * so a payload byte is never read into an intermediate buffer.  References
 * taken for a GET are held until the last byte of the reply left, so
 * eviction can never free a block under a reader.  A connection that dies
 * mid-PUT aborts its reservations: no block leaks.
 */
#include "store/server.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "ecstore/pool.h"
#include "store/log.h"
#include "store/meta.h"
#include "store/metrics.h"
#include "store/net.h"
#include "store/objstore.h"
#include "store/proto.h"
#include "store/rdma.h"

#define SCRATCH_SIZE (256u << 10) /* discard buffer for refused payloads */
#define IOV_BATCH 64              /* iovecs built per readv/sendmsg */
#define TICK_MS 100               /* timer work period */
#define DEBUG_CORRUPT 1           /* DEBUG subcode: flip a byte of an object */

/* Internal per-item status for a key that appears twice in one PUT batch. */
#define SLOT_DUP_PENDING 1

typedef enum conn_state { C_HDR, C_META, C_DATA, C_WRITE } conn_state_t;

/* One item of a PUT in flight. */
typedef struct put_slot {
  ecs_put_item_t item; /* decoded record (key points into conn->meta) */
  ecs_obj_t *obj;      /* reserved object, or NULL when the payload is discarded */
  int status;          /* per-item status so far */
} put_slot_t;

/* A pin: an object a client holds through a lease (a committed object it
 * reads in place: shm or RDMA) or a reservation (a pending object it is
 * writing in place).  Pins live in a per-connection slot table; a pin's id
 * is (generation << 32 | slot + 1), so a stale or forged id is refused in
 * O(1).  Closing the connection or the pin's expiry drops it. */
enum { PIN_LEASE = 1, PIN_RESV = 2 };

typedef struct pin {
  ecs_obj_t *obj;      /* NULL: the slot is free */
  uint64_t expires_ms; /* monotonic deadline */
  uint32_t gen;        /* bumped at every reuse of the slot */
  uint32_t next_free;  /* free-list link */
  uint8_t kind;        /* PIN_LEASE or PIN_RESV */
} pin_t;

#define PIN_NONE UINT32_MAX

typedef struct conn {
  int fd;                              /* the socket */
  int local;                           /* came in on the Unix socket (shm allowed) */
  uint32_t events;                     /* what epoll watches now (EPOLLIN or EPOLLOUT) */
  int send_fd;                         /* fd to pass with the reply (ATTACH), or -1 */
  pin_t *pins;                         /* lease/reservation slots */
  uint32_t npins, pins_cap;            /* slots used (high-water), allocated */
  uint32_t pin_free;                   /* first free slot or PIN_NONE */
  uint32_t live_pins;                  /* pins held */
  ecs_rdma_ep *ep;                     /* RDMA endpoint of this client, or NULL */
  uint64_t id;                         /* for logs */
  int authed;                          /* HELLO accepted */
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
  uint8_t out_hdr[ECS_PROTO_HDR_SIZE]; /* reply header */
  ecs_wbuf_t out;                      /* reply records */
  struct iovec *wiov;                  /* reply iovecs: header, records, blocks */
  int wcnt;                            /* iovecs in wiov */
  int wcap;                            /* allocated iovecs */
  int wpos;                            /* first iovec not fully sent */
  ecs_obj_t **held;                    /* references to release after the reply */
  size_t nheld, held_cap;              /* count and capacity of held */
  uint64_t req_t0_ns;                  /* when the request being served was dispatched */
} conn_t;

struct ecs_server {
  ecs_server_opts_t o;   /* options (copied) */
  int lfd;               /* listening socket */
  int ufd;               /* Unix listening socket for shm clients, or -1 */
  char shm_path[108];    /* its path ("" when off) */
  ecs_rdma_ctx *rdma;    /* RDMA device context, or NULL */
  ecs_rdma_mr *pool_mr;  /* the pool registered for remote read/write */
  int port;              /* bound port */
  int epfd;              /* epoll instance */
  int evfd;              /* eventfd that wakes the loop for stop */
  atomic_int stopping;   /* set by ecs_server_stop (any thread, or a signal handler) */
  ecs_pool_t *pool;      /* the pinned pool */
  ecs_objstore_t *os;    /* objects over the pool */
  ecs_meta_t *meta;      /* Redis link (NULL when running without) */
  uint64_t epoch;        /* this process's epoch (start time, µs) */
  uint8_t *scratch;      /* discard buffer */
  conn_t **conns;        /* open connections (unordered) */
  size_t nconns;         /* count */
  uint64_t next_conn_id; /* for logs */
  uint64_t last_tick_ms; /* when timer work last ran */
  /* counters for STAT */
  uint64_t puts, gets, hits, misses;
  int redis_was_up;                            /* link state at the last tick, to log each change once */
  uint64_t pop_t0_ms;                          /* pool population: when it began */
  uint64_t pop_log_ms;                         /* ...and when progress was last logged */
  ecs_metrics_srv_t *metrics;                  /* the Prometheus endpoint, or NULL */
  ecs_hist_t latency[ECS_OP_RDMA_CONNECT + 1]; /* per opcode: dispatch to reply built */
};

/* Monotonic ns, for request latencies. */
static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ */
/* options                                                             */

void ecs_server_opts_init(ecs_server_opts_t *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->listen_host, sizeof o->listen_host, "127.0.0.1");
  o->listen_port = 7700;
  o->pool_size = 1ull << 30;
  o->min_block = 4096;
  o->lock_pool = 1;
  snprintf(o->redis_url, sizeof o->redis_url, "127.0.0.1:6379");
  snprintf(o->ns, sizeof o->ns, "default");
  o->io_timeout_ms = 30000;
  o->redis_timeout_ms = 500;
  o->heartbeat_ttl_s = 10;
  o->high_watermark = 0.95;
  o->low_watermark = 0.85;
  o->max_request = 4ull << 30;
  o->max_conns = 1024;
  o->lease_timeout_ms = 30000;
  snprintf(o->rdma, sizeof o->rdma, "auto");
}

/* ------------------------------------------------------------------ */
/* Redis glue                                                          */

static void rec_from_obj(const ecs_server_t *s, const ecs_obj_t *obj, ecs_meta_rec_t *rec) {
  memset(rec, 0, sizeof *rec);
  rec->key = obj->key;
  rec->key_len = obj->key_len;
  snprintf(rec->node_id, sizeof rec->node_id, "%s", s->o.node_id);
  rec->epoch = s->epoch;
  rec->off = obj->off;
  rec->nbytes = obj->nbytes;
  rec->raw_nbytes = obj->raw_nbytes;
  rec->checksum = obj->checksum;
  rec->codec = obj->codec;
  rec->desc = obj->desc;
  rec->t_ms = obj->commit_ms;
}

static void on_drop(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why) {
  ecs_server_t *s = ctx;
  ECS_LOG_D("%s object (%llu bytes)",
            why == ECS_DROP_EVICTED ? "evicted" : why == ECS_DROP_REPLACED ? "replaced" : "removed",
            (unsigned long long)obj->nbytes);
  /* A replaced object's record is overwritten by its successor's, queued
   * right after this commit: deleting it would only open a gap. */
  if (s->meta && why != ECS_DROP_REPLACED)
    ecs_meta_queue_del(s->meta, obj->key, obj->key_len);
}

static void publish_one(void *ctx, const ecs_obj_t *obj) {
  ecs_server_t *s = ctx;
  ecs_meta_rec_t rec;
  rec_from_obj(s, obj, &rec);
  ecs_meta_queue_put(s->meta, &rec);
}

static void resync_publish_all(void *ctx, ecs_meta_t *m) {
  (void)m;
  ecs_server_t *s = ctx;
  ecs_objstore_foreach(s->os, publish_one, s);
}

static int resync_has_key(void *ctx, const void *key, uint16_t key_len) {
  ecs_server_t *s = ctx;
  ecs_obj_t *o = ecs_objstore_find(s->os, key, key_len);
  return o && o->state == ECS_OBJ_COMMITTED;
}

static void meta_flush(ecs_server_t *s) {
  if (s->meta && ecs_meta_flush(s->meta) != ECS_OK && ecs_meta_is_up(s->meta) == 0)
    ECS_LOG_D("redis down; records will be re-synced when it returns");
}

/* ------------------------------------------------------------------ */
/* connections                                                         */

static void conn_release_refs(ecs_server_t *s, conn_t *c) {
  for (size_t i = 0; i < c->nheld; i++)
    ecs_objstore_release(s->os, c->held[i]);
  c->nheld = 0;
}

static void conn_abort_slots(ecs_server_t *s, conn_t *c) {
  for (size_t i = 0; i < c->nslots; i++) {
    if (c->slots[i].obj) {
      ecs_objstore_abort(s->os, c->slots[i].obj);
      c->slots[i].obj = NULL;
    }
  }
  c->nslots = 0;
}

static void pins_expire(ecs_server_t *s, conn_t *c, uint64_t now);

static void conn_close(ecs_server_t *s, conn_t *c) {
  conn_release_refs(s, c);
  conn_abort_slots(s, c);
  pins_expire(s, c, UINT64_MAX); /* a client that goes away leaves nothing pinned */
  ecs_rdma_ep_destroy(c->ep);
  if (c->send_fd >= 0)
    close(c->send_fd);
  epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  for (size_t i = 0; i < s->nconns; i++) {
    if (s->conns[i] == c) {
      s->conns[i] = s->conns[--s->nconns];
      break;
    }
  }
  ECS_LOG_D("conn %llu closed", (unsigned long long)c->id);
  free(c->meta);
  free(c->slots);
  free(c->wiov);
  free(c->held);
  free(c->pins);
  ecs_wbuf_free(&c->out);
  free(c);
}

/* Arms the socket for ev; a no-op (no syscall) when it already is. */
static int conn_set_events(ecs_server_t *s, conn_t *c, uint32_t ev) {
  if (c->events == ev)
    return 0;
  struct epoll_event e = {.events = ev, .data.ptr = c};
  if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &e) != 0)
    return -1;
  c->events = ev;
  return 0;
}

static int conn_hold(conn_t *c, ecs_obj_t *obj) {
  if (c->nheld == c->held_cap) {
    size_t ncap = c->held_cap ? c->held_cap * 2 : 16;
    ecs_obj_t **n = realloc(c->held, ncap * sizeof *n);
    if (!n)
      return ECS_ENOMEM;
    c->held = n;
    c->held_cap = ncap;
  }
  c->held[c->nheld++] = obj;
  return ECS_OK;
}

static int conn_wiov_add(conn_t *c, void *p, size_t n) {
  if (c->wcnt == c->wcap) {
    int ncap = c->wcap ? c->wcap * 2 : 16;
    struct iovec *v = realloc(c->wiov, (size_t)ncap * sizeof *v);
    if (!v)
      return ECS_ENOMEM;
    c->wiov = v;
    c->wcap = ncap;
  }
  c->wiov[c->wcnt].iov_base = p;
  c->wiov[c->wcnt].iov_len = n;
  c->wcnt++;
  return ECS_OK;
}

static uint64_t pin_add(conn_t *c, ecs_obj_t *obj, uint8_t kind, uint64_t expires_ms) {
  uint32_t slot;
  if (c->pin_free != PIN_NONE) {
    slot = c->pin_free;
    c->pin_free = c->pins[slot].next_free;
  } else {
    if (c->npins == c->pins_cap) {
      uint32_t ncap = c->pins_cap ? c->pins_cap * 2 : 64;
      pin_t *np = realloc(c->pins, (size_t)ncap * sizeof *np);
      if (!np)
        return 0;
      c->pins = np;
      c->pins_cap = ncap;
    }
    slot = c->npins++;
    c->pins[slot].gen = 0;
  }
  pin_t *p = &c->pins[slot];
  p->obj = obj;
  p->kind = kind;
  p->expires_ms = expires_ms;
  p->gen++;
  c->live_pins++;
  return (uint64_t)p->gen << 32 | (uint64_t)(slot + 1);
}

/* Removes the pin named id if it is of the given kind; returns its object. */
static ecs_obj_t *pin_take(conn_t *c, uint64_t id, uint8_t kind) {
  uint32_t slot = (uint32_t)(id & 0xffffffffu);
  if (slot == 0 || slot > c->npins)
    return NULL;
  pin_t *p = &c->pins[slot - 1];
  if (!p->obj || p->kind != kind || p->gen != (uint32_t)(id >> 32))
    return NULL;
  ecs_obj_t *o = p->obj;
  p->obj = NULL;
  p->next_free = c->pin_free;
  c->pin_free = slot - 1;
  c->live_pins--;
  return o;
}

static void pin_drop(ecs_server_t *s, conn_t *c, uint32_t slot) {
  pin_t *p = &c->pins[slot];
  if (p->kind == PIN_LEASE)
    ecs_objstore_release(s->os, p->obj);
  else
    ecs_objstore_abort(s->os, p->obj);
  p->obj = NULL;
  p->next_free = c->pin_free;
  c->pin_free = slot;
  c->live_pins--;
}

/* Drops every pin past its deadline (all of them when now is UINT64_MAX). */
static void pins_expire(ecs_server_t *s, conn_t *c, uint64_t now) {
  for (uint32_t i = 0; i < c->npins && c->live_pins; i++) {
    if (c->pins[i].obj && c->pins[i].expires_ms <= now) {
      if (now != UINT64_MAX)
        ECS_LOG_W("conn %llu: %s expired; dropped", (unsigned long long)c->id,
                  c->pins[i].kind == PIN_LEASE ? "lease" : "reservation");
      pin_drop(s, c, i);
    }
  }
}

/* Starts a reply: header with status, the records in c->out, and the
 * payload iovecs the handler already appended after slot 2. */
static void reply_begin(conn_t *c) {
  ecs_wbuf_reset(&c->out);
  c->wcnt = 0;
  c->wpos = 0;
  /* slots 0 and 1 are the header and records; filled by reply_finish */
  conn_wiov_add(c, c->out_hdr, ECS_PROTO_HDR_SIZE);
  conn_wiov_add(c, NULL, 0);
}

static void reply_finish(ecs_server_t *s, conn_t *c, int status, uint32_t count, uint64_t data_len) {
  if (c->out.err) { /* out of memory building records: fail the whole request */
    conn_release_refs(s, c);
    ecs_wbuf_reset(&c->out);
    status = ECS_ENOMEM;
    count = 0;
    data_len = 0;
    c->wcnt = 2;
  }
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = c->hdr.opcode,
                 .flags = ECS_FLAG_REPLY,
                 .req_id = c->hdr.req_id,
                 .status = status,
                 .count = count,
                 .meta_len = (uint32_t)c->out.len,
                 .data_len = data_len};
  ecs_proto_hdr_encode(&h, c->out_hdr);
  c->wiov[1].iov_base = c->out.p;
  c->wiov[1].iov_len = c->out.len;
  c->st = C_WRITE;
  if (c->req_t0_ns && c->hdr.opcode < sizeof s->latency / sizeof s->latency[0])
    ecs_hist_observe(&s->latency[c->hdr.opcode], now_ns() - c->req_t0_ns);
  c->req_t0_ns = 0;
}

/* A reply carrying only a status, for whole-request failures. */
static void reply_error(ecs_server_t *s, conn_t *c, int status, int close_after) {
  conn_release_refs(s, c);
  reply_begin(c);
  reply_finish(s, c, status, 0, 0);
  c->close_after_write |= close_after;
}

/* ------------------------------------------------------------------ */
/* request handlers                                                    */

static void handle_hello(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_hello_t h;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  if (ecs_proto_hello_read(&r, &h) != ECS_OK) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  if (s->o.auth_token[0] && !ecs_ct_equal(h.token, h.token_len, s->o.auth_token, strlen(s->o.auth_token))) {
    ECS_LOG_W("conn %llu: bad auth token; closing", (unsigned long long)c->id);
    reply_error(s, c, ECS_EAUTH, 1);
    return;
  }
  if (h.ns_len != strlen(s->o.ns) || memcmp(h.ns, s->o.ns, h.ns_len) != 0) {
    ECS_LOG_W("conn %llu: namespace mismatch (server serves '%s')", (unsigned long long)c->id, s->o.ns);
    reply_error(s, c, ECS_EINVAL, 1);
    return;
  }
  c->authed = 1;
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  snprintf(hr.node_id, sizeof hr.node_id, "%s", s->o.node_id);
  hr.epoch = s->epoch;
  hr.pool_size = ecs_pool_size(s->pool);
  hr.max_items = ECS_PROTO_MAX_ITEMS;
  hr.max_data = s->o.max_request;
  snprintf(hr.shm_path, sizeof hr.shm_path, "%s", s->shm_path);
  reply_begin(c);
  ecs_proto_hello_reply_write(&c->out, &hr);
  reply_finish(s, c, ECS_OK, 0, 0);
}

/* The figures STAT answers, also what /metrics exposes. */
static ecs_stat_reply_t stat_snapshot(ecs_server_t *s) {
  ecs_pool_stats_t ps;
  ecs_objstore_stats_t os;
  ecs_pool_stats(s->pool, &ps);
  ecs_objstore_stats(s->os, &os);
  ecs_stat_reply_t st = {
      .pool_size = ps.size,
      .bytes_in_use = ps.bytes_in_use,
      .bytes_free = ps.bytes_free,
      .largest_free = ps.largest_free,
      .bytes_requested = ps.bytes_requested,
      .objects = os.objects,
      .puts = s->puts,
      .gets = s->gets,
      .hits = s->hits,
      .misses = s->misses,
      .evictions = os.evictions,
      .removes = os.removes,
      .connections = s->nconns,
      .epoch = s->epoch,
      .redis_ok = s->meta ? (uint64_t)ecs_meta_is_up(s->meta) : 0,
      .pool_locked = (uint64_t)ps.locked,
  };
  return st;
}

static void handle_stat(ecs_server_t *s, conn_t *c) {
  ecs_stat_reply_t st = stat_snapshot(s);
  reply_begin(c);
  ecs_proto_stat_write(&c->out, &st);
  reply_finish(s, c, ECS_OK, 0, 0);
}

/* The body of a /metrics scrape: STAT's figures, then a latency histogram
 * per opcode that has a name. */
static void render_metrics(void *ctx, ecs_mbuf_t *b) {
  ecs_server_t *s = ctx;
  ecs_stat_reply_t st = stat_snapshot(s);
  ecs_objstore_stats_t os;
  ecs_objstore_stats(s->os, &os);
  char epoch[32];
  snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)s->epoch);
  ecs_metrics_info(b, "ecstore_server_info", "This server: node id and epoch (start time, us).", "node",
                   s->o.node_id, "epoch", epoch);
  ecs_metrics_gauge(b, "ecstore_pool_bytes", "Pool size.", (double)st.pool_size);
  ecs_metrics_gauge(b, "ecstore_pool_used_bytes", "Pool bytes in blocks handed out.",
                    (double)st.bytes_in_use);
  ecs_metrics_gauge(b, "ecstore_pool_requested_bytes", "Bytes the stored objects asked for.",
                    (double)st.bytes_requested);
  ecs_metrics_gauge(b, "ecstore_pool_free_bytes", "Pool bytes free.", (double)st.bytes_free);
  ecs_metrics_gauge(b, "ecstore_pool_largest_free_bytes", "Largest free block.", (double)st.largest_free);
  ecs_metrics_gauge(b, "ecstore_pool_pinned", "1 when the pool is mlock'd.", (double)st.pool_locked);
  ecs_metrics_gauge(b, "ecstore_objects", "Committed objects.", (double)st.objects);
  ecs_metrics_gauge(b, "ecstore_objects_pending", "Objects reserved, not yet committed.", (double)os.pending);
  ecs_metrics_gauge(b, "ecstore_connections", "Open client connections.", (double)st.connections);
  ecs_metrics_gauge(b, "ecstore_redis_up", "1 while the Redis link is up.", (double)st.redis_ok);
  ecs_metrics_counter(b, "ecstore_puts_total", "Objects put.", st.puts);
  ecs_metrics_counter(b, "ecstore_gets_total", "Objects asked for by get or lease.", st.gets);
  ecs_metrics_counter(b, "ecstore_get_hits_total", "Gets that found their object.", st.hits);
  ecs_metrics_counter(b, "ecstore_get_misses_total", "Gets that did not.", st.misses);
  ecs_metrics_counter(b, "ecstore_evictions_total", "Objects evicted (FIFO) to make room.", st.evictions);
  ecs_metrics_counter(b, "ecstore_removes_total", "Objects removed on request.", st.removes);
  static const char *const names[] = {[ECS_OP_HELLO] = "hello",
                                      [ECS_OP_PUT] = "put",
                                      [ECS_OP_GET] = "get",
                                      [ECS_OP_EXISTS] = "exists",
                                      [ECS_OP_REMOVE] = "remove",
                                      [ECS_OP_STAT] = "stat",
                                      [ECS_OP_PING] = "ping",
                                      [ECS_OP_LEASE] = "lease",
                                      [ECS_OP_RELEASE] = "release",
                                      [ECS_OP_RESERVE] = "reserve",
                                      [ECS_OP_COMMIT] = "commit",
                                      [ECS_OP_ATTACH] = "attach",
                                      [ECS_OP_RDMA_CONNECT] = "rdma_connect"};
  const char *vals[sizeof names / sizeof names[0]];
  const ecs_hist_t *hs[sizeof names / sizeof names[0]];
  size_t n = 0;
  for (size_t op = 0; op < sizeof names / sizeof names[0] && op < sizeof s->latency / sizeof s->latency[0];
       op++)
    if (names[op]) {
      vals[n] = names[op];
      hs[n++] = &s->latency[op];
    }
  ecs_metrics_histograms(b, "ecstore_request_duration_seconds",
                         "Requests by opcode, from parsed to reply ready (puts include receiving the data).",
                         "op", vals, hs, n);
}

/* A re-put of a committed key whose stored bytes no longer match their
 * checksum (memory corruption) replaces the object instead of reporting an
 * idempotent success: the retry heals the store.  This costs one hash of
 * the stored object per duplicate put, which only retries pay. */
static ecs_obj_t *drop_if_corrupt(ecs_server_t *s, ecs_obj_t *o) {
  if (ecs_checksum(ecs_objstore_data(s->os, o), (size_t)o->nbytes) == o->checksum)
    return o;
  ECS_LOG_W("stored object failed its checksum; replacing it with the new put");
  ecs_objstore_remove(s->os, o->key, o->key_len);
  return NULL;
}

static int same_content(const ecs_obj_t *o, const ecs_put_item_t *it) {
  if (o->nbytes != it->nbytes || o->checksum != it->checksum || o->codec != it->codec ||
      o->raw_nbytes != it->raw_nbytes || o->desc.dtype != it->desc.dtype || o->desc.ndim != it->desc.ndim)
    return 0;
  for (unsigned d = 0; d < o->desc.ndim; d++)
    if (o->desc.shape[d] != it->desc.shape[d])
      return 0;
  return 1;
}

/* PUT, step 1: parse records, reserve blocks, then go read the payload. */
static void handle_put_begin(ecs_server_t *s, conn_t *c) {
  uint32_t n = c->hdr.count;
  if (n > c->slots_cap) {
    put_slot_t *ns = realloc(c->slots, (size_t)n * sizeof *ns);
    if (!ns) {
      reply_error(s, c, ECS_ENOMEM, 1);
      return;
    }
    c->slots = ns;
    c->slots_cap = n;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    memset(sl, 0, sizeof *sl);
    int rc = ecs_proto_put_item_read(&r, &sl->item);
    if (rc == ECS_EPROTO || r.err) {
      /* A record we cannot parse leaves the stream's framing in doubt. */
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    /* A bad key or dtype fails that item alone; its payload is discarded. */
    sl->status = rc;
    if (sl->item.nbytes > UINT64_MAX - total) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    total += sl->item.nbytes;
  }
  if (r.pos != r.len || total != c->hdr.data_len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  c->nslots = n;
  for (uint32_t i = 0; i < n; i++) {
    put_slot_t *sl = &c->slots[i];
    if (sl->status != ECS_OK)
      continue;
    int upsert = (sl->item.flags & ECS_PUT_F_UPSERT) != 0;
    ecs_obj_t *o = ecs_objstore_find(s->os, sl->item.key, sl->item.key_len);
    if (o && o->state == ECS_OBJ_COMMITTED && same_content(o, &sl->item))
      o = drop_if_corrupt(s, o);
    /* An upsert of other content goes on to replace it; of the same content
     * it is as idempotent as a put. */
    if (o && o->state == ECS_OBJ_COMMITTED && (!upsert || same_content(o, &sl->item))) {
      sl->status = same_content(o, &sl->item) ? ECS_OK : ECS_ECONFLICT;
      continue;
    }
    int rc = upsert ? ecs_objstore_reserve_replace(s->os, sl->item.key, sl->item.key_len, sl->item.nbytes, &sl->obj)
                    : ecs_objstore_reserve(s->os, sl->item.key, sl->item.key_len, sl->item.nbytes, &sl->obj);
    if (rc == ECS_EBUSY)
      sl->status = SLOT_DUP_PENDING; /* settled after the batch commits */
    else
      sl->status = rc;
    if (rc != ECS_OK)
      sl->obj = NULL;
  }
  meta_flush(s); /* deletions of anything evicted to make room */
  c->data_item = 0;
  c->data_off = 0;
  c->st = C_DATA;
}

/* PUT, step 3: verify checksums, commit, publish, reply. */
static void handle_put_end(ecs_server_t *s, conn_t *c) {
  uint64_t now = ecs_wall_ms();
  for (size_t i = 0; i < c->nslots; i++) {
    put_slot_t *sl = &c->slots[i];
    if (!sl->obj)
      continue;
    ecs_obj_t *o = sl->obj;
    sl->obj = NULL;
    uint64_t sum = ecs_checksum(ecs_objstore_data(s->os, o), (size_t)o->nbytes);
    if (sum != sl->item.checksum) {
      ecs_objstore_abort(s->os, o);
      sl->status = ECS_ECHECKSUM;
      continue;
    }
    o->codec = sl->item.codec;
    o->raw_nbytes = sl->item.raw_nbytes;
    o->checksum = sum;
    o->desc = sl->item.desc;
    o->commit_ms = now;
    ecs_objstore_commit(s->os, o);
    s->puts++;
    if (s->meta) {
      ecs_meta_rec_t rec;
      rec_from_obj(s, o, &rec);
      ecs_meta_queue_put(s->meta, &rec);
    }
  }
  for (size_t i = 0; i < c->nslots; i++) {
    put_slot_t *sl = &c->slots[i];
    if (sl->status != SLOT_DUP_PENDING)
      continue;
    ecs_obj_t *o = ecs_objstore_find(s->os, sl->item.key, sl->item.key_len);
    if (!o || o->state != ECS_OBJ_COMMITTED)
      sl->status = ECS_EBUSY;
    else if (same_content(o, &sl->item))
      sl->status = ECS_OK;
    else /* an upsert lost to a concurrent writer of the key: busy, not a conflict */
      sl->status = (sl->item.flags & ECS_PUT_F_UPSERT) ? ECS_EBUSY : ECS_ECONFLICT;
  }
  /* Records reach Redis before the reply, so a client that saw OK can find
   * the object through Redis at once (exists_batch). */
  meta_flush(s);
  reply_begin(c);
  for (size_t i = 0; i < c->nslots; i++)
    ecs_proto_status_write(&c->out, c->slots[i].status);
  reply_finish(s, c, ECS_OK, (uint32_t)c->nslots, 0);
  c->nslots = 0;
}

static void handle_get(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  reply_begin(c);
  uint64_t data_len = 0;
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    ecs_get_item_t it;
    int rc = ecs_proto_get_item_read(&r, &it);
    if (rc == ECS_EPROTO || r.err) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_get_reply_t rep;
    memset(&rep, 0, sizeof rep);
    s->gets++;
    ecs_obj_t *o = rc == ECS_OK ? ecs_objstore_acquire(s->os, it.key, it.key_len) : NULL;
    if (rc != ECS_OK) {
      rep.status = rc; /* a bad key fails that item alone */
    } else if (!o) {
      s->misses++;
      rep.status = ECS_ENOTFOUND;
    } else {
      s->hits++;
      rep.codec = o->codec;
      rep.desc = o->desc;
      rep.nbytes = o->nbytes;
      rep.raw_nbytes = o->raw_nbytes;
      rep.checksum = o->checksum;
      if (o->nbytes > it.capacity) {
        rep.status = ECS_EBUFSMALL;
        ecs_objstore_release(s->os, o);
      } else if (conn_hold(c, o) != ECS_OK) {
        ecs_objstore_release(s->os, o);
        rep.status = ECS_ENOMEM;
      } else {
        rep.status = ECS_OK;
        if (o->nbytes && conn_wiov_add(c, ecs_objstore_data(s->os, o), (size_t)o->nbytes) != ECS_OK) {
          reply_error(s, c, ECS_ENOMEM, 0);
          return;
        }
        data_len += o->nbytes;
      }
    }
    ecs_proto_get_reply_write(&c->out, &rep);
  }
  if (r.pos != r.len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  reply_finish(s, c, ECS_OK, c->hdr.count, data_len);
}

/* EXISTS and REMOVE: key items in, one status per item out. */
static void handle_keys(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  reply_begin(c);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    const uint8_t *key;
    uint16_t klen;
    int rc = ecs_proto_key_read(&r, &key, &klen);
    if (rc == ECS_EPROTO || r.err) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    int st;
    if (rc != ECS_OK) {
      st = rc; /* a bad key fails that item alone */
    } else if (c->hdr.opcode == ECS_OP_REMOVE) {
      st = ecs_objstore_remove(s->os, key, klen);
    } else {
      ecs_obj_t *o = ecs_objstore_find(s->os, key, klen);
      st = o && o->state == ECS_OBJ_COMMITTED ? ECS_OK : ECS_ENOTFOUND;
    }
    ecs_proto_status_write(&c->out, st);
  }
  if (r.pos != r.len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  if (c->hdr.opcode == ECS_OP_REMOVE)
    meta_flush(s);
  reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* ------------------------------------------------------------------ */
/* leases and reservations (shm and RDMA data paths)                   */

static uint64_t pin_deadline(const ecs_server_t *s) {
  return ecs_now_ms() + (uint64_t)s->o.lease_timeout_ms;
}

/* LEASE: pin committed objects and say where their bytes are. */
static void handle_lease(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  reply_begin(c);
  uint64_t dl = pin_deadline(s);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    const uint8_t *key;
    uint16_t klen;
    int rc = ecs_proto_key_read(&r, &key, &klen);
    if (rc == ECS_EPROTO || r.err) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_lease_reply_t lr;
    memset(&lr, 0, sizeof lr);
    s->gets++;
    ecs_obj_t *o = rc == ECS_OK ? ecs_objstore_acquire(s->os, key, klen) : NULL;
    if (rc != ECS_OK) {
      lr.status = rc;
    } else if (!o) {
      s->misses++;
      lr.status = ECS_ENOTFOUND;
    } else {
      s->hits++;
      lr.lease_id = pin_add(c, o, PIN_LEASE, dl);
      if (lr.lease_id == 0) {
        ecs_objstore_release(s->os, o);
        lr.status = ECS_ENOMEM;
      } else {
        lr.status = ECS_OK;
        lr.codec = o->codec;
        lr.desc = o->desc;
        lr.off = o->off;
        lr.nbytes = o->nbytes;
        lr.raw_nbytes = o->raw_nbytes;
        lr.checksum = o->checksum;
      }
    }
    ecs_proto_lease_reply_write(&c->out, &lr);
  }
  if (r.pos != r.len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* RELEASE: unpin leases; with NOREPLY the client reads nothing back. */
static void handle_release(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  int noreply = (c->hdr.flags & ECS_FLAG_NOREPLY) != 0;
  reply_begin(c);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    uint64_t id;
    if (ecs_proto_u64_read(&r, &id) != ECS_OK) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_obj_t *o = pin_take(c, id, PIN_LEASE);
    if (o)
      ecs_objstore_release(s->os, o);
    ecs_proto_status_write(&c->out, o ? ECS_OK : ECS_ENOTFOUND);
  }
  if (r.pos != r.len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  if (noreply) {
    c->st = C_HDR; /* nothing to send; read the next request */
    return;
  }
  reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* RESERVE: allocate blocks a local or RDMA client writes in place. */
static void handle_reserve(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  reply_begin(c);
  uint64_t dl = pin_deadline(s);
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    ecs_put_item_t it;
    int rc = ecs_proto_put_item_read(&r, &it);
    if (rc == ECS_EPROTO || r.err) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    ecs_reserve_reply_t rr = {.status = rc};
    if (rc == ECS_OK) {
      int upsert = (it.flags & ECS_PUT_F_UPSERT) != 0;
      ecs_obj_t *o = ecs_objstore_find(s->os, it.key, it.key_len);
      if (o && o->state == ECS_OBJ_COMMITTED && same_content(o, &it))
        o = drop_if_corrupt(s, o);
      if (o && o->state == ECS_OBJ_COMMITTED && (!upsert || same_content(o, &it))) {
        /* already stored: same content is fine (resv_id 0), else a conflict */
        rr.status = same_content(o, &it) ? ECS_OK : ECS_ECONFLICT;
      } else {
        rr.status = upsert ? ecs_objstore_reserve_replace(s->os, it.key, it.key_len, it.nbytes, &o)
                           : ecs_objstore_reserve(s->os, it.key, it.key_len, it.nbytes, &o);
        if (rr.status == ECS_OK) {
          o->codec = it.codec;
          o->raw_nbytes = it.raw_nbytes;
          o->desc = it.desc;
          rr.off = o->off;
          rr.resv_id = pin_add(c, o, PIN_RESV, dl);
          if (rr.resv_id == 0) {
            ecs_objstore_abort(s->os, o);
            rr.status = ECS_ENOMEM;
            rr.off = 0;
          }
        }
      }
    }
    ecs_proto_reserve_reply_write(&c->out, &rr);
  }
  if (r.pos != r.len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  meta_flush(s); /* deletions of anything evicted to make room */
  reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* COMMIT: the bytes are in place; verify, index and publish them. */
static void handle_commit(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  reply_begin(c);
  uint64_t now = ecs_wall_ms();
  for (uint32_t i = 0; i < c->hdr.count; i++) {
    ecs_commit_item_t ci;
    if (ecs_proto_commit_item_read(&r, &ci) != ECS_OK) {
      reply_error(s, c, ECS_EPROTO, 1);
      return;
    }
    int st = ECS_OK;
    ecs_obj_t *o = pin_take(c, ci.resv_id, PIN_RESV);
    if (!o) {
      st = ECS_ENOTFOUND; /* unknown, expired or already committed */
    } else if (ci.abort) {
      ecs_objstore_abort(s->os, o);
    } else if (ecs_checksum(ecs_objstore_data(s->os, o), (size_t)o->nbytes) != ci.checksum) {
      ecs_objstore_abort(s->os, o);
      st = ECS_ECHECKSUM;
    } else {
      o->checksum = ci.checksum;
      o->commit_ms = now;
      ecs_objstore_commit(s->os, o);
      s->puts++;
      if (s->meta) {
        ecs_meta_rec_t rec;
        rec_from_obj(s, o, &rec);
        ecs_meta_queue_put(s->meta, &rec);
      }
    }
    ecs_proto_status_write(&c->out, st);
  }
  if (r.pos != r.len) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  meta_flush(s);
  reply_finish(s, c, ECS_OK, c->hdr.count, 0);
}

/* ATTACH (Unix socket only): pass the pool's memfd.  A client that only
 * reads gets a read-only descriptor, reopened through /proc, so it cannot
 * map the pool writable even by mistake. */
static void handle_attach(ecs_server_t *s, conn_t *c) {
  if (!c->local) {
    reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  uint32_t flags = ecs_rbuf_u32(&r);
  if (r.err) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ecs_pool_fd(s->pool));
  int want_write = (flags & ECS_ATTACH_WRITE) != 0;
  int fd = open(path, (want_write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    ECS_LOG_W("conn %llu: cannot reopen the pool fd: %s", (unsigned long long)c->id, strerror(errno));
    reply_error(s, c, ECS_EIO, 0);
    return;
  }
  ecs_attach_reply_t ar = {.pool_size = ecs_pool_size(s->pool), .flags = want_write ? ECS_ATTACH_WRITE : 0};
  reply_begin(c);
  ecs_proto_attach_reply_write(&c->out, &ar);
  reply_finish(s, c, ECS_OK, 0, 0);
  c->send_fd = fd;
}

/* RDMA_CONNECT: the client's blob in, ours out.  The endpoint (one RC QP
 * per connection) is made on first use and rebuilt on every later connect,
 * which is how a client recovers from an error completion. */
static void handle_rdma_connect(ecs_server_t *s, conn_t *c) {
  if (!s->rdma) {
    reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  if (c->hdr.meta_len != ECS_RDMA_BLOB_SIZE) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  int rc = c->ep ? ecs_rdma_ep_reset(c->ep) : ecs_rdma_ep_create(s->rdma, s->pool_mr, &c->ep);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_connect(c->ep, c->meta, ECS_RDMA_BLOB_SIZE);
  uint8_t blob[ECS_RDMA_BLOB_SIZE];
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_local_blob(c->ep, blob);
  if (rc != ECS_OK) {
    ECS_LOG_W("conn %llu: rdma connect failed: %s", (unsigned long long)c->id, ecs_strerror(rc));
    reply_error(s, c, rc, 0);
    return;
  }
  reply_begin(c);
  ecs_wbuf_put(&c->out, blob, sizeof blob);
  reply_finish(s, c, ECS_OK, 0, 0);
}

/* Test-only hooks, refused unless --enable-debug-ops. */
static void handle_debug(ecs_server_t *s, conn_t *c) {
  if (!s->o.enable_debug_ops) {
    reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  uint32_t sub = ecs_rbuf_u32(&r);
  const uint8_t *key;
  uint16_t klen;
  if (r.err || sub != DEBUG_CORRUPT || ecs_proto_key_read(&r, &key, &klen) != ECS_OK) {
    reply_error(s, c, ECS_EINVAL, 0);
    return;
  }
  ecs_obj_t *o = ecs_objstore_find(s->os, key, klen);
  int st = ECS_ENOTFOUND;
  if (o && o->state == ECS_OBJ_COMMITTED && o->nbytes > 0) {
    uint8_t *p = ecs_objstore_data(s->os, o);
    p[o->nbytes / 2] ^= 0x5a;
    st = ECS_OK;
  }
  reply_error(s, c, st, 0);
}

/* The header and records of a request are in; dispatch. */
static void dispatch(ecs_server_t *s, conn_t *c) {
  c->req_t0_ns = now_ns();
  if (!c->authed && c->hdr.opcode != ECS_OP_HELLO) {
    reply_error(s, c, ECS_EAUTH, 1);
    return;
  }
  /* Only PUT carries a data section from the client; only RELEASE may
   * ask for no reply. */
  if ((c->hdr.opcode != ECS_OP_PUT && c->hdr.data_len != 0) ||
      ((c->hdr.flags & ECS_FLAG_NOREPLY) && c->hdr.opcode != ECS_OP_RELEASE)) {
    reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  switch (c->hdr.opcode) {
  case ECS_OP_HELLO: handle_hello(s, c); break;
  case ECS_OP_PING: reply_error(s, c, ECS_OK, 0); break;
  case ECS_OP_STAT: handle_stat(s, c); break;
  case ECS_OP_PUT: handle_put_begin(s, c); break;
  case ECS_OP_GET: handle_get(s, c); break;
  case ECS_OP_EXISTS:
  case ECS_OP_REMOVE: handle_keys(s, c); break;
  case ECS_OP_LEASE: handle_lease(s, c); break;
  case ECS_OP_RELEASE: handle_release(s, c); break;
  case ECS_OP_RESERVE: handle_reserve(s, c); break;
  case ECS_OP_COMMIT: handle_commit(s, c); break;
  case ECS_OP_ATTACH: handle_attach(s, c); break;
  case ECS_OP_RDMA_CONNECT: handle_rdma_connect(s, c); break;
  case ECS_OP_DEBUG: handle_debug(s, c); break;
  default: reply_error(s, c, ECS_EPROTO, 1); break;
  }
}

/* ------------------------------------------------------------------ */
/* reading                                                             */

/* Reads into [p, p+n).  Returns bytes read, 0 on EAGAIN, -1 on EOF/error. */
static ssize_t read_some(int fd, void *p, size_t n) {
  for (;;) {
    ssize_t r = read(fd, p, n);
    if (r > 0)
      return r;
    if (r == 0)
      return -1;
    if (errno == EINTR)
      continue;
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  }
}

/* DATA: builds iovecs from the current item onward and readv's them. */
static ssize_t read_data(ecs_server_t *s, conn_t *c) {
  struct iovec iov[IOV_BATCH];
  int cnt = 0;
  size_t item = c->data_item;
  uint64_t off = c->data_off;
  while (cnt < IOV_BATCH && item < c->nslots) {
    put_slot_t *sl = &c->slots[item];
    uint64_t left = sl->item.nbytes - off;
    if (left == 0) {
      item++;
      off = 0;
      continue;
    }
    if (sl->obj) {
      iov[cnt].iov_base = (uint8_t *)ecs_objstore_data(s->os, sl->obj) + off;
      iov[cnt].iov_len = left > SSIZE_MAX ? SSIZE_MAX : (size_t)left;
    } else { /* refused item: its bytes go to the scratch buffer */
      iov[cnt].iov_base = s->scratch;
      iov[cnt].iov_len = left > SCRATCH_SIZE ? SCRATCH_SIZE : (size_t)left;
    }
    off += iov[cnt].iov_len;
    cnt++;
  }
  if (cnt == 0)
    return 0;
  ssize_t r;
  do {
    r = readv(c->fd, iov, cnt);
  } while (r < 0 && errno == EINTR);
  if (r == 0)
    return -1;
  if (r < 0)
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  /* advance the (item, offset) cursor by r bytes */
  uint64_t adv = (uint64_t)r;
  while (adv > 0) {
    uint64_t left = c->slots[c->data_item].item.nbytes - c->data_off;
    if (adv >= left) {
      adv -= left;
      c->data_item++;
      c->data_off = 0;
    } else {
      c->data_off += adv;
      adv = 0;
    }
  }
  return r;
}

static int data_done(conn_t *c) {
  while (c->data_item < c->nslots && c->slots[c->data_item].item.nbytes == c->data_off) {
    c->data_item++;
    c->data_off = 0;
  }
  return c->data_item >= c->nslots;
}

/* Runs the read side as far as the socket allows.  Returns -1 to close. */
static int conn_on_readable(ecs_server_t *s, conn_t *c) {
  for (;;) {
    ssize_t r;
    if (c->st == C_HDR) {
      r = read_some(c->fd, c->hdrbuf + c->hdr_got, ECS_PROTO_HDR_SIZE - c->hdr_got);
      if (r <= 0)
        return (int)r;
      c->last_ms = ecs_now_ms();
      c->hdr_got += (size_t)r;
      if (c->hdr_got < ECS_PROTO_HDR_SIZE)
        continue;
      c->hdr_got = 0;
      int rc = ecs_proto_hdr_decode(c->hdrbuf, s->o.max_request, &c->hdr);
      if (rc != ECS_OK || (c->hdr.flags & ECS_FLAG_REPLY)) {
        ECS_LOG_W("conn %llu: bad header (%s); closing", (unsigned long long)c->id,
                  ecs_strerror(rc ? rc : ECS_EPROTO));
        /* echo what we can; the framing is lost, so close after the reply */
        reply_error(s, c, rc ? rc : ECS_EPROTO, 1);
        return 1;
      }
      if (c->hdr.meta_len > c->meta_cap) {
        uint8_t *m = realloc(c->meta, c->hdr.meta_len);
        if (!m) {
          reply_error(s, c, ECS_ENOMEM, 1);
          return 1;
        }
        c->meta = m;
        c->meta_cap = c->hdr.meta_len;
      }
      c->meta_got = 0;
      c->st = C_META;
    }
    if (c->st == C_META) {
      if (c->meta_got < c->hdr.meta_len) {
        r = read_some(c->fd, c->meta + c->meta_got, c->hdr.meta_len - c->meta_got);
        if (r <= 0)
          return (int)r;
        c->last_ms = ecs_now_ms();
        c->meta_got += (size_t)r;
        if (c->meta_got < c->hdr.meta_len)
          continue;
      }
      dispatch(s, c);
      if (c->st == C_WRITE)
        return 1;
    }
    if (c->st == C_DATA) {
      if (!data_done(c)) {
        r = read_data(s, c);
        if (r <= 0)
          return (int)r;
        c->last_ms = ecs_now_ms();
        if (!data_done(c))
          continue;
      }
      handle_put_end(s, c);
      return 1;
    }
    if (c->st == C_WRITE)
      return 1;
  }
}

/* ------------------------------------------------------------------ */
/* writing                                                             */

/* Sends as much of the reply as the socket takes.  1: done, 0: blocked,
 * -1: error. */
static int conn_flush(conn_t *c) {
  while (c->wpos < c->wcnt) {
    struct iovec *iov = c->wiov + c->wpos;
    int cnt = c->wcnt - c->wpos;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)(cnt > IOV_MAX ? IOV_MAX : cnt);
    /* ATTACH: the fd rides with the reply's first bytes */
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    if (c->send_fd >= 0) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = sizeof ctl.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &c->send_fd, sizeof(int));
    }
    ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    if (c->send_fd >= 0) { /* delivered with these bytes; our copy goes */
      close(c->send_fd);
      c->send_fd = -1;
    }
    int before = cnt;
    ecs_iov_advance(&iov, &cnt, (size_t)n);
    c->wpos += before - cnt;
  }
  return 1;
}

/* Returns -1 to close the connection. */
static int conn_on_writable(ecs_server_t *s, conn_t *c) {
  int r = conn_flush(c);
  if (r < 0)
    return -1;
  if (r == 0) {
    c->last_ms = ecs_now_ms();
    return conn_set_events(s, c, EPOLLOUT) == 0 ? 0 : -1;
  }
  conn_release_refs(s, c);
  if (c->close_after_write)
    return -1;
  c->st = C_HDR;
  c->last_ms = ecs_now_ms();
  return conn_set_events(s, c, EPOLLIN) == 0 ? 0 : -1;
}

static void conn_event(ecs_server_t *s, conn_t *c, uint32_t ev) {
  int r = 0;
  if (c->st == C_WRITE) {
    if (ev & (EPOLLERR | EPOLLHUP)) {
      conn_close(s, c);
      return;
    }
    r = conn_on_writable(s, c);
  } else {
    r = conn_on_readable(s, c);
    if (r > 0 && c->st == C_WRITE)
      r = conn_on_writable(s, c);
    else if (r == 0 && (ev & (EPOLLERR | EPOLLHUP)) && !(ev & EPOLLIN))
      r = -1;
  }
  if (r < 0)
    conn_close(s, c);
}

/* A Unix-socket peer must run as one of the allowed users. */
static int peer_allowed(const ecs_server_t *s, int fd) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
    return 0;
  if (cr.uid == 0 || cr.uid == geteuid())
    return 1;
  for (int i = 0; i < s->o.n_shm_allow_uids; i++)
    if (cr.uid == s->o.shm_allow_uids[i])
      return 1;
  ECS_LOG_W("shm: refusing pid %d uid %u (not in --shm-allow-uid)", (int)cr.pid, (unsigned)cr.uid);
  return 0;
}

static void accept_all(ecs_server_t *s, int lfd, int local) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        ECS_LOG_W("accept: %s", strerror(errno));
      return;
    }
    if (s->nconns >= (size_t)s->o.max_conns) {
      ECS_LOG_W("connection limit (%d) reached; refusing", s->o.max_conns);
      close(fd);
      continue;
    }
    if (local && !peer_allowed(s, fd)) {
      close(fd);
      continue;
    }
    conn_t *c = calloc(1, sizeof *c);
    conn_t **nc = realloc(s->conns, (s->nconns + 1) * sizeof *nc);
    if (!c || !nc) {
      free(c);
      if (nc)
        s->conns = nc;
      close(fd);
      continue;
    }
    s->conns = nc;
    c->fd = fd;
    c->local = local;
    c->send_fd = -1;
    c->pin_free = PIN_NONE;
    c->id = ++s->next_conn_id;
    c->st = C_HDR;
    c->last_ms = ecs_now_ms();
    ecs_wbuf_init(&c->out);
    if (!local) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
    c->events = EPOLLIN;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
      ecs_wbuf_free(&c->out);
      free(c);
      close(fd);
      continue;
    }
    s->conns[s->nconns++] = c;
    ECS_LOG_D("conn %llu accepted%s", (unsigned long long)c->id, local ? " (local)" : "");
  }
}

/* ------------------------------------------------------------------ */
/* timers                                                              */

/* One line when the Redis link goes down and one when it is back: an
 * operator sees the outage, and that the server served on through it. */
static void redis_log_change(ecs_server_t *s) {
  int up = ecs_meta_is_up(s->meta);
  if (up == s->redis_was_up)
    return;
  s->redis_was_up = up;
  ecs_objstore_stats_t st;
  ecs_objstore_stats(s->os, &st);
  if (up)
    ECS_LOG_I("redis: connection to %s regained; re-publishing %llu objects", s->o.redis_url,
              (unsigned long long)st.objects);
  else
    ECS_LOG_W("redis: connection to %s lost (%s); serving on, records re-published when it returns",
              s->o.redis_url, ecs_meta_errstr(s->meta));
}

static void tick(ecs_server_t *s) {
  uint64_t now = ecs_now_ms();
  if (now - s->last_tick_ms < TICK_MS)
    return;
  s->last_tick_ms = now;
  if (s->meta) {
    ecs_meta_resync_t rs = {.publish_all = resync_publish_all, .has_key = resync_has_key, .ctx = s};
    ecs_meta_tick(s->meta, now, &rs);
    redis_log_change(s);
  }
  if (ecs_objstore_evict_background(s->os, 256) > 0)
    meta_flush(s);
  ecs_metrics_tick(s->metrics, now);
  /* Drop connections stalled in the middle of a request or a reply. */
  for (size_t i = 0; i < s->nconns;) {
    conn_t *c = s->conns[i];
    if (c->live_pins)
      pins_expire(s, c, now);
    int mid = c->st != C_HDR || c->hdr_got > 0;
    if (mid && now - c->last_ms > (uint64_t)s->o.io_timeout_ms) {
      ECS_LOG_W("conn %llu: stalled for %d ms mid-request; closing", (unsigned long long)c->id,
                s->o.io_timeout_ms);
      conn_close(s, c); /* swaps the last connection into slot i */
      continue;
    }
    i++;
  }
}

/* ------------------------------------------------------------------ */
/* life cycle                                                          */

/* Opens the RDMA device and registers the whole pool once, for remote
 * reads and writes.  Without a device: one line, and tcp/shm only (or a
 * failed start when --rdma on asked for it). */
static int rdma_setup(ecs_server_t *s) {
  if (!strcmp(s->o.rdma, "off"))
    return ECS_OK;
  ecs_rdma_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.device = s->o.rdma_device[0] ? s->o.rdma_device : NULL;
  ro.port = s->o.rdma_port;
  ro.gid_index = s->o.rdma_gid_index;
  char err[256] = "";
  int rc = ecs_rdma_ctx_open(&ro, ecs__rdma_ops_override(), &s->rdma, err, sizeof err);
  if (rc == ECS_OK)
    rc = ecs_rdma_reg(s->rdma, ecs_pool_base(s->pool), ecs_pool_size(s->pool),
                      ECS_RDMA_REMOTE_READ | ECS_RDMA_REMOTE_WRITE, &s->pool_mr);
  if (rc == ECS_OK) {
    ECS_LOG_I("rdma: pool registered for remote access");
    return ECS_OK;
  }
  ecs_rdma_ctx_close(s->rdma);
  s->rdma = NULL;
  if (!strcmp(s->o.rdma, "on")) {
    ECS_LOG_E("cannot start: %s", err[0] ? err : "rdma: cannot register the pool");
    return rc;
  }
  ECS_LOG_I("%s; serving tcp and shm only", err[0] ? err : "rdma: unavailable");
  return ECS_OK;
}

/* The Unix socket local clients use for shm (and any request). */
static int shm_listen(ecs_server_t *s) {
  if (s->o.shm_socket[0])
    snprintf(s->shm_path, sizeof s->shm_path, "%s", s->o.shm_socket);
  else
    snprintf(s->shm_path, sizeof s->shm_path, "/tmp/ecstore-%d.sock", s->port);
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(s->shm_path) >= sizeof a.sun_path) {
    ECS_LOG_E("cannot start: shm socket path too long: %s", s->shm_path);
    return ECS_EINVAL;
  }
  memcpy(a.sun_path, s->shm_path, strlen(s->shm_path) + 1);
  /* A socket file left by a crashed server is replaced; anything else is not. */
  struct stat st;
  if (lstat(s->shm_path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      ECS_LOG_E("cannot start: shm socket path %s exists and is not a socket", s->shm_path);
      s->shm_path[0] = '\0';
      return ECS_EINVAL;
    }
    unlink(s->shm_path);
  }
  s->ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->ufd < 0 || bind(s->ufd, (struct sockaddr *)&a, sizeof a) != 0 || listen(s->ufd, 512) != 0) {
    ECS_LOG_E("cannot start: cannot listen on %s: %s", s->shm_path, strerror(errno));
    s->shm_path[0] = '\0';
    return ECS_EIO;
  }
  /* Access is decided by SO_PEERCRED against the allowed uids, not by mode. */
  chmod(s->shm_path, 0666);
  return ECS_OK;
}

/* Population of a large pool takes seconds; a line a second, once it has
 * taken one, so that a silent server is never mistaken for a hung one. */
static void on_populate(void *ctx, size_t done, size_t total) {
  ecs_server_t *s = ctx;
  uint64_t now = ecs_now_ms();
  if (now - s->pop_log_ms < 1000 && !(done == total && now - s->pop_t0_ms >= 1000))
    return;
  s->pop_log_ms = now;
  if (done < total)
    ECS_LOG_I("pool: populating %zu of %zu MiB (%.0f%%)", done >> 20, total >> 20,
              100.0 * (double)done / (double)total);
  else
    ECS_LOG_I("pool: %zu MiB populated in %.1f s", total >> 20, (double)(now - s->pop_t0_ms) / 1000.0);
}

/* Reads "NAME: N" from /proc/meminfo (0 when absent). */
static unsigned long long meminfo(const char *name) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  unsigned long long v = 0;
  size_t n = strlen(name);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, name, n) && line[n] == ':') {
      v = strtoull(line + n + 1, NULL, 10);
      break;
    }
  if (f)
    fclose(f);
  return v;
}

/* Why the pool could not be made.  With huge pages required, the usual
 * cause is that none are reserved: say so, not "out of memory". */
static void pool_fail_log(const ecs_server_opts_t *o, int rc) {
  unsigned long long mib = (unsigned long long)(o->pool_size >> 20);
  if (o->hugepages == 2 && rc == ECS_ENOMEM) {
    unsigned long long kb = meminfo("Hugepagesize"), nfree = meminfo("HugePages_Free");
    if (nfree * kb * 1024 < o->pool_size) {
      ECS_LOG_E(
          "cannot start: --hugepages require: a %llu MiB pool needs %llu huge pages of %llu kB, %llu are "
          "free (reserve them with: sysctl vm.nr_hugepages=N, or use --hugepages try)",
          mib, kb ? (unsigned long long)((o->pool_size + kb * 1024 - 1) / (kb * 1024)) : 0ULL, kb, nfree);
      return;
    }
  }
  ECS_LOG_E("cannot start: cannot create a pool of %llu MiB: %s", mib, ecs_strerror(rc));
}

int ecs_server_create(const ecs_server_opts_t *o, ecs_server_t **out) {
  *out = NULL;
  ecs_server_t *s = calloc(1, sizeof *s);
  if (!s)
    return ECS_ENOMEM;
  s->o = *o;
  s->lfd = s->ufd = s->epfd = s->evfd = -1;
  s->epoch = ecs_wall_us();
  int rc = ECS_ENOMEM;
  s->scratch = malloc(SCRATCH_SIZE);
  if (!s->scratch) {
    ECS_LOG_E("cannot start: %s", ecs_strerror(rc));
    goto fail;
  }
  /* Bound now (so the port is known for the node id) but listening only at
   * the end: a client that can connect finds the node registered. */
  rc = ecs_net_listen(o->listen_host, o->listen_port, -1, &s->lfd);
  if (rc) {
    int e = errno;
    ECS_LOG_E("cannot start: cannot listen on %s:%d: %s%s", o->listen_host, o->listen_port, strerror(e),
              e == EADDRINUSE ? " (another server on this port? pick one with --listen)" : "");
    goto fail;
  }
  s->port = ecs_net_local_port(s->lfd);
  if (!s->o.node_id[0])
    snprintf(s->o.node_id, sizeof s->o.node_id, "%.50s:%d", o->listen_host, s->port);
  if (!s->o.advertise[0])
    snprintf(s->o.advertise, sizeof s->o.advertise, "%s:%d", o->listen_host, s->port);

  ecs_pool_opts_t po;
  ecs_pool_opts_init(&po);
  po.size = (size_t)o->pool_size;
  po.min_block = (size_t)o->min_block;
  po.huge = (ecs_pool_huge_t)o->hugepages;
  po.lock = o->lock_pool;
  po.cuda_register = o->cuda_register;
  po.on_populate = on_populate;
  po.populate_ctx = s;
  s->pop_t0_ms = s->pop_log_ms = ecs_now_ms();
  if (o->pool_size >= (1ull << 30)) /* about a second per GiB or two: say so before it starts */
    ECS_LOG_I("pool: populating and pinning %llu MiB", (unsigned long long)(o->pool_size >> 20));
  rc = ecs_pool_create(&po, &s->pool);
  if (rc) {
    pool_fail_log(o, rc);
    goto fail;
  }
  ecs_objstore_opts_t oo;
  ecs_objstore_opts_init(&oo);
  oo.high_watermark = o->high_watermark;
  oo.low_watermark = o->low_watermark;
  oo.on_drop = on_drop;
  oo.cb_ctx = s;
  rc = ecs_objstore_create(s->pool, &oo, &s->os);
  if (rc) {
    ECS_LOG_E("cannot start: object index: %s", ecs_strerror(rc));
    goto fail;
  }

  if (o->redis_url[0] && strcmp(o->redis_url, "none") != 0) {
    ecs_meta_opts_t mo;
    ecs_meta_opts_init(&mo);
    mo.redis_url = s->o.redis_url;
    mo.ns = s->o.ns;
    mo.node_id = s->o.node_id;
    mo.addr = s->o.advertise;
    mo.pool_size = ecs_pool_size(s->pool);
    mo.epoch = s->epoch;
    mo.timeout_ms = o->redis_timeout_ms;
    mo.heartbeat_ttl_s = o->heartbeat_ttl_s;
    rc = ecs_meta_open(&mo, &s->meta);
    if (rc) {
      ECS_LOG_E("cannot start: bad --redis '%s': %s", o->redis_url, ecs_strerror(rc));
      goto fail;
    }
    s->redis_was_up = ecs_meta_is_up(s->meta);
    if (ecs_meta_is_up(s->meta) && ecs_meta_register(s->meta) == ECS_OK)
      ECS_LOG_I("registered with Redis at %s as node '%s'", o->redis_url, s->o.node_id);
    else
      ECS_LOG_W("Redis at %s is unreachable (%s); serving anyway, will retry", o->redis_url,
                ecs_meta_errstr(s->meta));
  } else {
    ECS_LOG_W("running without Redis: exists checks through Redis will see nothing");
  }

  rc = ECS_EIO;
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  s->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->epfd < 0 || s->evfd < 0)
    goto fail_sys;
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &e) != 0)
    goto fail_sys;
  e.data.ptr = &s->evfd;
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->evfd, &e) != 0)
    goto fail_sys;
  rc = rdma_setup(s);
  if (rc)
    goto fail;
  if (strcmp(o->shm_socket, "off") != 0) {
    rc = shm_listen(s);
    if (rc)
      goto fail;
    e.data.ptr = &s->ufd;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->ufd, &e) != 0)
      goto fail_sys;
  }
  if (o->metrics_listen[0]) {
    char mh[128], merr[256];
    int mp;
    rc = ECS_EINVAL;
    if (ecs_net_parse_hostport(o->metrics_listen, mh, sizeof mh, &mp)) {
      ECS_LOG_E("cannot start: --metrics-listen '%s': expected HOST:PORT", o->metrics_listen);
      goto fail;
    }
    rc = ecs_metrics_open(mh, mp, s->epfd, render_metrics, s, &s->metrics, merr, sizeof merr);
    if (rc) {
      ECS_LOG_E("cannot start: %s", merr);
      goto fail;
    }
    ECS_LOG_I("metrics: http://%s:%d/metrics", mh, ecs_metrics_port(s->metrics));
  }
  rc = ECS_EIO;
  if (listen(s->lfd, 512) != 0)
    goto fail_sys;
  *out = s;
  return ECS_OK;
fail_sys:
  ECS_LOG_E("cannot start: %s", strerror(errno));
fail:
  ecs_server_destroy(s);
  return rc;
}

int ecs_server_port(const ecs_server_t *s) {
  return s->port;
}

void ecs_server_stop(ecs_server_t *s) {
  s->stopping = 1;
  uint64_t one = 1;
  ssize_t r = write(s->evfd, &one, sizeof one);
  (void)r;
}

int ecs_server_run(ecs_server_t *s) {
  ecs_pool_stats_t ps;
  ecs_pool_stats(s->pool, &ps);
  ECS_LOG_I("ready: listening on %s:%d%s%s; namespace '%s', pool %llu MiB (%s), epoch %llu", s->o.listen_host,
            s->port, s->shm_path[0] ? " and shm " : "", s->shm_path, s->o.ns,
            (unsigned long long)(ps.size >> 20), ps.locked ? "pinned" : "NOT pinned",
            (unsigned long long)s->epoch);
  struct epoll_event evs[64];
  while (!s->stopping) {
    int n = epoll_wait(s->epfd, evs, 64, TICK_MS);
    if (n < 0 && errno != EINTR) {
      ECS_LOG_E("epoll_wait: %s", strerror(errno));
      return ECS_EIO;
    }
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == NULL)
        accept_all(s, s->lfd, 0);
      else if (p == &s->ufd)
        accept_all(s, s->ufd, 1);
      else if (p == &s->evfd)
        s->stopping = 1;
      else if (ecs_metrics_owns(s->metrics, p))
        ecs_metrics_event(s->metrics, p, evs[i].events);
      else
        conn_event(s, p, evs[i].events);
    }
    tick(s);
  }
  ECS_LOG_I("stopping: closing %zu connections", s->nconns);
  while (s->nconns)
    conn_close(s, s->conns[0]);
  if (s->meta && ecs_meta_is_up(s->meta)) {
    int rc = ecs_meta_unregister(s->meta);
    if (rc)
      ECS_LOG_W("could not remove records from Redis: %s", ecs_strerror(rc));
    else
      ECS_LOG_I("records and registry entry removed from Redis");
  }
  return ECS_OK;
}

void ecs_server_destroy(ecs_server_t *s) {
  if (!s)
    return;
  while (s->nconns)
    conn_close(s, s->conns[0]);
  free(s->conns);
  ecs_metrics_close(s->metrics);
  ecs_meta_close(s->meta);
  ecs_objstore_destroy(s->os);
  ecs_rdma_dereg(s->pool_mr);
  ecs_rdma_ctx_close(s->rdma);
  ecs_pool_destroy(s->pool);
  if (s->lfd >= 0)
    close(s->lfd);
  if (s->ufd >= 0) {
    close(s->ufd);
    unlink(s->shm_path);
  }
  if (s->epfd >= 0)
    close(s->epfd);
  if (s->evfd >= 0)
    close(s->evfd);
  free(s->scratch);
  free(s);
}
