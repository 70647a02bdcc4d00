/*
 * The client's RDMA data path (store/rdma/rdma.h does the verbs).
 *
 * Set-up: after the TCP HELLO the client makes an RC endpoint and trades
 * connection blobs with the server over the same TCP connection
 * (RDMA_CONNECT).  The server's blob advertises no memory: the client
 * reaches the pool only through the windows of its own leases and
 * reservations, each zero-based over one block, whose rkeys come in the
 * LEASE / RESERVE replies and die at release, commit or expiry.  The
 * endpoint re-trades blobs by itself after an error completion (the
 * exchange callback below), which is how the QP is rebuilt.
 *
 * get:  LEASE over TCP pins the objects; the NIC READs each from its
 *       window [0, nbytes) into the caller's buffers; a one-way RELEASE
 *       unpins them.
 * put:  RESERVE over TCP; the NIC WRITEs the bytes into each block's
 *       window; COMMIT (items whose WRITE failed are committed with abort).
 *
 * Destination and source buffers should be registered once with
 * ecs_register_buffer(); an unregistered buffer is registered for the call
 * and deregistered after it, which is correct but slow (memory
 * registration pins and maps pages: milliseconds for large buffers).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/client/client_internal.h"
#include "store/client/client_priv.h"
#include "store/core/codec.h"
#include "store/rdma/rdma.h"

/* ------------------------------------------------------------------ */
/* registered buffers                                                   */

/* The registered region holding [p, p + n), or NULL. */
static ecs_rdma_mr *find_mr(const ecs_client_t *c, const void *p, uint64_t n, uint64_t *off) {
  uintptr_t a = (uintptr_t)p;
  for (size_t i = 0; i < c->nregs; i++) {
    uintptr_t b = (uintptr_t)c->regs[i].ptr;
    if (c->regs[i].mr && a >= b && n <= c->regs[i].len && a - b <= c->regs[i].len - n) {
      *off = a - b;
      return c->regs[i].mr;
    }
  }
  return NULL;
}

int ecs_register_buffer(ecs_client_t *c, void *ptr, size_t len) {
  if (!c || !ptr || len == 0)
    return ECS_EINVAL;
  for (size_t i = 0; i < c->nregs; i++)
    if (c->regs[i].ptr == ptr)
      return ECS_EBUSY; /* already registered */
  if (c->nregs == c->regs_cap) {
    size_t ncap = c->regs_cap ? c->regs_cap * 2 : 8;
    ecs_cli_reg_t *n = realloc(c->regs, ncap * sizeof *n);
    if (!n)
      return ECS_ENOMEM;
    c->regs = n;
    c->regs_cap = ncap;
  }
  ecs_rdma_mr *mr = NULL;
  if (c->rdma) {
    int rc = ecs_rdma_reg(c->rdma, ptr, len, 0, &mr);
    if (rc)
      return rc;
  }
  c->regs[c->nregs++] = (ecs_cli_reg_t){.ptr = ptr, .len = len, .mr = mr};
  return ECS_OK;
}

int ecs_unregister_buffer(ecs_client_t *c, void *ptr) {
  if (!c || !ptr)
    return ECS_EINVAL;
  for (size_t i = 0; i < c->nregs; i++) {
    if (c->regs[i].ptr != ptr)
      continue;
    ecs_rdma_dereg(c->regs[i].mr);
    c->regs[i] = c->regs[--c->nregs];
    return ECS_OK;
  }
  return ECS_ENOTFOUND;
}

void ecs__rdma_client_close(ecs_client_t *c) {
  for (size_t i = 0; i < c->nregs; i++)
    ecs_rdma_dereg(c->regs[i].mr);
  free(c->regs);
  c->regs = NULL;
  c->nregs = c->regs_cap = 0;
  ecs_rdma_ctx_close(c->rdma);
  c->rdma = NULL;
}

int ecs__rdma_client_open(ecs_client_t *c, char *errbuf, size_t errlen) {
  ecs_rdma_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.device = c->cfg.rdma_device && *c->cfg.rdma_device ? c->cfg.rdma_device : NULL;
  ro.port = c->cfg.rdma_port;
  ro.gid_index = c->cfg.rdma_gid_index;
  ro.timeout_ms = c->cfg.timeout_ms;
  return ecs_rdma_ctx_open(&ro, ecs__rdma_ops_override(), &c->rdma, errbuf, errlen);
}

/* ------------------------------------------------------------------ */
/* connection set-up                                                    */

/* Trades blobs over the TCP connection (also called by the endpoint to
 * rebuild its QP after an error). */
static int exchange(void *arg, const uint8_t local[ECS_RDMA_BLOB_SIZE], uint8_t peer[ECS_RDMA_BLOB_SIZE],
                    int timeout_ms) {
  ecs_cli_srv_t *s = arg;
  ecs_client_t *c = s->cli;
  if (s->fd < 0)
    return ECS_ENOTCONN;
  uint64_t deadline = ecs_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
  ecs_wbuf_reset(&c->w);
  ecs_wbuf_put(&c->w, local, ECS_RDMA_BLOB_SIZE);
  ecs_hdr_t h;
  int rc = ecs__cli_call(c, s, ECS_OP_RDMA_CONNECT, 0, NULL, 0, 0, 0, NULL, &h, deadline);
  if (rc != ECS_OK && h.status != ECS_OK)
    return rc; /* the server said no: the connection is fine */
  if (rc)
    return ecs__cli_fail(c, s, rc);
  if (h.meta_len != ECS_RDMA_BLOB_SIZE)
    return ecs__cli_fail(c, s, ECS_EPROTO);
  memcpy(peer, c->rmeta, ECS_RDMA_BLOB_SIZE);
  return ECS_OK;
}

static void rdma_drop(ecs_cli_srv_t *s) {
  ecs_rdma_ep_destroy(s->ep);
  s->ep = NULL;
}

static int rdma_upgrade(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline) {
  int rc = ecs_rdma_ep_create(c->rdma, NULL, &s->ep);
  if (rc) {
    ecs__cli_err(c, "%s: cannot create an RDMA endpoint: %s", s->addr, ecs_strerror(rc));
    return rc;
  }
  ecs_rdma_ep_set_exchange(s->ep, exchange, s);
  uint8_t local[ECS_RDMA_BLOB_SIZE], peer[ECS_RDMA_BLOB_SIZE];
  uint64_t now = ecs_now_ms();
  rc = ecs_rdma_ep_local_blob(s->ep, local);
  if (rc == ECS_OK)
    rc = exchange(s, local, peer, now < deadline ? (int)(deadline - now) : 1);
  if (rc == ECS_OK)
    rc = ecs_rdma_ep_connect(s->ep, peer, sizeof peer);
  if (rc) {
    ecs__cli_err(c, "%s: RDMA set-up failed: %s%s", s->addr, ecs_strerror(rc),
                 rc == ECS_ENOTSUP ? " (the server has no RDMA device)" : "");
    rdma_drop(s);
    return rc;
  }
  s->ops = &ecs__cli_rdma_ops;
  return ECS_OK;
}

/* ------------------------------------------------------------------ */
/* data                                                                 */

/* A local side for an RDMA item: a registered region, or a registration
 * made for this call (tmp, deregistered by the caller). */
static int local_side(ecs_client_t *c, void *p, uint64_t n, ecs_rdma_item *it, ecs_rdma_mr **tmp) {
  *tmp = NULL;
  it->local = find_mr(c, p, n, &it->local_off);
  if (it->local)
    return ECS_OK;
  int rc = ecs_rdma_reg(c->rdma, p, (size_t)n, 0, tmp);
  it->local = *tmp;
  it->local_off = 0;
  return rc;
}

static int remaining_ms(uint64_t deadline) {
  uint64_t now = ecs_now_ms();
  return now >= deadline ? 1 : (int)(deadline - now > 0x7fffffff ? 0x7fffffff : deadline - now);
}

/* One item of an RDMA get. */
typedef struct rget_item {
  ecs_lease_reply_t l; /* its lease record */
  uint8_t *zbuf;       /* a compressed object lands here, then is delivered */
  ecs_rdma_mr *tmp;    /* a registration made for this call, or NULL */
} rget_item_t;

/* Reads the lease records into it[] (copied out first: a QP rebuild during
 * the READs reuses the connection's buffers) and collects the lease ids.
 * A lease of bytes must come with its window's rkey. */
static int read_leases(ecs_client_t *c, const ecs_hdr_t *h, size_t m, rget_item_t *it, uint64_t *ids,
                       size_t *nids) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  for (size_t j = 0; j < m; j++) {
    const ecs_lease_reply_t *l = &it[j].l;
    if (ecs_proto_lease_reply_read(&r, &it[j].l) != ECS_OK ||
        (l->status == ECS_OK && l->nbytes && l->rkey == 0))
      return ECS_EPROTO;
    if (l->status == ECS_OK)
      ids[(*nids)++] = l->lease_id;
  }
  return ECS_OK;
}

/* Where item j's bytes land: the caller's buffer, one malloc'd for it
 * (alloc), or a scratch buffer for a compressed object.  NULL with b's
 * status set when there is none.  Every size here is the server's word:
 * an allocating get allocates at most the client's max_object_size (as
 * over TCP: ECS_EBUFSMALL with nbytes the size), and a compressed object
 * at most its codec's bound of a raw size that fits the destination. */
static void *read_dest(ecs_client_t *c, ecs_get_buf_t *b, rget_item_t *it, int alloc) {
  const ecs_lease_reply_t *l = &it->l;
  void *dst;
  uint64_t cap = alloc ? c->cfg.max_object_size : (b->data ? b->capacity : 0);
  uint64_t raw = l->codec != ECS_CODEC_NONE ? l->raw_nbytes : l->nbytes;
  if (raw > cap || l->nbytes > SIZE_MAX) {
    b->status = ECS_EBUFSMALL;
    b->nbytes = raw; /* what is needed */
    return NULL;
  }
  if (l->codec != ECS_CODEC_NONE && !ecs_codec_frame_ok(l->codec, l->nbytes, l->raw_nbytes)) {
    b->status = ECS_EPROTO;
    b->nbytes = 0;
    return NULL;
  }
  if (l->codec != ECS_CODEC_NONE) {
    dst = it->zbuf = malloc((size_t)l->nbytes);
  } else if (alloc) {
    free(b->data); /* a retry's first attempt may have allocated it */
    dst = b->data = malloc((size_t)l->nbytes);
    b->capacity = l->nbytes;
  } else {
    dst = b->data;
  }
  if (!dst)
    b->status = ECS_ENOMEM;
  return dst;
}

static int rdma_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                    const size_t *idx, size_t m, int alloc, uint64_t deadline) {
  ecs_hdr_t h;
  int rc = ecs__cli_lease(c, s, keys, idx, m, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  rget_item_t *it = calloc(m ? m : 1, sizeof *it);
  /* what ecs_rdma_read_batch takes: its items and statuses, and which
   * get item each one is */
  ecs_rdma_item *items = calloc(m ? m : 1, sizeof *items);
  int *st = calloc(m ? m : 1, sizeof *st);
  size_t *which = calloc(m ? m : 1, sizeof *which);
  uint64_t *ids = calloc(m ? m : 1, sizeof *ids);
  size_t nids = 0, n = 0;
  if (!it || !items || !st || !which || !ids) {
    rc = ECS_ENOMEM;
    goto out;
  }
  rc = read_leases(c, &h, m, it, ids, &nids);
  if (rc)
    goto out;
  for (size_t j = 0; j < m; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    const ecs_lease_reply_t *l = &it[j].l;
    b->status = l->status;
    b->nbytes = l->nbytes;
    b->desc = l->desc;
    if (l->status != ECS_OK || l->nbytes == 0)
      continue;
    void *dst = read_dest(c, b, &it[j], alloc);
    if (!dst)
      continue;
    if (local_side(c, dst, l->nbytes, &items[n], &it[j].tmp) != ECS_OK) {
      b->status = ECS_EIO;
      continue;
    }
    items[n].remote_addr = 0; /* the window is zero-based */
    items[n].rkey = l->rkey;
    items[n].len = l->nbytes;
    which[n++] = j;
  }
  if (n) {
    rc = ecs_rdma_read_batch(s->ep, items, n, st, remaining_ms(deadline));
    if (rc)
      goto out;
  }
  for (size_t k = 0; k < n; k++) {
    size_t j = which[k];
    ecs_get_buf_t *b = &bufs[idx[j]];
    const ecs_lease_reply_t *l = &it[j].l;
    if (st[k] != ECS_OK) {
      b->status = st[k];
      b->nbytes = 0;
    } else if (l->codec != ECS_CODEC_NONE) {
      b->status = ecs__cli_deliver(c, b, it[j].zbuf, l->codec, l->nbytes, l->raw_nbytes, l->checksum, alloc);
    } else if (c->cfg.verify_checksum && ecs_checksum(b->data, (size_t)b->nbytes) != l->checksum) {
      b->status = ECS_ECHECKSUM;
    }
    if (b->status == ECS_ECHECKSUM || b->status == ECS_ECODEC)
      b->nbytes = 0;
  }
out:
  for (size_t j = 0; it && j < m; j++) {
    ecs_rdma_dereg(it[j].tmp);
    free(it[j].zbuf);
  }
  if (rc == ECS_OK || rc == ECS_ETIMEDOUT)
    ecs__cli_release(c, s, ids, nids, deadline); /* a failed read still unpins */
  free(it);
  free(items);
  free(st);
  free(which);
  free(ids);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
}

/* The RDMA writer of an in-place put. */
static int rdma_write(ecs_client_t *c, ecs_cli_srv_t *s, ecs_cli_wr_t *w, size_t n, uint64_t deadline) {
  ecs_rdma_item *items = calloc(n ? n : 1, sizeof *items);
  ecs_rdma_mr **tmp = calloc(n ? n : 1, sizeof *tmp);
  size_t *which = calloc(n ? n : 1, sizeof *which);
  int *wst = calloc(n ? n : 1, sizeof *wst);
  int rc = ECS_OK;
  size_t k = 0;
  if (!items || !tmp || !which || !wst) {
    rc = ECS_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const ecs_tensor_t *src = w[i].src;
    if (src->nbytes && w[i].rkey == 0) {
      rc = ECS_EPROTO; /* a reservation of bytes must come with its window */
      goto out;
    }
    w[i].status = ECS_OK;
    if (src->nbytes == 0)
      continue;
    if (local_side(c, (void *)src->data, src->nbytes, &items[k], &tmp[k]) != ECS_OK) {
      w[i].status = ECS_EIO;
      continue;
    }
    items[k].remote_addr = 0; /* the window is zero-based */
    items[k].rkey = w[i].rkey;
    items[k].len = src->nbytes;
    which[k++] = i;
  }
  if (k) {
    rc = ecs_rdma_write_batch(s->ep, items, k, wst, remaining_ms(deadline));
    for (size_t j = 0; rc == ECS_OK && j < k; j++)
      w[which[j]].status = wst[j];
  }
out:
  for (size_t j = 0; tmp && j < k; j++)
    ecs_rdma_dereg(tmp[j]);
  free(items);
  free(tmp);
  free(which);
  free(wst);
  return rc;
}

static int rdma_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                    const size_t *idx, size_t m, int *status, uint64_t deadline) {
  return ecs__cli_put_inplace(c, s, keys, ts, idx, m, status, deadline, rdma_write);
}

/* The NIC reads into the caller's memory, not into a mapping: no views. */
const ecs_cli_ops_t ecs__cli_rdma_ops = {
    .name = "rdma",
    .upgrade = rdma_upgrade,
    .put = rdma_put,
    .get = rdma_get,
    .view = NULL,
    .drop = rdma_drop,
};

int ecs__client_rdma_qpn(ecs_client_t *c, size_t server, uint32_t *qpn) {
  if (!c || server >= c->nsrv || !c->srv[server].ep)
    return ECS_ENOTCONN;
  *qpn = ecs_rdma_ep_qpn(c->srv[server].ep);
  return ECS_OK;
}
