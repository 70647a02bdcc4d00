/*
 * RDMA transport: batches of READ or WRITE over one endpoint (see rdma.h
 * and docs/rdma.md).  Items are sliced into work requests, posted in
 * chains up to the outstanding limit, completed from the CQ, and on a
 * broken or stuck QP the endpoint is rebuilt, reconnected and the flushed
 * items retried, all within the batch's deadline.  Without libibverbs
 * every item is ECS_ENOTSUP.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/rdma/rdma_internal.h"

#ifdef ECS_HAVE_RDMA

#include <sched.h>

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
    if (ecs__rdma_now_ms() >= until)
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
    int late = ecs__rdma_now_ms() >= b->deadline;
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
    poll_until(b, ecs__rdma_now_ms() + ECS_RDMA_DRAIN_MS);
  }
  for (size_t i = 0; i < b->n; i++)
    if (ep->trk[i].state != IT_DONE) {
      ep->trk[i].state = IT_DONE;
      b->status[i] = code;
    }
  if (stuck)
    ecs__rdma_ep_rebuild(ep); /* also what stops the device touching the buffers */
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
  b.deadline = ecs__rdma_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : ep->ctx->timeout_ms);
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
    int rc = ecs__rdma_ep_reconnect(ep, b.deadline);
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
    ecs__rdma_ep_rebuild(ep);
    int retry = 0;
    for (size_t i = 0; i < n; i++)
      if (ep->trk[i].state != IT_DONE)
        retry = 1;
    if (!retry)
      break;
    if (pass > 0 || ecs__rdma_ep_reconnect(ep, b.deadline) != ECS_OK) {
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

#else /* !ECS_HAVE_RDMA */

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
