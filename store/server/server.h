/*
 * ecstore-server: one process owns one pinned pool and serves tensors by
 * key over TCP, publishing object records to Redis.
 *
 * The server is a single-threaded epoll loop over non-blocking sockets.
 * PUT payloads are read (readv) straight into their pool blocks and GET
 * payloads are written (sendmsg) straight from them: the server never
 * copies payload bytes.  Every request is parsed with store/core/proto.h before
 * any length in it is used.
 *
 * Thread safety: ecs_server_run() runs on one thread; ecs_server_stop() may
 * be called from any thread or a signal handler.
 */
#ifndef ECS_SERVER_H
#define ECS_SERVER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ecs_server ecs_server_t;

#define ECS_SERVER_MAX_THREADS 256 /* bound on --threads */

typedef struct ecs_server_opts {
  char listen_host[128];       /* default "127.0.0.1" */
  int listen_port;             /* default 7700; 0 picks a free port */
  char advertise[160];         /* address put in the registry (default listen) */
  uint64_t pool_size;          /* default 1 GiB */
  uint64_t min_block;          /* default 4096 */
  int hugepages;               /* ecs_pool_huge_t */
  int lock_pool;               /* mlock the pool (default 1) */
  int cuda_register;           /* cudaHostRegister the pool when libcudart loads */
  char redis_url[256];         /* default "127.0.0.1:6379"; "" or "none" runs without Redis */
  char ns[129];                /* namespace served (default "default") */
  char node_id[64];            /* default "HOST:PORT" of the listen address */
  char auth_token[257];        /* empty: no auth */
  int io_timeout_ms;           /* a request stalled this long is dropped (30000) */
  int redis_timeout_ms;        /* per Redis call (500) */
  int registry_ttl_ms;         /* registry TTL in ms (10000; --heartbeat-ttl S sets S * 1000) */
  double high_watermark;       /* background eviction above this fill (0.95) */
  double low_watermark;        /* ...down to this fill (0.85) */
  uint64_t max_request;        /* largest data section of one request (4 GiB) */
  int max_conns;               /* connection limit (1024) */
  int threads;                 /* event-loop threads (0: the cores available, sched_getaffinity) */
  int enable_debug_ops;        /* allow test-only DEBUG requests */
  char shm_socket[108];        /* Unix socket for local clients: "" = a directory the server owns, "off" */
  unsigned shm_allow_uids[16]; /* uids that may map the pool read-only (besides ours and root) */
  int n_shm_allow_uids;        /* entries in shm_allow_uids */
  unsigned shm_write_uids[16]; /* uids that may map it writable (besides ours and root) */
  int n_shm_write_uids;        /* entries in shm_write_uids */
  int lease_timeout_ms;        /* a lease or reservation not released by then is dropped (30000) */
  char rdma[8];                /* "auto" (default: use a device when there is one), "on", "off" */
  char rdma_device[64];        /* RDMA device ("": the first one) */
  int rdma_port;               /* RDMA port (default 1) */
  int rdma_gid_index;          /* RoCE GID index (default 0) */
  char metrics_listen[160];    /* "HOST:PORT" of the Prometheus endpoint; "" (default): none */
  int hello_timeout_ms;        /* a connection not authenticated by then is closed (5000) */
  int max_preauth_conns;       /* connections yet to say HELLO (64); the oldest goes when full */
  int auth_fail_delay_ms;      /* a source's failed HELLOs: 5 at once, then one per this (1000) */
  uint32_t max_pins;           /* leases + reservations one connection may hold (4096) */
  uint64_t max_pinned_bytes;   /* bytes one connection may hold pinned (0: 3/4 of the pool) */
  uint64_t max_objects;        /* objects held, empty ones included (0: pool size / min block) */
  uint64_t soft_pin_ttl_ms;    /* how long a put's soft pin keeps its object from eviction (1800000) */
  uint64_t hard_pin_max;       /* bytes hard-pinned objects may hold in all (0: half the pool) */
  int scrub_freed;             /* zero an object's pool bytes when it is freed */
  int unprotected;             /* allow a non-loopback listen address without an auth token */
  int pull_timeout_ms;         /* the longest a PULL waits for its holder (5000) */
  int pull_threads;            /* threads fetching PULLed objects (4; 0: PULL refused) */
  char pull_token[257];        /* token presented to holders ("": auth_token, if any) */
  const struct ecs__acl *acl;  /* --acl-file: rights per token and namespace (store/server/acl.h), owned
                                  by the caller; NULL: auth_token alone, with every right */
} ecs_server_opts_t;

void ecs_server_opts_init(ecs_server_opts_t *o);

/* Creates the pool, binds the socket and opens Redis (a Redis that is down
 * is retried in the background).  Returns ECS_OK, or an error code after
 * logging one line, "cannot start: ...", that says why (the code alone
 * rarely does: a port in use and a failed epoll are both ECS_EIO). */
int ecs_server_create(const ecs_server_opts_t *o, ecs_server_t **out);

/* Serves until ecs_server_stop(); then unregisters from Redis. */
int ecs_server_run(ecs_server_t *s);

/* Asks the loop to stop; async-signal-safe. */
void ecs_server_stop(ecs_server_t *s);

/* The port actually bound. */
int ecs_server_port(const ecs_server_t *s);

/* Frees everything; accepts NULL. */
void ecs_server_destroy(ecs_server_t *s);

#endif
