/*
 * Internals shared by the client's modules: client.c (connections, TCP
 * requests) and client_shm.c (the shared-memory data path).  Not installed.
 */
#ifndef ECS_CLIENT_PRIV_H
#define ECS_CLIENT_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ecstore/ecstore.h"
#include "store/meta.h"
#include "store/net.h"
#include "store/proto.h"

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

typedef enum ecs_cli_path { ECS_PATH_TCP = 0, ECS_PATH_SHM = 1, ECS_PATH_RDMA = 2 } ecs_cli_path_t;

typedef struct ecs_cli_srv {
  char host[128];         /* from the config */
  int port;               /* from the config */
  char addr[160];         /* "HOST:PORT" as configured */
  int fd;                 /* the connection (TCP, or the Unix socket on the shm path); -1 */
  ecs_cli_path_t path;    /* what fd is */
  char node_id[64];       /* from HELLO */
  uint64_t epoch;         /* from HELLO */
  uint64_t max_data;      /* from HELLO */
  char shm_path[108];     /* the server's Unix socket, from HELLO over TCP */
  ecs_shm_map_t *map;     /* the pool mapping while path == SHM */
  struct ecs_rdma_ep *ep; /* RDMA endpoint while path == RDMA */
  uint64_t region_addr;   /* the server's pool as advertised over RDMA */
  uint64_t region_len;    /* its length */
  uint32_t region_rkey;   /* its rkey */
  struct ecs_client *cli; /* the owning client (for the RDMA exchange callback) */
} ecs_cli_srv_t;

typedef enum ecs_cli_want {
  ECS_WANT_TCP = 0,
  ECS_WANT_AUTO = 1,
  ECS_WANT_SHM = 2,
  ECS_WANT_RDMA = 3
} ecs_cli_want_t;

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
  ecs_cli_want_t want;       /* transport asked for */
  int codec;                 /* request codec for TCP puts (store/codec.h), or ECS_CODEC_NONE */
  uint8_t put_flags;         /* ECS_PUT_F_* for the put in progress (ecs_upsert_batch sets UPSERT) */
  struct ecs_rdma_ctx *rdma; /* RDMA device context (transport rdma), or NULL */
  ecs_cli_reg_t *regs;       /* registered buffers */
  size_t nregs, regs_cap;    /* count and capacity */
  ecs_meta_t *meta;          /* Redis link for exists_batch, or NULL */
  uint64_t redis_retry_ms;   /* after a Redis failure, exists asks the servers until then */
  uint32_t next_req;         /* request ids */
  uint8_t *rmeta;            /* reply records buffer */
  size_t rmeta_cap;          /* its size */
  ecs_wbuf_t w;              /* request records */
  char errmsg[256];          /* last whole-batch error detail */
};

/* How long exists skips a Redis that just failed (then tries it again). */
#define ECS_CLI_REDIS_RETRY_MS 1000

static inline uint64_t ecs__cli_deadline(const ecs_client_t *c) {
  return ecs_now_ms() + (uint64_t)c->cfg.timeout_ms;
}

void ecs__cli_err(ecs_client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Closes a server's connection (and retires its mapping). */
void ecs__cli_drop(ecs_cli_srv_t *s);
/* Records the error and drops the connection (its stream position is unknown). */
int ecs__cli_fail(ecs_client_t *c, ecs_cli_srv_t *s, int rc);
/* Connects and greets server s if it is not connected. */
int ecs__cli_ensure(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);
/* One server's share of a batch (idx: indices into the caller's arrays),
 * and how to mark an item that a whole-share failure took down. */
typedef int (*ecs_cli_share_fn)(ecs_client_t *c, ecs_cli_srv_t *s, const size_t *idx, size_t m, void *arg,
                                uint64_t deadline);
typedef void (*ecs_cli_mark_fn)(void *arg, size_t i, int rc);
/* Runs fn over every server's share of the items skip[] leaves in; see client.c. */
int ecs__cli_each_share(ecs_client_t *c, const ecs_key_t *keys, const int *skip, size_t n, uint64_t deadline,
                        ecs_cli_share_fn fn, ecs_cli_mark_fn mark, void *arg);
/* The server index an object lives on (key hash over the server list). */
size_t ecs__cli_route(const ecs_client_t *c, const ecs_key_t *k);
/* HELLO on s->fd; fills node_id, epoch, max_data, shm_path. */
int ecs__cli_hello(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);
/* Sends header + c->w records + data iovecs; *req_id is the id used. */
int ecs__cli_send(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint16_t flags, uint32_t count,
                  const struct iovec *data, int ndata, uint64_t data_len, uint32_t *req_id,
                  uint64_t deadline);
/* Reads a reply's header and records (into c->rmeta). */
int ecs__cli_recv(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint32_t req_id, ecs_hdr_t *h,
                  uint64_t deadline);

/* Delivers one stored object at src into b (verify, copy or decompress,
 * capacity against the raw size); returns the item's status. */
int ecs__cli_deliver(ecs_client_t *c, ecs_get_buf_t *b, const void *src, uint8_t codec, uint64_t nbytes,
                     uint64_t raw_nbytes, uint64_t checksum, int alloc);

/* client_shm.c: after a TCP HELLO that named a shm socket, try to switch
 * server s to it (same node and epoch over both sockets, then ATTACH and
 * map).  ECS_OK when s->path is now SHM; an error otherwise (s is left on
 * TCP, connected). */
int ecs__shm_upgrade(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);
/* The shm data path for one server's share of a batch (idx[0..m)). */
int ecs__shm_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                 const size_t *idx, size_t m, int alloc, uint64_t deadline);
int ecs__shm_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                 const size_t *idx, size_t m, int *status, uint64_t deadline);
/* In-place puts (shm, RDMA): write() moves src[k] (nbytes) to pool
 * offset off[k] and sets st[k]; a nonzero return fails the whole call. */
typedef int (*ecs_cli_writer_fn)(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_tensor_t *const *src,
                                 const uint64_t *off, size_t n, int *st, uint64_t deadline);
/* RESERVE -> write -> COMMIT for one server's share of a batch (a key that
 * repeats in the batch is written once and the repeats settled after). */
int ecs__cli_put_inplace(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                         const size_t *idx, size_t m, int *status, uint64_t deadline,
                         ecs_cli_writer_fn write);
/* LEASE for keys idx[0..m) (records in c->rmeta), and a one-way RELEASE. */
int ecs__cli_lease(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const size_t *idx, size_t m,
                   ecs_hdr_t *h, uint64_t deadline);
void ecs__cli_release(ecs_client_t *c, ecs_cli_srv_t *s, const uint64_t *ids, size_t n, uint64_t deadline);

/* client_rdma.c: open/close the device context, set up a server's
 * endpoint after its TCP HELLO, and the RDMA data path. */
int ecs__rdma_client_open(ecs_client_t *c, char *errbuf, size_t errlen);
void ecs__rdma_client_close(ecs_client_t *c);
int ecs__rdma_upgrade(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline);
void ecs__rdma_drop(ecs_cli_srv_t *s);
int ecs__rdma_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                  const size_t *idx, size_t m, int alloc, uint64_t deadline);
int ecs__rdma_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                  const size_t *idx, size_t m, int *status, uint64_t deadline);

/* Unmaps a mapping that no view holds any more. */
void ecs__shm_map_put(ecs_shm_map_t *m);

#endif
