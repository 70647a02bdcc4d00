/*
 * RDMA transport (see rdma.h and docs/rdma.md).
 *
 * Layout: the blob codec first (pure, every build), then the context, MRs,
 * endpoints and the batch engine over the verbs operations table (RDMA
 * builds only), then the stubs of a build without libibverbs.
 */
#include "store/rdma/rdma.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Connection blob (every build) ---------------------------------------- */

/* Link layers as verbs numbers them (IBV_LINK_LAYER_*), repeated here so the
 * codec builds without verbs.h. */
#define BLOB_LL_INFINIBAND 1
#define BLOB_LL_ETHERNET 2
#define PSN_MASK 0xffffffu

_Static_assert(ECS_RDMA_BLOB_SIZE == 80, "the blob is a wire format: its size never changes");

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

/* The checks both directions share: what a well-formed blob holds. */
static int blob_fields_ok(const ecs_rdma_blob *b) {
  if (b->qpn == 0 || b->qpn > PSN_MASK || b->psn > PSN_MASK)
    return 0;
  if (b->mtu < 1 || b->mtu > 5 || b->rd_atom == 0)
    return 0;
  if (b->link_layer != BLOB_LL_INFINIBAND && b->link_layer != BLOB_LL_ETHERNET)
    return 0;
  if (b->has_region && (b->region_len == 0 || b->region_addr > UINT64_MAX - b->region_len))
    return 0;
  return 1;
}

int ecs_rdma_blob_encode(const ecs_rdma_blob *b, uint8_t out[ECS_RDMA_BLOB_SIZE]) {
  if (!b || !out || !blob_fields_ok(b))
    return ECS_EINVAL;
  memset(out, 0, ECS_RDMA_BLOB_SIZE);
  put32(out + 0, ECS_RDMA_BLOB_MAGIC);
  put16(out + 4, ECS_RDMA_BLOB_VERSION);
  put16(out + 6, b->has_region ? ECS_RDMA_BLOB_F_REGION : 0);
  put32(out + 8, b->qpn);
  put32(out + 12, b->psn);
  put16(out + 16, b->lid);
  out[18] = b->mtu;
  out[19] = b->rd_atom;
  out[20] = b->link_layer;
  out[21] = b->port;
  memcpy(out + 24, b->gid, 16);
  if (b->has_region) {
    put64(out + 40, b->region_addr);
    put64(out + 48, b->region_len);
    put32(out + 56, b->region_rkey);
  }
  return ECS_OK;
}

int ecs_rdma_blob_decode(const void *buf, size_t len, ecs_rdma_blob *out) {
  const uint8_t *p = buf;
  if (!buf || !out)
    return ECS_EINVAL;
  memset(out, 0, sizeof(*out));
  if (len != ECS_RDMA_BLOB_SIZE || get32(p) != ECS_RDMA_BLOB_MAGIC || get16(p + 4) != ECS_RDMA_BLOB_VERSION)
    return ECS_EPROTO;
  ecs_rdma_blob b = {0};
  b.qpn = get32(p + 8);
  b.psn = get32(p + 12);
  b.lid = get16(p + 16);
  b.mtu = p[18];
  b.rd_atom = p[19];
  b.link_layer = p[20];
  b.port = p[21];
  memcpy(b.gid, p + 24, 16);
  if (get16(p + 6) & ECS_RDMA_BLOB_F_REGION) {
    b.has_region = 1;
    b.region_addr = get64(p + 40);
    b.region_len = get64(p + 48);
    b.region_rkey = get32(p + 56);
  }
  if (!blob_fields_ok(&b))
    return ECS_EPROTO;
  *out = b;
  return ECS_OK;
}

#ifdef ECS_HAVE_RDMA

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/random.h>
#include <time.h>

#include "ecstore/error.h"
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

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int set_err(char *buf, size_t len, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int set_err(char *buf, size_t len, int rc, const char *fmt, ...) {
  if (buf && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
  }
  return rc;
}

#define EP_ERR(ep, rc, ...) set_err((ep)->errmsg, sizeof((ep)->errmsg), (rc), __VA_ARGS__)

static uint32_t random_psn(void) {
  uint32_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
    v = (uint32_t)now_ms() * 2654435761u ^ (uint32_t)(uintptr_t)&v;
  return v & PSN_MASK;
}

/* ---- Context ----------------------------------------------------------------- */

static int clampi(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* Finds and opens the device; ECS_ENODEV with the message the client logs
 * before falling back to TCP. */
static int open_device(ecs_rdma_ctx *c, const char *want, char *errbuf, size_t errlen) {
  int n = 0;
  struct ibv_device **list = c->ops->get_device_list(c->ops->priv, &n);
  if (!list || n <= 0) {
    if (list)
      c->ops->free_device_list(c->ops->priv, list);
    return set_err(errbuf, errlen, ECS_ENODEV, "rdma: no RDMA device found");
  }
  struct ibv_device *dev = NULL;
  char names[128] = "";
  for (int i = 0; i < n && !dev; i++) {
    const char *name = c->ops->get_device_name(list[i]);
    if (!want || !*want || (name && !strcmp(name, want)))
      dev = list[i];
    else if (name && strlen(names) + strlen(name) + 3 < sizeof(names))
      snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", *names ? ", " : "", name);
  }
  if (!dev) {
    c->ops->free_device_list(c->ops->priv, list);
    return set_err(errbuf, errlen, ECS_ENODEV, "rdma: device '%s' not found (have: %s)", want, names);
  }
  snprintf(c->device, sizeof(c->device), "%s", c->ops->get_device_name(dev));
  c->vctx = c->ops->open_device(dev);
  int e = errno;
  c->ops->free_device_list(c->ops->priv, list);
  if (!c->vctx)
    return set_err(errbuf, errlen, e == ENOMEM ? ECS_ENOMEM : ECS_EIO, "rdma: cannot open %s: %s", c->device,
                   strerror(e));
  return ECS_OK;
}

/* Reads the port, GID and device limits the endpoints need. */
static int query_port(ecs_rdma_ctx *c, char *errbuf, size_t errlen) {
  struct ibv_device_attr da;
  struct ibv_port_attr pa;
  int e = c->ops->query_device(c->vctx, &da);
  if (e)
    return set_err(errbuf, errlen, ECS_EIO, "rdma: %s: query_device: %s", c->device, strerror(e));
  if (c->port < 1 || c->port > da.phys_port_cnt)
    return set_err(errbuf, errlen, ECS_EINVAL, "rdma: %s has no port %u", c->device, c->port);
  e = c->ops->query_port(c->vctx, c->port, &pa);
  if (e)
    return set_err(errbuf, errlen, ECS_EIO, "rdma: %s: query_port %u: %s", c->device, c->port, strerror(e));
  if (pa.state != IBV_PORT_ACTIVE)
    return set_err(errbuf, errlen, ECS_ENODEV, "rdma: %s port %u is not active", c->device, c->port);
  if (c->gid_index < 0 || c->gid_index >= pa.gid_tbl_len)
    return set_err(errbuf, errlen, ECS_EINVAL, "rdma: %s port %u: GID index %d out of range (table has %d)",
                   c->device, c->port, c->gid_index, pa.gid_tbl_len);
  e = c->ops->query_gid(c->vctx, c->port, c->gid_index, &c->gid);
  if (e)
    return set_err(errbuf, errlen, ECS_EIO, "rdma: %s: query_gid: %s", c->device, strerror(e));
  static const union ibv_gid zero;
  if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && !memcmp(&c->gid, &zero, sizeof(zero)))
    return set_err(errbuf, errlen, ECS_EINVAL, "rdma: %s port %u: GID index %d is empty (RoCE needs one)",
                   c->device, c->port, c->gid_index);
  c->lid = pa.lid;
  c->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? BLOB_LL_ETHERNET : BLOB_LL_INFINIBAND;
  c->mtu = pa.active_mtu;
  if (pa.max_msg_sz && c->slice > pa.max_msg_sz)
    c->slice = pa.max_msg_sz;
  c->max_out = clampi(c->max_out, 1, clampi(da.max_qp_wr, 1, ECS_RDMA_MAX_OUTSTANDING));
  c->max_out = clampi(c->max_out, 1, clampi(da.max_cqe, 1, ECS_RDMA_MAX_OUTSTANDING));
  int rd = da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom : da.max_qp_init_rd_atom;
  c->rd_atom = clampi(rd, 1, 16);
  return ECS_OK;
}

int ecs_rdma_ctx_open(const ecs_rdma_opts *opts, const struct ecs_verbs_ops *ops, ecs_rdma_ctx **out,
                      char *errbuf, size_t errlen) {
  static const ecs_rdma_opts defaults;
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!opts)
    opts = &defaults;
  if (opts->port < 0 || opts->port > 255 || opts->gid_index < 0 || opts->max_outstanding < 0 ||
      opts->max_outstanding > ECS_RDMA_MAX_OUTSTANDING || opts->timeout_ms < 0 ||
      opts->slice_size > ECS_RDMA_MAX_SLICE)
    return set_err(errbuf, errlen, ECS_EINVAL, "rdma: invalid options");
  ecs_rdma_ctx *c = calloc(1, sizeof(*c));
  if (!c)
    return set_err(errbuf, errlen, ECS_ENOMEM, "rdma: out of memory");
  c->ops = ops ? ops : ecs_verbs_real_ops();
  c->port = (uint8_t)(opts->port ? opts->port : ECS_RDMA_DEFAULT_PORT);
  c->gid_index = opts->gid_index;
  c->slice = (uint32_t)(opts->slice_size ? opts->slice_size : ECS_RDMA_DEFAULT_SLICE);
  c->max_out = opts->max_outstanding ? opts->max_outstanding : ECS_RDMA_DEFAULT_OUTSTANDING;
  c->timeout_ms = opts->timeout_ms ? opts->timeout_ms : ECS_RDMA_DEFAULT_TIMEOUT_MS;

  int rc = open_device(c, opts->device, errbuf, errlen);
  if (rc)
    goto out_free;
  rc = query_port(c, errbuf, errlen);
  if (rc)
    goto out_close;
  c->pd = c->ops->alloc_pd(c->vctx);
  if (!c->pd) {
    rc = set_err(errbuf, errlen, ECS_EIO, "rdma: %s: alloc_pd: %s", c->device, strerror(errno));
    goto out_close;
  }
  *out = c;
  return ECS_OK;

out_close:
  c->ops->close_device(c->vctx);
out_free:
  free(c);
  return rc;
}

void ecs_rdma_ctx_close(ecs_rdma_ctx *c) {
  if (!c)
    return;
  c->ops->dealloc_pd(c->pd);
  c->ops->close_device(c->vctx);
  free(c);
}

const char *ecs_rdma_ctx_device(const ecs_rdma_ctx *c) {
  return c->device;
}

/* ---- Memory registration ------------------------------------------------------- */

int ecs_rdma_reg(ecs_rdma_ctx *c, void *ptr, size_t len, int access, ecs_rdma_mr **out) {
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!c || !ptr || !len || (access & ~(ECS_RDMA_REMOTE_READ | ECS_RDMA_REMOTE_WRITE)))
    return ECS_EINVAL;
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (access & ECS_RDMA_REMOTE_READ)
    flags |= IBV_ACCESS_REMOTE_READ;
  if (access & ECS_RDMA_REMOTE_WRITE)
    flags |= IBV_ACCESS_REMOTE_WRITE;
  ecs_rdma_mr *m = calloc(1, sizeof(*m));
  if (!m)
    return ECS_ENOMEM;
  m->ctx = c;
  m->mr = c->ops->reg_mr(c->pd, ptr, len, flags);
  if (!m->mr) {
    int e = errno;
    free(m);
    return e == ENOMEM ? ECS_ENOMEM : e == EINVAL ? ECS_EINVAL : ECS_EIO;
  }
  *out = m;
  return ECS_OK;
}

void ecs_rdma_dereg(ecs_rdma_mr *m) {
  if (!m)
    return;
  m->ctx->ops->dereg_mr(m->mr);
  free(m);
}

uint64_t ecs_rdma_mr_addr(const ecs_rdma_mr *m) {
  return m->window ? 0 : (uint64_t)(uintptr_t)m->mr->addr;
}

uint64_t ecs_rdma_mr_len(const ecs_rdma_mr *m) {
  return m->mr->length;
}

uint32_t ecs_rdma_mr_rkey(const ecs_rdma_mr *m) {
  return m->mr->rkey;
}

/* ---- Endpoints: QP life cycle ----------------------------------------------------- */

/* Destroys the QP and its CQ.  Destroying the QP is what guarantees that the
 * device touches none of the work requests' buffers any more. */
static void ep_teardown(ecs_rdma_ep *ep) {
  const ecs_verbs_ops *o = ep->ctx->ops;
  if (ep->qp)
    o->destroy_qp(ep->qp);
  if (ep->cq)
    o->destroy_cq(ep->cq);
  ep->qp = NULL;
  ep->cq = NULL;
  ep->connected = 0;
  memset(&ep->peer, 0, sizeof(ep->peer));
}

/* Builds a CQ and an RC QP in INIT with a fresh PSN. */
static int ep_build(ecs_rdma_ep *ep) {
  ecs_rdma_ctx *c = ep->ctx;
  const ecs_verbs_ops *o = c->ops;
  ep_teardown(ep);
  ep->cq = o->create_cq(c->vctx, c->max_out, ep, NULL, 0);
  if (!ep->cq)
    return EP_ERR(ep, ECS_EIO, "rdma: create_cq: %s", strerror(errno));
  struct ibv_qp_init_attr ia = {
      .qp_context = ep,
      .send_cq = ep->cq,
      .recv_cq = ep->cq,
      .cap = {.max_send_wr = (uint32_t)c->max_out, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC,
      .sq_sig_all = 0,
  };
  ep->qp = o->create_qp(ep->own_pd ? ep->own_pd : c->pd, &ia);
  if (!ep->qp) {
    int rc = EP_ERR(ep, ECS_EIO, "rdma: create_qp: %s", strerror(errno));
    ep_teardown(ep);
    return rc;
  }
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT,
      .pkey_index = 0,
      .port_num = c->port,
      .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
  };
  int e = o->modify_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (e) {
    int rc = EP_ERR(ep, ECS_EIO, "rdma: qp to INIT: %s", strerror(e));
    ep_teardown(ep);
    return rc;
  }
  ep->psn = random_psn();
  return ECS_OK;
}

/* After an error or a timeout: stop the QP, collect what it still reports
 * for a short while, destroy it and build a fresh one. */
static void ep_rebuild(ecs_rdma_ep *ep) {
  ep->st.rebuilds++;
  (void)ep_build(ep); /* on failure qp stays NULL; the next call retries */
}

static int ep_create(ecs_rdma_ctx *c, const ecs_rdma_mr *advertise, int isolated, ecs_rdma_ep **out) {
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!c || (advertise && advertise->ctx != c))
    return ECS_EINVAL;
  ecs_rdma_ep *ep = calloc(1, sizeof(*ep));
  if (!ep)
    return ECS_ENOMEM;
  ep->ctx = c;
  ep->advert = advertise;
  ep->wrs = calloc((size_t)c->max_out, sizeof(*ep->wrs));
  ep->sges = calloc((size_t)c->max_out, sizeof(*ep->sges));
  int rc = ECS_ENOMEM;
  if (!ep->wrs || !ep->sges)
    goto out_free;
  if (isolated) {
    ep->own_pd = c->ops->alloc_pd(c->vctx);
    if (!ep->own_pd) {
      rc = errno == ENOMEM ? ECS_ENOMEM : ECS_EIO;
      goto out_free;
    }
  }
  rc = ep_build(ep);
  if (rc)
    goto out_pd;
  *out = ep;
  return ECS_OK;

out_pd:
  if (ep->own_pd)
    c->ops->dealloc_pd(ep->own_pd);
out_free:
  free(ep->wrs);
  free(ep->sges);
  free(ep);
  return rc;
}

int ecs_rdma_ep_create(ecs_rdma_ctx *c, const ecs_rdma_mr *advertise, ecs_rdma_ep **out) {
  return ep_create(c, advertise, 0, out);
}

int ecs_rdma_ep_create_isolated(ecs_rdma_ctx *c, ecs_rdma_ep **out) {
  return ep_create(c, NULL, 1, out);
}

int ecs_rdma_ep_window(ecs_rdma_ep *ep, void *ptr, size_t len, int access, ecs_rdma_mr **out) {
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!ep || !ep->own_pd || !ptr || !len || !access ||
      (access & ~(ECS_RDMA_REMOTE_READ | ECS_RDMA_REMOTE_WRITE)))
    return ECS_EINVAL;
  /* Only the access asked for: a lease's window cannot be written, a
   * reservation's is written (verbs wants local write with remote write). */
  int flags = 0;
  if (access & ECS_RDMA_REMOTE_READ)
    flags |= IBV_ACCESS_REMOTE_READ;
  if (access & ECS_RDMA_REMOTE_WRITE)
    flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  ecs_rdma_mr *m = calloc(1, sizeof(*m));
  if (!m)
    return ECS_ENOMEM;
  m->ctx = ep->ctx;
  m->window = 1;
  m->mr = ep->ctx->ops->reg_mr_iova(ep->own_pd, ptr, len, 0, flags);
  if (!m->mr) {
    int e = errno;
    free(m);
    return e == ENOMEM ? ECS_ENOMEM : e == EINVAL ? ECS_EINVAL : ECS_EIO;
  }
  *out = m;
  return ECS_OK;
}

void ecs_rdma_ep_destroy(ecs_rdma_ep *ep) {
  if (!ep)
    return;
  ep_teardown(ep);
  if (ep->own_pd)
    ep->ctx->ops->dealloc_pd(ep->own_pd); /* EBUSY (a leak) if a window is still open */
  free(ep->trk);
  free(ep->wrs);
  free(ep->sges);
  free(ep);
}

int ecs_rdma_ep_local_blob(ecs_rdma_ep *ep, uint8_t out[ECS_RDMA_BLOB_SIZE]) {
  if (!ep || !out)
    return ECS_EINVAL;
  if (!ep->qp) {
    int rc = ep_build(ep);
    if (rc)
      return rc;
  }
  ecs_rdma_ctx *c = ep->ctx;
  ecs_rdma_blob b = {
      .qpn = ep->qp->qp_num,
      .psn = ep->psn,
      .lid = c->lid,
      .mtu = (uint8_t)c->mtu,
      .rd_atom = (uint8_t)c->rd_atom,
      .link_layer = c->link_layer,
      .port = c->port,
  };
  memcpy(b.gid, c->gid.raw, 16);
  if (ep->advert) {
    b.has_region = 1;
    b.region_addr = ecs_rdma_mr_addr(ep->advert);
    b.region_len = ecs_rdma_mr_len(ep->advert);
    b.region_rkey = ecs_rdma_mr_rkey(ep->advert);
  }
  return ecs_rdma_blob_encode(&b, out);
}

/* INIT -> RTR -> RTS towards the peer p. */
static int ep_rtr_rts(ecs_rdma_ep *ep, const ecs_rdma_blob *p) {
  ecs_rdma_ctx *c = ep->ctx;
  const ecs_verbs_ops *o = c->ops;
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_RTR,
      .path_mtu = p->mtu < (uint8_t)c->mtu ? (enum ibv_mtu)p->mtu : c->mtu,
      .dest_qp_num = p->qpn,
      .rq_psn = p->psn,
      .max_dest_rd_atomic = (uint8_t)c->rd_atom,
      .min_rnr_timer = 12,
      .ah_attr = {.port_num = c->port, .sl = 0, .src_path_bits = 0},
  };
  /* RoCE always routes by GID; InfiniBand by LID unless the peer has none. */
  if (c->link_layer == BLOB_LL_ETHERNET || p->lid == 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, p->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)c->gid_index;
    a.ah_attr.grh.hop_limit = 64;
  } else {
    a.ah_attr.dlid = p->lid;
  }
  int e = o->modify_qp(ep->qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (e)
    return EP_ERR(ep, ECS_EIO, "rdma: qp 0x%x to RTR: %s", ep->qp->qp_num, strerror(e));
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14; /* 4.096 us * 2^14 = 67 ms per try */
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = ep->psn;
  a.max_rd_atomic = (uint8_t)(p->rd_atom < c->rd_atom ? p->rd_atom : c->rd_atom);
  e = o->modify_qp(ep->qp, &a,
                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                       IBV_QP_MAX_QP_RD_ATOMIC);
  if (e)
    return EP_ERR(ep, ECS_EIO, "rdma: qp 0x%x to RTS: %s", ep->qp->qp_num, strerror(e));
  return ECS_OK;
}

int ecs_rdma_ep_connect(ecs_rdma_ep *ep, const void *blob, size_t len) {
  if (!ep || !blob)
    return ECS_EINVAL;
  if (ep->connected)
    return EP_ERR(ep, ECS_EBUSY, "rdma: endpoint already connected; reset it first");
  ecs_rdma_blob p;
  int rc = ecs_rdma_blob_decode(blob, len, &p);
  if (rc)
    return EP_ERR(ep, rc, "rdma: bad connection blob from the peer (%zu bytes)", len);
  static const uint8_t zero[16];
  if (p.link_layer != ep->ctx->link_layer)
    return EP_ERR(ep, ECS_EPROTO, "rdma: peer link layer %u differs from this port's (%u)", p.link_layer,
                  ep->ctx->link_layer);
  if ((p.link_layer == BLOB_LL_ETHERNET || p.lid == 0) && !memcmp(p.gid, zero, 16))
    return EP_ERR(ep, ECS_EPROTO, "rdma: peer blob has no address (LID 0 and an empty GID)");
  if (!ep->qp && (rc = ep_build(ep)) != 0)
    return rc;
  rc = ep_rtr_rts(ep, &p);
  if (rc) {
    ep_rebuild(ep);
    return rc;
  }
  ep->peer = p;
  ep->connected = 1;
  return ECS_OK;
}

int ecs_rdma_ep_reset(ecs_rdma_ep *ep) {
  if (!ep)
    return ECS_EINVAL;
  return ep_build(ep);
}

int ecs_rdma_ep_connected(const ecs_rdma_ep *ep) {
  return ep && ep->connected;
}

int ecs_rdma_ep_peer_region(const ecs_rdma_ep *ep, uint64_t *addr, uint64_t *len, uint32_t *rkey) {
  if (!ep)
    return ECS_EINVAL;
  if (!ep->connected)
    return ECS_ENOTCONN;
  if (!ep->peer.has_region)
    return ECS_ENOTFOUND;
  if (addr)
    *addr = ep->peer.region_addr;
  if (len)
    *len = ep->peer.region_len;
  if (rkey)
    *rkey = ep->peer.region_rkey;
  return ECS_OK;
}

uint32_t ecs_rdma_ep_qpn(const ecs_rdma_ep *ep) {
  return ep && ep->qp ? ep->qp->qp_num : 0;
}

const char *ecs_rdma_ep_errmsg(const ecs_rdma_ep *ep) {
  return ep ? ep->errmsg : "";
}

void ecs_rdma_ep_set_exchange(ecs_rdma_ep *ep, ecs_rdma_exchange_fn fn, void *arg) {
  if (!ep)
    return;
  ep->xchg = fn;
  ep->xchg_arg = arg;
}

void ecs_rdma_ep_get_stats(const ecs_rdma_ep *ep, ecs_rdma_ep_stats *out) {
  *out = ep->st;
}

/* Reconnects through the exchange callback within the deadline. */
static int ep_reconnect(ecs_rdma_ep *ep, uint64_t deadline) {
  if (!ep->xchg)
    return EP_ERR(ep, ECS_ENOTCONN, "rdma: endpoint needs a blob exchange (no exchange callback)");
  uint64_t now = now_ms();
  if (now >= deadline)
    return EP_ERR(ep, ECS_ETIMEDOUT, "rdma: no time left to reconnect");
  uint8_t local[ECS_RDMA_BLOB_SIZE], peer[ECS_RDMA_BLOB_SIZE];
  int rc = ecs_rdma_ep_local_blob(ep, local);
  if (rc)
    return rc;
  uint64_t left = deadline - now;
  rc = ep->xchg(ep->xchg_arg, local, peer, left > INT32_MAX ? INT32_MAX : (int)left);
  if (rc)
    return EP_ERR(ep, rc, "rdma: blob exchange failed: %s", ecs_strerror(rc));
  rc = ecs_rdma_ep_connect(ep, peer, sizeof(peer));
  if (!rc)
    ep->st.reconnects++;
  return rc;
}

/* ---- Batches ------------------------------------------------------------------------ */

static const char *wc_name(enum ibv_wc_status s) {
  switch (s) {
  case IBV_WC_SUCCESS: return "success";
  case IBV_WC_LOC_LEN_ERR: return "local length error";
  case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
  case IBV_WC_LOC_PROT_ERR: return "local protection error";
  case IBV_WC_WR_FLUSH_ERR: return "work request flushed";
  case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request";
  case IBV_WC_REM_ACCESS_ERR: return "remote access error";
  case IBV_WC_REM_OP_ERR: return "remote operation error";
  case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
  case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
  default: return "error completion";
  }
}

/* The per-item code for an error completion (docs/rdma.md, error mapping). */
static int wc_to_err(enum ibv_wc_status s) {
  switch (s) {
  case IBV_WC_SUCCESS: return ECS_OK;
  case IBV_WC_RETRY_EXC_ERR:
  case IBV_WC_RNR_RETRY_EXC_ERR: return ECS_ETIMEDOUT;
  case IBV_WC_WR_FLUSH_ERR: return ECS_ECANCELED;
  default: return ECS_EIO;
  }
}

/* Checks an item before anything is posted, so that a caller's mistake
 * fails that item alone instead of breaking the QP under its neighbours. */
static int item_check(const ecs_rdma_ep *ep, const ecs_rdma_item *it) {
  if (!it->local || it->local->ctx != ep->ctx || it->local->window)
    return ECS_EINVAL;
  uint64_t mlen = ecs_rdma_mr_len(it->local);
  if (it->local_off > mlen || it->len > mlen - it->local_off)
    return ECS_EINVAL;
  if (it->remote_addr > UINT64_MAX - it->len)
    return ECS_EINVAL;
  const ecs_rdma_blob *p = &ep->peer;
  if (p->has_region && it->rkey == p->region_rkey &&
      (it->remote_addr < p->region_addr || it->len > p->region_len ||
       it->remote_addr - p->region_addr > p->region_len - it->len))
    return ECS_EINVAL;
  return ECS_OK;
}

typedef struct batch {
  ecs_rdma_ep *ep;
  const ecs_rdma_item *items;
  int *status;
  size_t n;
  enum ibv_wr_opcode op;
  uint64_t deadline;
  size_t cursor;   /* first item that may still have slices to post */
  int outstanding; /* work requests posted, not yet completed */
  int broken;      /* the QP failed: post nothing more */
} batch;

/* Posts as many slices as the outstanding limit allows, as one chain. */
static void post_some(batch *b) {
  ecs_rdma_ep *ep = b->ep;
  ecs_rdma_ctx *c = ep->ctx;
  int k = 0;
  while (b->outstanding + k < c->max_out && b->cursor < b->n) {
    item_track *t = &ep->trk[b->cursor];
    const ecs_rdma_item *it = &b->items[b->cursor];
    if (t->state != IT_ACTIVE || t->next_off == it->len) {
      b->cursor++;
      continue;
    }
    uint64_t chunk = it->len - t->next_off < c->slice ? it->len - t->next_off : c->slice;
    struct ibv_sge *sg = &ep->sges[k];
    struct ibv_send_wr *wr = &ep->wrs[k];
    sg->addr = ecs_rdma_mr_addr(it->local) + it->local_off + t->next_off;
    sg->length = (uint32_t)chunk;
    sg->lkey = it->local->mr->lkey;
    memset(wr, 0, sizeof(*wr));
    wr->wr_id = b->cursor;
    wr->sg_list = sg;
    wr->num_sge = 1;
    wr->opcode = b->op;
    wr->send_flags = IBV_SEND_SIGNALED;
    wr->wr.rdma.remote_addr = it->remote_addr + t->next_off;
    wr->wr.rdma.rkey = it->rkey;
    if (k)
      ep->wrs[k - 1].next = wr;
    t->next_off += chunk;
    t->inflight++;
    k++;
  }
  if (!k)
    return;
  struct ibv_send_wr *bad = NULL;
  int e = c->ops->post_send(ep->qp, ep->wrs, &bad);
  int posted = k;
  if (e) {
    /* Take back what was not queued; those items stay retryable. */
    posted = bad ? (int)(bad - ep->wrs) : 0;
    for (int i = k - 1; i >= posted; i--) {
      item_track *t = &ep->trk[ep->wrs[i].wr_id];
      t->next_off -= ep->sges[i].length;
      t->inflight--;
      if (t->state == IT_ACTIVE)
        t->state = IT_FLUSHED;
      if (ep->wrs[i].wr_id < b->cursor)
        b->cursor = ep->wrs[i].wr_id;
    }
    b->broken = 1;
    EP_ERR(ep, ECS_EIO, "rdma: post_send on qp 0x%x: %s", ep->qp->qp_num, strerror(e));
  }
  b->outstanding += posted;
  ep->st.wrs += (uint64_t)posted;
}

/* Accounts one completion to its item. */
static void complete_one(batch *b, const struct ibv_wc *wc) {
  ecs_rdma_ep *ep = b->ep;
  b->outstanding--;
  if (wc->wr_id >= b->n)
    return; /* not ours: cannot happen with a fresh CQ per QP */
  size_t i = (size_t)wc->wr_id;
  item_track *t = &ep->trk[i];
  t->inflight--;
  if (wc->status == IBV_WC_SUCCESS) {
    if (t->state == IT_ACTIVE && t->inflight == 0 && t->next_off == b->items[i].len) {
      t->state = IT_DONE;
      b->status[i] = ECS_OK;
    }
    return;
  }
  ep->st.err_wcs++;
  b->broken = 1;
  if (wc->status == IBV_WC_WR_FLUSH_ERR) {
    if (t->state == IT_ACTIVE)
      t->state = IT_FLUSHED;
    return;
  }
  if (t->state != IT_DONE) {
    t->state = IT_DONE;
    b->status[i] = wc_to_err(wc->status);
    EP_ERR(ep, b->status[i], "rdma: item %zu: %s (status %d) on qp 0x%x", i, wc_name(wc->status),
           (int)wc->status, wc->qp_num);
  }
}

/* Polls until nothing is outstanding or the clock passes until. */
static int poll_until(batch *b, uint64_t until) {
  ecs_rdma_ep *ep = b->ep;
  struct ibv_wc wcs[16];
  unsigned idle = 0;
  while (b->outstanding > 0) {
    int k = ep->ctx->ops->poll_cq(ep->cq, 16, wcs);
    if (k < 0) {
      b->broken = 1;
      return EP_ERR(ep, ECS_EIO, "rdma: poll_cq failed on qp 0x%x", ep->qp->qp_num);
    }
    for (int j = 0; j < k; j++)
      complete_one(b, &wcs[j]);
    if (k > 0) {
      idle = 0;
      if (!b->broken)
        return ECS_OK; /* let the caller post more */
      continue;
    }
    if (now_ms() >= until)
      return ECS_ETIMEDOUT;
    if (++idle % 1024 == 0)
      sched_yield();
  }
  return ECS_OK;
}

/* One pass over the active items on the current QP.  Returns ECS_OK when
 * every item ended or was flushed, ECS_ETIMEDOUT at the deadline, ECS_EIO
 * when the CQ broke. */
static int run_pass(batch *b) {
  b->cursor = 0;
  b->outstanding = 0;
  b->broken = 0;
  for (;;) {
    /* The deadline holds also when completions keep coming, but too slowly. */
    int late = now_ms() >= b->deadline;
    if (!b->broken && !late)
      post_some(b);
    if (b->outstanding == 0) {
      if (late && !b->broken)
        for (size_t i = 0; i < b->n; i++)
          if (b->ep->trk[i].state == IT_ACTIVE)
            return ECS_ETIMEDOUT;
      return ECS_OK;
    }
    if (late)
      return ECS_ETIMEDOUT;
    int rc = poll_until(b, b->deadline);
    if (rc)
      return rc;
  }
}

/* The QP is stuck (deadline) or broken: move it to ERR so it flushes, give
 * the flushes ECS_RDMA_DRAIN_MS, and rebuild it.  Items not ended get code. */
static void abandon(batch *b, int code) {
  ecs_rdma_ep *ep = b->ep;
  int stuck = b->outstanding > 0 || b->broken;
  if (b->outstanding > 0) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    ep->ctx->ops->modify_qp(ep->qp, &a, IBV_QP_STATE);
    b->broken = 1; /* poll_until then keeps draining */
    poll_until(b, now_ms() + ECS_RDMA_DRAIN_MS);
  }
  for (size_t i = 0; i < b->n; i++)
    if (ep->trk[i].state != IT_DONE) {
      ep->trk[i].state = IT_DONE;
      b->status[i] = code;
    }
  if (stuck)
    ep_rebuild(ep); /* also what stops the device touching the buffers */
}

static int all_status(int *status, size_t n, int rc) {
  if (status)
    for (size_t i = 0; i < n; i++)
      status[i] = rc;
  return rc;
}

static int do_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms,
                    enum ibv_wr_opcode op) {
  if (!ep || (n && (!items || !status)))
    return all_status(status, n, ECS_EINVAL);
  if (n == 0)
    return ECS_OK;
  batch b = {.ep = ep, .items = items, .status = status, .n = n, .op = op};
  b.deadline = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : ep->ctx->timeout_ms);
  if (n > ep->trk_cap) {
    if (n > SIZE_MAX / sizeof(item_track))
      return all_status(status, n, ECS_ENOMEM);
    item_track *t = realloc(ep->trk, n * sizeof(*t));
    if (!t)
      return all_status(status, n, ECS_ENOMEM);
    ep->trk = t;
    ep->trk_cap = n;
  }
  if (!ep->connected) {
    int rc = ep_reconnect(ep, b.deadline);
    if (rc)
      return all_status(status, n, ECS_ENOTCONN);
  }
  for (size_t i = 0; i < n; i++) {
    ep->trk[i] = (item_track){.state = IT_ACTIVE};
    status[i] = item_check(ep, &items[i]);
    if (status[i] || items[i].len == 0)
      ep->trk[i].state = IT_DONE;
    if (status[i])
      EP_ERR(ep, status[i], "rdma: item %zu rejected before posting (range outside its MR or region)", i);
  }

  /* At most two passes: the second after reconnecting, for flushed items. */
  for (int pass = 0;; pass++) {
    int rc = run_pass(&b);
    if (rc == ECS_ETIMEDOUT) {
      ep->st.timeouts++;
      EP_ERR(ep, ECS_ETIMEDOUT, "rdma: deadline passed with %d work requests outstanding on qp 0x%x",
             b.outstanding, ep->qp->qp_num);
      abandon(&b, ECS_ETIMEDOUT);
      break;
    }
    if (rc) {
      abandon(&b, ECS_EIO);
      break;
    }
    if (!b.broken)
      break;
    /* The QP is in ERR (every WR came back): rebuild, then retry flushed
     * items once over a new connection when we can reconnect. */
    ep_rebuild(ep);
    int retry = 0;
    for (size_t i = 0; i < n; i++)
      if (ep->trk[i].state != IT_DONE)
        retry = 1;
    if (!retry)
      break;
    if (pass > 0 || ep_reconnect(ep, b.deadline) != ECS_OK) {
      for (size_t i = 0; i < n; i++)
        if (ep->trk[i].state != IT_DONE) {
          ep->trk[i].state = IT_DONE;
          status[i] = ECS_ECANCELED;
        }
      break;
    }
    for (size_t i = 0; i < n; i++)
      if (ep->trk[i].state != IT_DONE)
        ep->trk[i] = (item_track){.state = IT_ACTIVE};
  }
  for (size_t i = 0; i < n; i++) {
    if (status[i] == ECS_OK) {
      ep->st.items_ok++;
      ep->st.bytes += items[i].len;
    } else {
      ep->st.items_err++;
    }
  }
  return ECS_OK;
}

int ecs_rdma_read_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms) {
  return do_batch(ep, items, n, status, timeout_ms, IBV_WR_RDMA_READ);
}

int ecs_rdma_write_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms) {
  return do_batch(ep, items, n, status, timeout_ms, IBV_WR_RDMA_WRITE);
}

#else /* !ECS_HAVE_RDMA: every call that needs verbs says so. */

int ecs_rdma_ctx_open(const ecs_rdma_opts *opts, const struct ecs_verbs_ops *ops, ecs_rdma_ctx **out,
                      char *errbuf, size_t errlen) {
  (void)opts;
  (void)ops;
  if (out)
    *out = NULL;
  if (errbuf && errlen)
    snprintf(errbuf, errlen, "rdma: built without libibverbs");
  return ECS_ENOTSUP;
}

void ecs_rdma_ctx_close(ecs_rdma_ctx *ctx) {
  (void)ctx;
}

const char *ecs_rdma_ctx_device(const ecs_rdma_ctx *ctx) {
  (void)ctx;
  return "";
}

int ecs_rdma_reg(ecs_rdma_ctx *ctx, void *ptr, size_t len, int access, ecs_rdma_mr **out) {
  (void)ctx, (void)ptr, (void)len, (void)access;
  if (out)
    *out = NULL;
  return ECS_ENOTSUP;
}

void ecs_rdma_dereg(ecs_rdma_mr *mr) {
  (void)mr;
}

uint64_t ecs_rdma_mr_addr(const ecs_rdma_mr *mr) {
  (void)mr;
  return 0;
}

uint64_t ecs_rdma_mr_len(const ecs_rdma_mr *mr) {
  (void)mr;
  return 0;
}

uint32_t ecs_rdma_mr_rkey(const ecs_rdma_mr *mr) {
  (void)mr;
  return 0;
}

int ecs_rdma_ep_create(ecs_rdma_ctx *ctx, const ecs_rdma_mr *advertise, ecs_rdma_ep **out) {
  (void)ctx, (void)advertise;
  if (out)
    *out = NULL;
  return ECS_ENOTSUP;
}

int ecs_rdma_ep_create_isolated(ecs_rdma_ctx *ctx, ecs_rdma_ep **out) {
  (void)ctx;
  if (out)
    *out = NULL;
  return ECS_ENOTSUP;
}

int ecs_rdma_ep_window(ecs_rdma_ep *ep, void *ptr, size_t len, int access, ecs_rdma_mr **out) {
  (void)ep, (void)ptr, (void)len, (void)access;
  if (out)
    *out = NULL;
  return ECS_ENOTSUP;
}

void ecs_rdma_ep_destroy(ecs_rdma_ep *ep) {
  (void)ep;
}

int ecs_rdma_ep_local_blob(ecs_rdma_ep *ep, uint8_t out[ECS_RDMA_BLOB_SIZE]) {
  (void)ep, (void)out;
  return ECS_ENOTSUP;
}

int ecs_rdma_ep_connect(ecs_rdma_ep *ep, const void *blob, size_t len) {
  (void)ep, (void)blob, (void)len;
  return ECS_ENOTSUP;
}

int ecs_rdma_ep_reset(ecs_rdma_ep *ep) {
  (void)ep;
  return ECS_ENOTSUP;
}

int ecs_rdma_ep_connected(const ecs_rdma_ep *ep) {
  (void)ep;
  return 0;
}

int ecs_rdma_ep_peer_region(const ecs_rdma_ep *ep, uint64_t *addr, uint64_t *len, uint32_t *rkey) {
  (void)ep, (void)addr, (void)len, (void)rkey;
  return ECS_ENOTSUP;
}

uint32_t ecs_rdma_ep_qpn(const ecs_rdma_ep *ep) {
  (void)ep;
  return 0;
}

const char *ecs_rdma_ep_errmsg(const ecs_rdma_ep *ep) {
  (void)ep;
  return "rdma: built without libibverbs";
}

void ecs_rdma_ep_set_exchange(ecs_rdma_ep *ep, ecs_rdma_exchange_fn fn, void *arg) {
  (void)ep, (void)fn, (void)arg;
}

void ecs_rdma_ep_get_stats(const ecs_rdma_ep *ep, ecs_rdma_ep_stats *out) {
  (void)ep;
  memset(out, 0, sizeof(*out));
}

static int enotsup_batch(int *status, size_t n) {
  if (status)
    for (size_t i = 0; i < n; i++)
      status[i] = ECS_ENOTSUP;
  return ECS_ENOTSUP;
}

int ecs_rdma_read_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms) {
  (void)ep, (void)items, (void)timeout_ms;
  return enotsup_batch(status, n);
}

int ecs_rdma_write_batch(ecs_rdma_ep *ep, const ecs_rdma_item *items, size_t n, int *status, int timeout_ms) {
  (void)ep, (void)items, (void)timeout_ms;
  return enotsup_batch(status, n);
}

#endif /* ECS_HAVE_RDMA */

/* ---- test hook: the verbs table the store's server and client use ------ */

static const struct ecs_verbs_ops *g_ops_override;

void ecs__rdma_set_ops_override(const struct ecs_verbs_ops *ops) {
  g_ops_override = ops;
}

const struct ecs_verbs_ops *ecs__rdma_ops_override(void) {
  return g_ops_override;
}
