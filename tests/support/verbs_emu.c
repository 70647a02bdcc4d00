/*
 * In-process emulation of the verbs calls in verbs_ops.h; see verbs_emu.h
 * for what it models.  Test-only: built into the static library
 * ecstore_verbs_emu that the RDMA tests link, never into libecstore.
 *
 * Every emulated object embeds the libibverbs struct it stands for as its
 * first member, so the transport sees ordinary ibv_* pointers, and the
 * emulation gets back to its own state with a cast.  All objects of one
 * kind sit on one list in the emulation; lists are short in tests, so
 * lookups (by key, by QP number) walk them.
 */
#ifdef ECS_HAVE_RDMA

#include "support/verbs_emu.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"

#define EMU_GID_TBL 4
#define EMU_MAX_QP_WR 1024
#define EMU_MAX_CQE 4096
#define EMU_MAX_RD_ATOM 16
#define EMU_MAX_MSG (1u << 31)
#define EMU_PSN_MASK 0xffffffu

typedef struct emu_dev {
  struct ibv_device dev;          /* what get_device_list hands out */
  int index;                      /* 0, 1, ... */
  uint8_t link_layer;             /* IBV_LINK_LAYER_ETHERNET or _INFINIBAND */
  uint16_t lid;                   /* 0 on Ethernet */
  enum ibv_mtu active_mtu;        /* the port's MTU */
  union ibv_gid gid[EMU_GID_TBL]; /* GID table of port 1 */
} emu_dev;

typedef struct emu_ctx {
  struct ibv_context ctx; /* ctx.device points at the emu_dev */
  struct ecs_verbs_emu *emu;
  emu_dev *dev;         /* the device opened */
  int refs;             /* PDs and CQs made from it */
  struct emu_ctx *next; /* emulation's list */
} emu_ctx;

typedef struct emu_pd {
  struct ibv_pd pd;
  int refs; /* MRs and QPs in it */
  struct emu_pd *next;
} emu_pd;

typedef struct emu_mr {
  struct ibv_mr mr;
  uint64_t iova; /* where requests address it: mr.addr, or reg_mr_iova's iova */
  int access;    /* IBV_ACCESS_* given to reg_mr */
  struct emu_mr *next;
} emu_mr;

typedef struct emu_cq {
  struct ibv_cq cq;
  struct ibv_wc *ring; /* completions not yet polled */
  int cap;             /* ring size (cq.cqe) */
  int head;            /* oldest completion */
  int count;           /* completions in the ring */
  int refs;            /* QPs using it */
  struct emu_cq *next;
} emu_cq;

/* A queued work request: the fields of ibv_send_wr the emulation honours. */
typedef struct emu_wr {
  uint64_t wr_id;
  enum ibv_wr_opcode opcode; /* IBV_WR_RDMA_READ or IBV_WR_RDMA_WRITE */
  uint64_t laddr;            /* local SGE */
  uint32_t len;
  uint32_t lkey;
  uint64_t raddr; /* remote address and key */
  uint32_t rkey;
} emu_wr;

typedef struct emu_qp {
  struct ibv_qp qp;
  emu_wr *sq;             /* queued, not yet executed requests (a ring) */
  int sq_cap;             /* max_send_wr */
  int sq_head;            /* oldest queued request */
  int sq_count;           /* queued requests */
  int sq_used;            /* queued + completions not yet polled */
  int access;             /* qp_access_flags (responder side) */
  uint8_t port;           /* port_num from INIT */
  enum ibv_mtu path_mtu;  /* from RTR */
  uint32_t dest_qpn;      /* from RTR */
  uint32_t rq_psn;        /* next PSN expected as responder */
  uint32_t sq_psn;        /* next PSN sent as requester */
  struct ibv_ah_attr ah;  /* address of the peer (RTR) */
  int max_rd_atomic;      /* RTS: reads in flight as initiator */
  int max_dest_rd_atomic; /* RTR: reads in flight accepted as responder */
  long ops;               /* requests executed */
  ecs_emu_fail fail;      /* armed fault */
  unsigned fail_after;    /* fault fires once ops reaches this */
  int stalled;            /* requests are held back (STALL fired) */
  struct emu_qp *next;
} emu_qp;

struct ecs_verbs_emu {
  pthread_mutex_t mu; /* guards everything below */
  ecs_verbs_ops ops;  /* the table handed out, priv = this */
  int ndev;
  emu_dev *devs;
  int device_lists; /* live get_device_list arrays */
  emu_ctx *ctxs;
  emu_pd *pds;
  emu_mr *mrs;
  emu_cq *cqs;
  emu_qp *qps;
  uint32_t next_key; /* MR keys are never reused */
  uint32_t next_qpn;
  int cq_overruns;
};

/* ---- Helpers --------------------------------------------------------------- */

static ecs_verbs_emu *emu_of(struct ibv_context *c) {
  return ((emu_ctx *)c)->emu;
}

static void lock(ecs_verbs_emu *e) {
  pthread_mutex_lock(&e->mu);
}

static void unlock(ecs_verbs_emu *e) {
  pthread_mutex_unlock(&e->mu);
}

/* Unlinks p from a singly linked list whose next field is at offset off. */
#define EMU_UNLINK(head, type, p)                                                                            \
  do {                                                                                                       \
    type **pp_ = &(head);                                                                                    \
    while (*pp_ && *pp_ != (p))                                                                              \
      pp_ = &(*pp_)->next;                                                                                   \
    if (*pp_)                                                                                                \
      *pp_ = (p)->next;                                                                                      \
  } while (0)

static emu_qp *find_qp(ecs_verbs_emu *e, uint32_t qpn) {
  for (emu_qp *q = e->qps; q; q = q->next)
    if (q->qp.qp_num == qpn)
      return q;
  return NULL;
}

static emu_mr *find_mr(ecs_verbs_emu *e, struct ibv_pd *pd, uint32_t key, int remote) {
  for (emu_mr *m = e->mrs; m; m = m->next)
    if (m->mr.pd == pd && (remote ? m->mr.rkey : m->mr.lkey) == key)
      return m;
  return NULL;
}

/* Is [addr, addr+len), in the MR's request address space (its iova), inside it? */
static int in_mr(const emu_mr *m, uint64_t addr, uint64_t len) {
  return addr >= m->iova && len <= m->mr.length && addr - m->iova <= m->mr.length - len;
}

/* The memory behind a request address that in_mr accepted. */
static void *mr_ptr(const emu_mr *m, uint64_t addr) {
  return (char *)m->mr.addr + (addr - m->iova);
}

static int gid_zero(const union ibv_gid *g) {
  static const union ibv_gid z;
  return !memcmp(g, &z, sizeof(z));
}

static uint32_t mtu_bytes(enum ibv_mtu m) {
  return 128u << (m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? (int)m : 1);
}

/* ---- Devices --------------------------------------------------------------- */

static struct ibv_device **emu_get_device_list(void *priv, int *num) {
  ecs_verbs_emu *e = priv;
  lock(e);
  struct ibv_device **list = calloc((size_t)e->ndev + 1, sizeof(*list));
  if (!list) {
    unlock(e);
    errno = ENOMEM;
    return NULL;
  }
  for (int i = 0; i < e->ndev; i++)
    list[i] = &e->devs[i].dev;
  e->device_lists++;
  if (num)
    *num = e->ndev;
  unlock(e);
  return list;
}

static void emu_free_device_list(void *priv, struct ibv_device **list) {
  ecs_verbs_emu *e = priv;
  if (!list)
    return;
  lock(e);
  e->device_lists--;
  unlock(e);
  free(list);
}

static const char *emu_get_device_name(struct ibv_device *dev) {
  return dev->name;
}

/* The devices are allocated as [ecs_verbs_emu *self][emu_dev devs[n]] so
 * that a device leads back to its emulation (open_device gets nothing else). */
typedef struct emu_devblock {
  ecs_verbs_emu *self;
  emu_dev devs[];
} emu_devblock;

static ecs_verbs_emu *emu_of_dev(struct ibv_device *dev) {
  emu_dev *d = (emu_dev *)dev;
  return ((emu_devblock *)((char *)(d - d->index) - offsetof(emu_devblock, devs)))->self;
}

static struct ibv_context *emu_open_device(struct ibv_device *dev) {
  ecs_verbs_emu *e = emu_of_dev(dev);
  emu_ctx *c = calloc(1, sizeof(*c));
  if (!c) {
    errno = ENOMEM;
    return NULL;
  }
  c->emu = e;
  c->dev = (emu_dev *)dev;
  c->ctx.device = dev;
  lock(e);
  c->next = e->ctxs;
  e->ctxs = c;
  unlock(e);
  return &c->ctx;
}

static int emu_close_device(struct ibv_context *ctx) {
  ecs_verbs_emu *e = emu_of(ctx);
  emu_ctx *c = (emu_ctx *)ctx;
  lock(e);
  if (c->refs) {
    unlock(e);
    return EBUSY;
  }
  EMU_UNLINK(e->ctxs, emu_ctx, c);
  unlock(e);
  free(c);
  return 0;
}

static int emu_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr) {
  emu_ctx *c = (emu_ctx *)ctx;
  memset(attr, 0, sizeof(*attr));
  snprintf(attr->fw_ver, sizeof(attr->fw_ver), "emu-1");
  attr->max_mr_size = UINT64_MAX;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = EMU_MAX_QP_WR;
  attr->max_sge = 1;
  attr->max_cq = 1 << 16;
  attr->max_cqe = EMU_MAX_CQE;
  attr->max_mr = 1 << 16;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = EMU_MAX_RD_ATOM;
  attr->max_qp_init_rd_atom = EMU_MAX_RD_ATOM;
  attr->phys_port_cnt = 1;
  attr->vendor_part_id = (uint32_t)c->dev->index;
  return 0;
}

static int emu_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
  emu_ctx *c = (emu_ctx *)ctx;
  if (port != 1)
    return EINVAL;
  memset(attr, 0, sizeof(*attr));
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = c->dev->active_mtu;
  attr->gid_tbl_len = EMU_GID_TBL;
  attr->max_msg_sz = EMU_MAX_MSG;
  attr->lid = c->dev->lid;
  attr->link_layer = c->dev->link_layer;
  attr->phys_state = 5; /* LinkUp */
  return 0;
}

static int emu_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
  emu_ctx *c = (emu_ctx *)ctx;
  if (port != 1 || index < 0 || index >= EMU_GID_TBL)
    return EINVAL;
  *gid = c->dev->gid[index];
  return 0;
}

/* ---- PDs and MRs ------------------------------------------------------------ */

static struct ibv_pd *emu_alloc_pd(struct ibv_context *ctx) {
  ecs_verbs_emu *e = emu_of(ctx);
  emu_pd *p = calloc(1, sizeof(*p));
  if (!p) {
    errno = ENOMEM;
    return NULL;
  }
  p->pd.context = ctx;
  lock(e);
  p->next = e->pds;
  e->pds = p;
  ((emu_ctx *)ctx)->refs++;
  unlock(e);
  return &p->pd;
}

static int emu_dealloc_pd(struct ibv_pd *pd) {
  ecs_verbs_emu *e = emu_of(pd->context);
  emu_pd *p = (emu_pd *)pd;
  lock(e);
  if (p->refs) {
    unlock(e);
    return EBUSY;
  }
  EMU_UNLINK(e->pds, emu_pd, p);
  ((emu_ctx *)pd->context)->refs--;
  unlock(e);
  free(p);
  return 0;
}

static struct ibv_mr *emu_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
  ecs_verbs_emu *e = emu_of(pd->context);
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if ((access & ~known) || ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      (!addr && len) || iova > UINT64_MAX - len) {
    errno = EINVAL;
    return NULL;
  }
  emu_mr *m = calloc(1, sizeof(*m));
  if (!m) {
    errno = ENOMEM;
    return NULL;
  }
  lock(e);
  uint32_t k = e->next_key++;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = len;
  m->iova = iova;
  m->mr.lkey = (k << 8) | 0x5a;
  m->mr.rkey = (k << 8) | 0xa5;
  m->access = access;
  m->next = e->mrs;
  e->mrs = m;
  ((emu_pd *)pd)->refs++;
  unlock(e);
  return &m->mr;
}

static struct ibv_mr *emu_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  return emu_reg_mr_iova(pd, addr, len, (uint64_t)(uintptr_t)addr, access);
}

static int emu_dereg_mr(struct ibv_mr *mr) {
  ecs_verbs_emu *e = emu_of(mr->context);
  emu_mr *m = (emu_mr *)mr;
  lock(e);
  EMU_UNLINK(e->mrs, emu_mr, m);
  ((emu_pd *)mr->pd)->refs--;
  unlock(e);
  free(m);
  return 0;
}

/* ---- CQs --------------------------------------------------------------------- */

static struct ibv_cq *emu_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector) {
  ecs_verbs_emu *e = emu_of(ctx);
  (void)comp_vector;
  if (cqe < 1 || cqe > EMU_MAX_CQE || channel) {
    errno = EINVAL;
    return NULL;
  }
  emu_cq *q = calloc(1, sizeof(*q));
  if (q)
    q->ring = calloc((size_t)cqe, sizeof(*q->ring));
  if (!q || !q->ring) {
    if (q)
      free(q);
    errno = ENOMEM;
    return NULL;
  }
  q->cq.context = ctx;
  q->cq.cq_context = cq_context;
  q->cq.cqe = cqe;
  q->cap = cqe;
  lock(e);
  q->next = e->cqs;
  e->cqs = q;
  ((emu_ctx *)ctx)->refs++;
  unlock(e);
  return &q->cq;
}

static int emu_destroy_cq(struct ibv_cq *cq) {
  ecs_verbs_emu *e = emu_of(cq->context);
  emu_cq *q = (emu_cq *)cq;
  lock(e);
  if (q->refs) {
    unlock(e);
    return EBUSY;
  }
  EMU_UNLINK(e->cqs, emu_cq, q);
  ((emu_ctx *)cq->context)->refs--;
  unlock(e);
  free(q->ring);
  free(q);
  return 0;
}

/* Appends a completion; a full CQ loses it and counts an overrun (on real
 * hardware the CQ would go to error: either way a transport bug). */
static int cq_push(ecs_verbs_emu *e, emu_cq *q, const struct ibv_wc *wc) {
  if (q->count == q->cap) {
    e->cq_overruns++;
    return -1;
  }
  q->ring[(q->head + q->count) % q->cap] = *wc;
  q->count++;
  return 0;
}

/* ---- QPs ---------------------------------------------------------------------- */

static struct ibv_qp *emu_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
  ecs_verbs_emu *e = emu_of(pd->context);
  if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq || attr->srq ||
      attr->cap.max_send_wr < 1 || attr->cap.max_send_wr > EMU_MAX_QP_WR ||
      attr->cap.max_recv_wr > EMU_MAX_QP_WR || attr->cap.max_send_sge > 1 || attr->cap.max_recv_sge > 1 ||
      attr->cap.max_inline_data > 0 || attr->send_cq->context != pd->context) {
    errno = EINVAL;
    return NULL;
  }
  emu_qp *q = calloc(1, sizeof(*q));
  if (q)
    q->sq = calloc(attr->cap.max_send_wr, sizeof(*q->sq));
  if (!q || !q->sq) {
    if (q)
      free(q);
    errno = ENOMEM;
    return NULL;
  }
  q->qp.context = pd->context;
  q->qp.qp_context = attr->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  q->sq_cap = (int)attr->cap.max_send_wr;
  lock(e);
  q->qp.qp_num = e->next_qpn++ & EMU_PSN_MASK;
  q->next = e->qps;
  e->qps = q;
  ((emu_pd *)pd)->refs++;
  ((emu_cq *)attr->send_cq)->refs++;
  if (attr->recv_cq != attr->send_cq)
    ((emu_cq *)attr->recv_cq)->refs++;
  unlock(e);
  return &q->qp;
}

/* Drops queued requests without completions (RESET, destroy). */
static void qp_drop_queued(emu_qp *q) {
  q->sq_used -= q->sq_count;
  q->sq_count = 0;
  q->sq_head = 0;
  q->stalled = 0;
}

static int emu_destroy_qp(struct ibv_qp *qp) {
  ecs_verbs_emu *e = emu_of(qp->context);
  emu_qp *q = (emu_qp *)qp;
  lock(e);
  EMU_UNLINK(e->qps, emu_qp, q);
  ((emu_pd *)qp->pd)->refs--;
  ((emu_cq *)qp->send_cq)->refs--;
  if (qp->recv_cq != qp->send_cq)
    ((emu_cq *)qp->recv_cq)->refs--;
  unlock(e);
  free(q->sq);
  free(q);
  return 0;
}

static int has(int mask, int need) {
  return (mask & need) == need;
}

/* Checks an address vector as a device would when the QP moves to RTR. */
static int check_ah(const emu_ctx *c, const struct ibv_ah_attr *ah) {
  if (ah->port_num != 1)
    return EINVAL;
  if (c->dev->link_layer == IBV_LINK_LAYER_ETHERNET && !ah->is_global)
    return EINVAL; /* RoCE needs a GRH */
  if (ah->is_global) {
    if (ah->grh.sgid_index >= EMU_GID_TBL || gid_zero(&c->dev->gid[ah->grh.sgid_index]) ||
        gid_zero(&ah->grh.dgid))
      return EINVAL;
  } else if (ah->dlid == 0) {
    return EINVAL;
  }
  return 0;
}

static int emu_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
  ecs_verbs_emu *e = emu_of(qp->context);
  emu_qp *q = (emu_qp *)qp;
  emu_ctx *c = (emu_ctx *)qp->context;
  int rc = 0;
  if (!(mask & IBV_QP_STATE))
    return EINVAL;
  lock(e);
  enum ibv_qp_state from = qp->state, to = attr->qp_state;
  switch (to) {
  case IBV_QPS_RESET:
    qp_drop_queued(q);
    q->fail = ECS_EMU_FAIL_NONE;
    break;
  case IBV_QPS_ERR:
    q->stalled = 0; /* held requests now flush when polled */
    break;
  case IBV_QPS_INIT:
    if (from == IBV_QPS_RESET) {
      if (!has(mask, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) || attr->port_num != 1 ||
          attr->pkey_index != 0) {
        rc = EINVAL;
        break;
      }
    } else if (from != IBV_QPS_INIT) {
      rc = EINVAL;
      break;
    }
    if (mask & IBV_QP_PORT)
      q->port = attr->port_num;
    if (mask & IBV_QP_ACCESS_FLAGS)
      q->access = attr->qp_access_flags;
    break;
  case IBV_QPS_RTR:
    if (from != IBV_QPS_INIT ||
        !has(mask, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                       IBV_QP_MIN_RNR_TIMER) ||
        attr->path_mtu < IBV_MTU_256 || attr->path_mtu > c->dev->active_mtu ||
        attr->dest_qp_num > EMU_PSN_MASK || attr->rq_psn > EMU_PSN_MASK ||
        attr->max_dest_rd_atomic > EMU_MAX_RD_ATOM || check_ah(c, &attr->ah_attr)) {
      rc = EINVAL;
      break;
    }
    q->path_mtu = attr->path_mtu;
    q->dest_qpn = attr->dest_qp_num;
    q->rq_psn = attr->rq_psn;
    q->ah = attr->ah_attr;
    q->max_dest_rd_atomic = attr->max_dest_rd_atomic;
    break;
  case IBV_QPS_RTS:
    if (from != IBV_QPS_RTR ||
        !has(mask, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                       IBV_QP_MAX_QP_RD_ATOMIC) ||
        attr->retry_cnt > 7 || attr->rnr_retry > 7 || attr->sq_psn > EMU_PSN_MASK ||
        attr->max_rd_atomic > EMU_MAX_RD_ATOM) {
      rc = EINVAL;
      break;
    }
    q->sq_psn = attr->sq_psn;
    q->max_rd_atomic = attr->max_rd_atomic;
    break;
  default: rc = EINVAL; break;
  }
  if (!rc)
    qp->state = to;
  unlock(e);
  return rc;
}

static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  ecs_verbs_emu *e = emu_of(qp->context);
  emu_qp *q = (emu_qp *)qp;
  int rc = 0;
  lock(e);
  for (; wr; wr = wr->next) {
    if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
      rc = EINVAL;
      break;
    }
    if ((wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE) || wr->num_sge != 1 ||
        !wr->sg_list || (wr->send_flags & IBV_SEND_INLINE)) {
      rc = EINVAL;
      break;
    }
    if (q->sq_used >= q->sq_cap) {
      rc = ENOMEM;
      break;
    }
    /* A CQ smaller than what its QPs can have outstanding would overflow on
     * a device; count it so that tests see the bug. */
    int cq_used = 0;
    for (emu_qp *o = e->qps; o; o = o->next)
      if (o->qp.send_cq == qp->send_cq)
        cq_used += o->sq_used;
    if (cq_used + 1 > ((emu_cq *)qp->send_cq)->cap)
      e->cq_overruns++;
    emu_wr *w = &q->sq[(q->sq_head + q->sq_count) % q->sq_cap];
    w->wr_id = wr->wr_id;
    w->opcode = wr->opcode;
    w->laddr = wr->sg_list[0].addr;
    w->len = wr->sg_list[0].length;
    w->lkey = wr->sg_list[0].lkey;
    w->raddr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    q->sq_count++;
    q->sq_used++;
  }
  if (rc && bad)
    *bad = wr;
  unlock(e);
  return rc;
}

/* Is the responder q reachable at the address requester r was given, and
 * does its own address point back at r (responses travel that way)? */
static int addresses(const emu_qp *from, const emu_qp *to) {
  const emu_dev *d = ((emu_ctx *)to->qp.context)->dev;
  if (from->ah.is_global) {
    for (int i = 0; i < EMU_GID_TBL; i++)
      if (!gid_zero(&d->gid[i]) && !memcmp(&d->gid[i], &from->ah.grh.dgid, sizeof(union ibv_gid)))
        return 1;
    return 0;
  }
  return d->link_layer == IBV_LINK_LAYER_INFINIBAND && from->ah.dlid == d->lid;
}

static void qp_to_err(emu_qp *q) {
  q->qp.state = IBV_QPS_ERR;
  q->stalled = 0;
}

/* Runs one queued request of q as the wire and the responder would; fills
 * wc.  Returns 0 when a completion was produced, -1 when the request is held
 * back (stall). */
static int execute(ecs_verbs_emu *e, emu_qp *q, const emu_wr *w, struct ibv_wc *wc) {
  memset(wc, 0, sizeof(*wc));
  wc->wr_id = w->wr_id;
  wc->qp_num = q->qp.qp_num;
  wc->opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
  if (q->qp.state == IBV_QPS_ERR) {
    wc->status = IBV_WC_WR_FLUSH_ERR;
    return 0;
  }
  if (q->fail != ECS_EMU_FAIL_NONE && q->ops >= (long)q->fail_after) {
    ecs_emu_fail f = q->fail;
    q->fail = ECS_EMU_FAIL_NONE;
    if (f == ECS_EMU_FAIL_STALL) {
      q->stalled = 1;
      return -1;
    }
    q->ops++;
    qp_to_err(q);
    wc->status = f == ECS_EMU_FAIL_RETRY_EXC ? IBV_WC_RETRY_EXC_ERR : IBV_WC_WR_FLUSH_ERR;
    return 0;
  }
  q->ops++;

  /* Requester side: the local SGE. */
  emu_mr *lm = find_mr(e, q->qp.pd, w->lkey, 0);
  if (!lm || !in_mr(lm, w->laddr, w->len) ||
      (w->opcode == IBV_WR_RDMA_READ && !(lm->access & IBV_ACCESS_LOCAL_WRITE))) {
    wc->status = IBV_WC_LOC_PROT_ERR;
    qp_to_err(q);
    return 0;
  }
  /* The wire: a peer that is there, ready, connected back to us. */
  emu_qp *p = find_qp(e, q->dest_qpn);
  if (!p || (p->qp.state != IBV_QPS_RTR && p->qp.state != IBV_QPS_RTS) || p->dest_qpn != q->qp.qp_num ||
      !addresses(q, p) || !addresses(p, q)) {
    wc->status = IBV_WC_RETRY_EXC_ERR;
    qp_to_err(q);
    return 0;
  }
  enum ibv_mtu mtu = q->path_mtu < p->path_mtu ? q->path_mtu : p->path_mtu;
  uint32_t npk = w->len ? (w->len + mtu_bytes(mtu) - 1) / mtu_bytes(mtu) : 1;
  if (q->sq_psn != p->rq_psn) {
    wc->status = IBV_WC_RETRY_EXC_ERR; /* the responder drops what it sees as duplicates */
    qp_to_err(q);
    return 0;
  }
  q->sq_psn = (q->sq_psn + npk) & EMU_PSN_MASK;
  p->rq_psn = (p->rq_psn + npk) & EMU_PSN_MASK;
  if (w->opcode == IBV_WR_RDMA_READ && q->max_rd_atomic > p->max_dest_rd_atomic) {
    wc->status = IBV_WC_REM_INV_REQ_ERR; /* more reads in flight than the responder took */
    qp_to_err(q);
    qp_to_err(p);
    return 0;
  }
  /* Responder side: rkey, bounds and access on the MR and on the QP. */
  int need = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  emu_mr *rm = find_mr(e, p->qp.pd, w->rkey, 1);
  if (!rm || !in_mr(rm, w->raddr, w->len) || !(rm->access & need) || !(p->access & need)) {
    wc->status = IBV_WC_REM_ACCESS_ERR;
    qp_to_err(q);
    qp_to_err(p);
    return 0;
  }
  void *lp = mr_ptr(lm, w->laddr), *rp = mr_ptr(rm, w->raddr);
  if (w->len)
    memmove(w->opcode == IBV_WR_RDMA_READ ? lp : rp, w->opcode == IBV_WR_RDMA_READ ? rp : lp, w->len);
  wc->status = IBV_WC_SUCCESS;
  wc->byte_len = w->len;
  return 0;
}

static int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  ecs_verbs_emu *e = emu_of(cq->context);
  emu_cq *c = (emu_cq *)cq;
  if (n < 0)
    return -EINVAL;
  lock(e);
  /* Run what the QPs on this CQ have queued, while there is room. */
  for (emu_qp *q = e->qps; q; q = q->next) {
    if (q->qp.send_cq != cq)
      continue;
    while (q->sq_count && !q->stalled && c->count < c->cap) {
      struct ibv_wc out;
      if (execute(e, q, &q->sq[q->sq_head], &out) < 0)
        break;
      q->sq_head = (q->sq_head + 1) % q->sq_cap;
      q->sq_count--;
      cq_push(e, c, &out);
    }
  }
  int got = 0;
  while (got < n && c->count) {
    wc[got] = c->ring[c->head];
    c->head = (c->head + 1) % c->cap;
    c->count--;
    emu_qp *q = find_qp(e, wc[got].qp_num);
    if (q && q->sq_used > 0)
      q->sq_used--;
    got++;
  }
  unlock(e);
  return got;
}

/* ---- The emulation ------------------------------------------------------------- */

int ecs_verbs_emu_create(int ndevices, ecs_verbs_emu **out) {
  if (!out || ndevices < 0 || ndevices > 64)
    return ECS_EINVAL;
  *out = NULL;
  ecs_verbs_emu *e = calloc(1, sizeof(*e));
  if (!e)
    return ECS_ENOMEM;
  emu_devblock *b = calloc(1, sizeof(*b) + (size_t)ndevices * sizeof(emu_dev));
  if (!b) {
    free(e);
    return ECS_ENOMEM;
  }
  b->self = e;
  pthread_mutex_init(&e->mu, NULL);
  e->ndev = ndevices;
  e->devs = b->devs;
  e->next_key = 0x100;
  e->next_qpn = 0x11;
  for (int i = 0; i < ndevices; i++) {
    emu_dev *d = &e->devs[i];
    d->index = i;
    snprintf(d->dev.name, sizeof(d->dev.name), "emu%d", i);
    snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    d->gid[0].raw[0] = 0xfe;
    d->gid[0].raw[1] = 0x80;
    d->gid[0].raw[15] = (uint8_t)(i + 1);
    if (i % 2 == 0) {
      d->link_layer = IBV_LINK_LAYER_ETHERNET;
      d->active_mtu = IBV_MTU_4096;
      d->gid[1].raw[10] = 0xff;
      d->gid[1].raw[11] = 0xff;
      d->gid[1].raw[12] = 10;
      d->gid[1].raw[15] = (uint8_t)(i + 1);
    } else {
      d->link_layer = IBV_LINK_LAYER_INFINIBAND;
      d->active_mtu = IBV_MTU_2048;
      d->lid = (uint16_t)(0x10 + i);
    }
  }
  e->ops = (ecs_verbs_ops){
      .name = "emu",
      .priv = e,
      .get_device_list = emu_get_device_list,
      .free_device_list = emu_free_device_list,
      .get_device_name = emu_get_device_name,
      .open_device = emu_open_device,
      .close_device = emu_close_device,
      .query_device = emu_query_device,
      .query_port = emu_query_port,
      .query_gid = emu_query_gid,
      .alloc_pd = emu_alloc_pd,
      .dealloc_pd = emu_dealloc_pd,
      .reg_mr = emu_reg_mr,
      .reg_mr_iova = emu_reg_mr_iova,
      .dereg_mr = emu_dereg_mr,
      .create_cq = emu_create_cq,
      .destroy_cq = emu_destroy_cq,
      .create_qp = emu_create_qp,
      .destroy_qp = emu_destroy_qp,
      .modify_qp = emu_modify_qp,
      .post_send = emu_post_send,
      .poll_cq = emu_poll_cq,
  };
  *out = e;
  return ECS_OK;
}

void ecs_verbs_emu_destroy(ecs_verbs_emu *e) {
  if (!e)
    return;
  while (e->qps) {
    emu_qp *q = e->qps;
    e->qps = q->next;
    free(q->sq);
    free(q);
  }
  while (e->mrs) {
    emu_mr *m = e->mrs;
    e->mrs = m->next;
    free(m);
  }
  while (e->cqs) {
    emu_cq *q = e->cqs;
    e->cqs = q->next;
    free(q->ring);
    free(q);
  }
  while (e->pds) {
    emu_pd *p = e->pds;
    e->pds = p->next;
    free(p);
  }
  while (e->ctxs) {
    emu_ctx *c = e->ctxs;
    e->ctxs = c->next;
    free(c);
  }
  pthread_mutex_destroy(&e->mu);
  free((char *)e->devs - offsetof(emu_devblock, devs));
  free(e);
}

const ecs_verbs_ops *ecs_verbs_emu_ops(ecs_verbs_emu *e) {
  return &e->ops;
}

int ecs_verbs_emu_inject(ecs_verbs_emu *e, uint32_t qpn, ecs_emu_fail fail, unsigned after_n_ops) {
  lock(e);
  emu_qp *q = find_qp(e, qpn);
  if (q) {
    q->fail = fail;
    q->fail_after = (unsigned)q->ops + after_n_ops;
  }
  unlock(e);
  return q ? ECS_OK : ECS_EINVAL;
}

long ecs_verbs_emu_qp_ops(ecs_verbs_emu *e, uint32_t qpn) {
  lock(e);
  emu_qp *q = find_qp(e, qpn);
  long n = q ? q->ops : -1;
  unlock(e);
  return n;
}

int ecs_verbs_emu_qp_state(ecs_verbs_emu *e, uint32_t qpn) {
  lock(e);
  emu_qp *q = find_qp(e, qpn);
  int s = q ? (int)q->qp.state : -1;
  unlock(e);
  return s;
}

void ecs_verbs_emu_get_counts(ecs_verbs_emu *e, ecs_verbs_emu_counts *out) {
  memset(out, 0, sizeof(*out));
  lock(e);
  out->device_lists = e->device_lists;
  for (emu_ctx *c = e->ctxs; c; c = c->next)
    out->contexts++;
  for (emu_pd *p = e->pds; p; p = p->next)
    out->pds++;
  for (emu_mr *m = e->mrs; m; m = m->next)
    out->mrs++;
  for (emu_cq *q = e->cqs; q; q = q->next)
    out->cqs++;
  for (emu_qp *q = e->qps; q; q = q->next)
    out->qps++;
  out->cq_overruns = e->cq_overruns;
  unlock(e);
}

#else
typedef int ecs_verbs_emu_unused;
#endif /* ECS_HAVE_RDMA */
