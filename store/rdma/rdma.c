/*
 * RDMA transport (see rdma.h and docs/rdma.md): contexts, memory
 * registration and endpoints.
 *
 * A context is one open device with its PD and port; an MR registers a
 * buffer on it; an endpoint is a CQ and an RC QP (rebuilt after an error),
 * windows over its memory, and the blob exchange that connects it.  The
 * batch engine is rdma_batch.c, the blob codec rdma_blob.c; the structs
 * they share are in rdma_internal.h.  All of it goes through the verbs
 * operations table (RDMA builds only); a build without libibverbs gets the
 * stubs at the end.
 */
#include "store/rdma/rdma.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/rdma/rdma_internal.h"

#ifdef ECS_HAVE_RDMA

#include <errno.h>
#include <stdarg.h>
#include <sys/random.h>

#include "ecstore/error.h"

int ecs__rdma_set_err(char *buf, size_t len, int rc, const char *fmt, ...) {
  if (buf && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
  }
  return rc;
}

static uint32_t random_psn(void) {
  uint32_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
    v = (uint32_t)ecs__rdma_now_ms() * 2654435761u ^ (uint32_t)(uintptr_t)&v;
  return v & ECS_RDMA_PSN_MASK;
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
    return ecs__rdma_set_err(errbuf, errlen, ECS_ENODEV, "rdma: no RDMA device found");
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
    return ecs__rdma_set_err(errbuf, errlen, ECS_ENODEV, "rdma: device '%s' not found (have: %s)", want,
                             names);
  }
  snprintf(c->device, sizeof(c->device), "%s", c->ops->get_device_name(dev));
  c->vctx = c->ops->open_device(dev);
  int e = errno;
  c->ops->free_device_list(c->ops->priv, list);
  if (!c->vctx)
    return ecs__rdma_set_err(errbuf, errlen, e == ENOMEM ? ECS_ENOMEM : ECS_EIO, "rdma: cannot open %s: %s",
                             c->device, strerror(e));
  return ECS_OK;
}

/* Reads the port, GID and device limits the endpoints need. */
static int query_port(ecs_rdma_ctx *c, char *errbuf, size_t errlen) {
  struct ibv_device_attr da;
  struct ibv_port_attr pa;
  int e = c->ops->query_device(c->vctx, &da);
  if (e)
    return ecs__rdma_set_err(errbuf, errlen, ECS_EIO, "rdma: %s: query_device: %s", c->device, strerror(e));
  if (c->port < 1 || c->port > da.phys_port_cnt)
    return ecs__rdma_set_err(errbuf, errlen, ECS_EINVAL, "rdma: %s has no port %u", c->device, c->port);
  e = c->ops->query_port(c->vctx, c->port, &pa);
  if (e)
    return ecs__rdma_set_err(errbuf, errlen, ECS_EIO, "rdma: %s: query_port %u: %s", c->device, c->port,
                             strerror(e));
  if (pa.state != IBV_PORT_ACTIVE)
    return ecs__rdma_set_err(errbuf, errlen, ECS_ENODEV, "rdma: %s port %u is not active", c->device,
                             c->port);
  if (c->gid_index < 0 || c->gid_index >= pa.gid_tbl_len)
    return ecs__rdma_set_err(errbuf, errlen, ECS_EINVAL,
                             "rdma: %s port %u: GID index %d out of range (table has %d)", c->device, c->port,
                             c->gid_index, pa.gid_tbl_len);
  e = c->ops->query_gid(c->vctx, c->port, c->gid_index, &c->gid);
  if (e)
    return ecs__rdma_set_err(errbuf, errlen, ECS_EIO, "rdma: %s: query_gid: %s", c->device, strerror(e));
  static const union ibv_gid zero;
  if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && !memcmp(&c->gid, &zero, sizeof(zero)))
    return ecs__rdma_set_err(errbuf, errlen, ECS_EINVAL,
                             "rdma: %s port %u: GID index %d is empty (RoCE needs one)", c->device, c->port,
                             c->gid_index);
  c->lid = pa.lid;
  c->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? ECS_RDMA_LL_ETHERNET : ECS_RDMA_LL_INFINIBAND;
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
    return ecs__rdma_set_err(errbuf, errlen, ECS_EINVAL, "rdma: invalid options");
  ecs_rdma_ctx *c = calloc(1, sizeof(*c));
  if (!c)
    return ecs__rdma_set_err(errbuf, errlen, ECS_ENOMEM, "rdma: out of memory");
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
    rc = ecs__rdma_set_err(errbuf, errlen, ECS_EIO, "rdma: %s: alloc_pd: %s", c->device, strerror(errno));
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
void ecs__rdma_ep_rebuild(ecs_rdma_ep *ep) {
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
  if (c->link_layer == ECS_RDMA_LL_ETHERNET || p->lid == 0) {
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
  if ((p.link_layer == ECS_RDMA_LL_ETHERNET || p.lid == 0) && !memcmp(p.gid, zero, 16))
    return EP_ERR(ep, ECS_EPROTO, "rdma: peer blob has no address (LID 0 and an empty GID)");
  if (!ep->qp && (rc = ep_build(ep)) != 0)
    return rc;
  rc = ep_rtr_rts(ep, &p);
  if (rc) {
    ecs__rdma_ep_rebuild(ep);
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
int ecs__rdma_ep_reconnect(ecs_rdma_ep *ep, uint64_t deadline) {
  if (!ep->xchg)
    return EP_ERR(ep, ECS_ENOTCONN, "rdma: endpoint needs a blob exchange (no exchange callback)");
  uint64_t now = ecs__rdma_now_ms();
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

#endif /* ECS_HAVE_RDMA */

/* ---- test hook: the verbs table the store's server and client use ------ */

static const struct ecs_verbs_ops *g_ops_override;

void ecs__rdma_set_ops_override(const struct ecs_verbs_ops *ops) {
  g_ops_override = ops;
}

const struct ecs_verbs_ops *ecs__rdma_ops_override(void) {
  return g_ops_override;
}
