/*
 * What the RDMA transport's files share (not installed): the wire-blob
 * constants, and in an RDMA build the context, MR and endpoint structs and
 * the endpoint helpers the batch engine calls.
 *
 *   rdma.c        contexts (device, PD, port), MR registration, endpoints
 *                 (CQ, QP life cycle, windows, connecting, reconnecting)
 *   rdma_batch.c  batches of READ / WRITE over an endpoint
 *   rdma_blob.c   the connection blob codec (every build)
 */
#ifndef ECS_RDMA_INTERNAL_H
#define ECS_RDMA_INTERNAL_H

#include <stdint.h>

#include "store/rdma/rdma.h"

/* Link layers as verbs numbers them (IBV_LINK_LAYER_*), repeated here so the
 * codec builds without verbs.h. */
#define ECS_RDMA_LL_INFINIBAND 1
#define ECS_RDMA_LL_ETHERNET 2
#define ECS_RDMA_PSN_MASK 0xffffffu

#ifdef ECS_HAVE_RDMA

#include <time.h>

#include "store/rdma/verbs_ops.h"

struct ecs_rdma_ctx {
  const ecs_verbs_ops *ops; /* every verbs call goes through here */
  struct ibv_context *vctx; /* the open device */
  struct ibv_pd *pd;        /* one PD for all MRs and QPs */
  char device[64];          /* its name */
  uint8_t port;             /* port number */
  int gid_index;            /* source GID index */
  union ibv_gid gid;        /* the port's GID at gid_index */
  uint16_t lid;             /* the port's LID (0 on RoCE) */
  uint8_t link_layer;       /* IBV_LINK_LAYER_* */
  enum ibv_mtu mtu;         /* the port's active MTU */
  uint32_t slice;           /* bytes per work request */
  int max_out;              /* work requests in flight per endpoint */
  int rd_atom;              /* READ depth, both as initiator and responder */
  int timeout_ms;           /* default batch deadline */
};

struct ecs_rdma_mr {
  ecs_rdma_ctx *ctx; /* owner */
  struct ibv_mr *mr; /* the registration */
  int window;        /* made by ecs_rdma_ep_window: zero-based, remote use only */
};

/* Where one item of the running batch stands. */
enum item_state {
  IT_ACTIVE = 0, /* being transferred */
  IT_DONE,       /* ended: status holds the outcome */
  IT_FLUSHED     /* broken by another item's error; may be retried */
};

typedef struct item_track {
  uint64_t next_off;     /* bytes of the item posted so far */
  uint32_t inflight;     /* its slices posted and not yet completed */
  enum item_state state; /* see above */
} item_track;

struct ecs_rdma_ep {
  ecs_rdma_ctx *ctx;         /* owner */
  struct ibv_pd *own_pd;     /* an isolated endpoint's own PD, or NULL (the context's) */
  const ecs_rdma_mr *advert; /* region advertised in our blobs, or NULL */
  struct ibv_cq *cq;         /* NULL while no QP is built */
  struct ibv_qp *qp;         /* current QP, or NULL */
  uint32_t psn;              /* the current QP's first send PSN */
  int connected;             /* the QP is in RTS */
  ecs_rdma_blob peer;        /* the peer's blob, while connected */
  ecs_rdma_exchange_fn xchg; /* reconnect callback, or NULL */
  void *xchg_arg;            /* its argument */
  item_track *trk;           /* per-item state of the running batch */
  size_t trk_cap;            /* entries in trk */
  struct ibv_send_wr *wrs;   /* max_out work requests, chained per post */
  struct ibv_sge *sges;      /* their scatter/gather entries */
  ecs_rdma_ep_stats st;      /* counters */
  char errmsg[160];          /* last error detail */
};

static inline uint64_t ecs__rdma_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Formats an error detail into buf (when there is one) and returns rc. */
int ecs__rdma_set_err(char *buf, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define EP_ERR(ep, rc, ...) ecs__rdma_set_err((ep)->errmsg, sizeof((ep)->errmsg), (rc), __VA_ARGS__)

/* After an error or a timeout: stop the QP, collect what it still reports
 * for a short while, destroy it and build a fresh one. */
void ecs__rdma_ep_rebuild(ecs_rdma_ep *ep);
/* Reconnects through the exchange callback within the deadline. */
int ecs__rdma_ep_reconnect(ecs_rdma_ep *ep, uint64_t deadline);

#endif /* ECS_HAVE_RDMA */

#endif
