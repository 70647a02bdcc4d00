/*
 * The client's shared-memory data path (a server on this host).
 *
 * Discovery: a TCP HELLO names the server's Unix socket.  The client opens
 * it and says HELLO again; only when the answer names the same node and
 * epoch is it the same server (a socket of the same name on another host's
 * client would be another server).  ATTACH then hands over the pool's memfd
 * (SCM_RIGHTS), which the client maps: read-only unless it will put.
 *
 * get:  LEASE pins the objects and says where they lie; the client copies
 *       them into the caller's buffers (or hands out views, no copy at all)
 *       and RELEASEs the pins with a one-way message.
 * put:  RESERVE allocates blocks; the client copies the bytes in place;
 *       COMMIT has the server verify the checksum, index and publish them.
 *
 * Every length the server sends is checked against the mapping before the
 * client touches memory through it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <xxhash.h>

#include "store/checksum.h"
#include "store/client_priv.h"

static int put_unique(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                      const size_t *idx, size_t m, int *status, uint64_t deadline, ecs_cli_writer_fn write);
static int shm_write(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_tensor_t *const *src, const uint64_t *off,
                     size_t n, int *st, uint64_t deadline);

void ecs__shm_map_put(ecs_shm_map_t *m) {
  if (m && m->retired && m->views == 0) {
    munmap(m->base, m->len);
    free(m);
  }
}

/* ATTACH on fd: receive the pool's descriptor and map it. */
static int attach(ecs_client_t *c, ecs_cli_srv_t *u, uint64_t deadline, ecs_shm_map_t **out) {
  int want_write = !c->cfg.shm_read_only;
  ecs_wbuf_reset(&c->w);
  ecs_wbuf_u32(&c->w, want_write ? ECS_ATTACH_WRITE : 0);
  uint32_t id;
  int rc = ecs__cli_send(c, u, ECS_OP_ATTACH, 0, 0, NULL, 0, 0, &id, deadline);
  if (rc)
    return rc;
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  int pfd = -1;
  rc = ecs_net_read_all_fd(u->fd, hb, sizeof hb, deadline, &pfd);
  if (rc)
    return rc;
  ecs_hdr_t h;
  rc = ecs_proto_hdr_decode(hb, 0, &h);
  uint8_t meta[64];
  if (rc == ECS_OK && (!(h.flags & ECS_FLAG_REPLY) || h.opcode != ECS_OP_ATTACH || h.req_id != id ||
                       h.meta_len > sizeof meta))
    rc = ECS_EPROTO;
  if (rc == ECS_OK)
    rc = ecs_net_read_all(u->fd, meta, h.meta_len, deadline);
  if (rc == ECS_OK && h.status != ECS_OK)
    rc = h.status;
  ecs_attach_reply_t ar;
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, meta, h.meta_len);
    rc = ecs_proto_attach_reply_read(&r, &ar);
  }
  if (rc == ECS_OK && (pfd < 0 || ar.pool_size == 0))
    rc = ECS_EPROTO;
  ecs_shm_map_t *m = NULL;
  if (rc == ECS_OK) {
    m = calloc(1, sizeof *m);
    int writable = (ar.flags & ECS_ATTACH_WRITE) != 0;
    void *base = MAP_FAILED;
    if (!m)
      rc = ECS_ENOMEM;
    else
      base = mmap(NULL, (size_t)ar.pool_size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, pfd, 0);
    if (m && base == MAP_FAILED) {
      rc = ecs_from_errno(errno);
      free(m);
      m = NULL;
    } else if (m) {
      m->base = base;
      m->len = (size_t)ar.pool_size;
      m->writable = writable;
    }
  }
  if (pfd >= 0)
    close(pfd); /* the mapping keeps the pages */
  *out = m;
  return rc;
}

int ecs__shm_upgrade(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline) {
  ecs_cli_srv_t u = *s; /* the Unix-socket side, checked before it replaces s */
  u.map = NULL;
  int rc = ecs_net_connect_unix(s->shm_path, deadline, &u.fd);
  if (rc) {
    ecs__cli_err(c, "%s: cannot open its shm socket %s (not on this host?)", s->addr, s->shm_path);
    return rc;
  }
  rc = ecs__cli_hello(c, &u, deadline);
  if (rc == ECS_ECONN && !c->errmsg[0])
    /* The server accepts a Unix connection and closes it at once when the
     * peer's uid is not allowed (or at its connection limit); the reason
     * is in its log, so name both here. */
    ecs__cli_err(c,
                 "%s refused shared memory: it closed %s at once (uid %u is not allowed: the server "
                 "admits its own user, root and --shm-allow-uid; or it is at --max-conns)",
                 s->addr, s->shm_path, (unsigned)geteuid());
  if (rc == ECS_OK && (strcmp(u.node_id, s->node_id) != 0 || u.epoch != s->epoch)) {
    ecs__cli_err(c, "%s: the socket %s belongs to another server (node %s)", s->addr, s->shm_path, u.node_id);
    rc = ECS_ENOTSUP;
  }
  ecs_shm_map_t *m = NULL;
  if (rc == ECS_OK)
    rc = attach(c, &u, deadline, &m);
  if (rc) {
    if (!c->errmsg[0])
      ecs__cli_err(c, "%s: shm attach failed: %s", s->addr, ecs_strerror(rc));
    close(u.fd);
    return rc;
  }
  close(s->fd); /* the TCP connection is no longer needed */
  s->fd = u.fd;
  s->path = ECS_PATH_SHM;
  s->map = m;
  return ECS_OK;
}

/* Sends the lease ids one-way: the server replies to nothing. */
void ecs__cli_release(ecs_client_t *c, ecs_cli_srv_t *s, const uint64_t *ids, size_t n, uint64_t deadline) {
  for (size_t off = 0; off < n && s->fd >= 0; off += ECS_PROTO_MAX_ITEMS) {
    size_t k = n - off < ECS_PROTO_MAX_ITEMS ? n - off : ECS_PROTO_MAX_ITEMS;
    ecs_wbuf_reset(&c->w);
    for (size_t i = 0; i < k; i++)
      ecs_proto_u64_write(&c->w, ids[off + i]);
    uint32_t id;
    int rc = ecs__cli_send(c, s, ECS_OP_RELEASE, ECS_FLAG_NOREPLY, (uint32_t)k, NULL, 0, 0, &id, deadline);
    if (rc)
      ecs__cli_fail(c, s, rc); /* the pins die with the connection */
  }
}

/* LEASE for keys idx[0..m): the reply records stay in c->rmeta. */
int ecs__cli_lease(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const size_t *idx, size_t m,
                   ecs_hdr_t *h, uint64_t deadline) {
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++)
    ecs_proto_key_write(&c->w, keys[idx[j]].data, (uint16_t)keys[idx[j]].len);
  uint32_t id;
  int rc = ecs__cli_send(c, s, ECS_OP_LEASE, 0, (uint32_t)m, NULL, 0, 0, &id, deadline);
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, ECS_OP_LEASE, id, h, deadline);
  if (rc == ECS_OK && (h->status != ECS_OK || h->count != m || h->data_len != 0))
    rc = h->status != ECS_OK ? h->status : ECS_EPROTO;
  return rc;
}

/* A lease record the mapping can honour. */
static int lease_in_bounds(const ecs_shm_map_t *map, const ecs_lease_reply_t *l) {
  return l->off <= map->len && l->nbytes <= map->len - l->off;
}

int ecs__shm_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                 const size_t *idx, size_t m, int alloc, uint64_t deadline) {
  ecs_hdr_t h;
  int rc = ecs__cli_lease(c, s, keys, idx, m, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  uint64_t *ids = malloc((m ? m : 1) * sizeof *ids);
  if (!ids)
    return ecs__cli_fail(c, s, ECS_ENOMEM); /* closing drops the pins */
  size_t nids = 0;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  const uint8_t *base = s->map->base;
  for (size_t j = 0; j < m && rc == ECS_OK; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    ecs_lease_reply_t l;
    if (ecs_proto_lease_reply_read(&r, &l) != ECS_OK ||
        (l.status == ECS_OK && !lease_in_bounds(s->map, &l))) {
      rc = ECS_EPROTO;
      break;
    }
    b->status = l.status;
    b->nbytes = l.nbytes;
    b->desc = l.desc;
    if (l.status != ECS_OK)
      continue;
    ids[nids++] = l.lease_id;
    if (l.codec == ECS_CODEC_NONE && !alloc && l.nbytes <= b->capacity && (b->data || !l.nbytes)) {
      /* raw: copy, verifying the copy slice by slice while it is in cache */
      if (c->cfg.verify_checksum) {
        if (ecs_copy_checksum(b->data, base + l.off, (size_t)l.nbytes) != l.checksum) {
          b->status = ECS_ECHECKSUM;
          b->nbytes = 0;
        }
      } else if (l.nbytes) {
        memcpy(b->data, base + l.off, (size_t)l.nbytes);
      }
      continue;
    }
    b->status = ecs__cli_deliver(c, b, base + l.off, l.codec, l.nbytes, l.raw_nbytes, l.checksum, alloc);
    if (b->status == ECS_ECHECKSUM || b->status == ECS_ECODEC || b->status == ECS_ENOMEM)
      b->nbytes = 0;
  }
  if (rc) {
    free(ids);
    return ecs__cli_fail(c, s, rc);
  }
  ecs__cli_release(c, s, ids, nids, deadline);
  free(ids);
  return ECS_OK;
}

/* first[j] = the position of the first item with the same key as item j
 * (j itself when it is the first).  An open-addressing table over xxh3 of
 * the keys, so a batch of thousands costs O(m). */
static int find_dups(const ecs_key_t *keys, const size_t *idx, size_t m, size_t *first) {
  size_t cap = 16;
  while (cap < 2 * m)
    cap *= 2;
  size_t *slot = malloc(cap * sizeof *slot);
  if (!slot)
    return ECS_ENOMEM;
  for (size_t i = 0; i < cap; i++)
    slot[i] = SIZE_MAX;
  for (size_t j = 0; j < m; j++) {
    const ecs_key_t *k = &keys[idx[j]];
    size_t h = (size_t)XXH3_64bits(k->data, k->len) & (cap - 1);
    first[j] = j;
    while (slot[h] != SIZE_MAX) {
      const ecs_key_t *o = &keys[idx[slot[h]]];
      if (o->len == k->len && memcmp(o->data, k->data, k->len) == 0) {
        first[j] = slot[h];
        break;
      }
      h = (h + 1) & (cap - 1);
    }
    if (first[j] == j)
      slot[h] = j;
  }
  free(slot);
  return ECS_OK;
}

int ecs__shm_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                 const size_t *idx, size_t m, int *status, uint64_t deadline) {
  return ecs__cli_put_inplace(c, s, keys, ts, idx, m, status, deadline, shm_write);
}

static int same_tensor(const ecs_tensor_t *a, uint64_t asum, const ecs_tensor_t *b, uint64_t bsum) {
  if (a->nbytes != b->nbytes || asum != bsum || a->desc.dtype != b->desc.dtype ||
      a->desc.ndim != b->desc.ndim)
    return 0;
  for (unsigned d = 0; d < a->desc.ndim; d++)
    if (a->desc.shape[d] != b->desc.shape[d])
      return 0;
  return 1;
}

int ecs__cli_put_inplace(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                         const size_t *idx, size_t m, int *status, uint64_t deadline,
                         ecs_cli_writer_fn write) {
  /* A key twice in one batch is reserved once per round: its first
   * occurrence goes to the server and a repeat is settled against it once
   * it is stored (same content: OK, other content: ECS_ECONFLICT).  A
   * repeat whose first occurrence conflicted with what the server already
   * held cannot be settled that way (it may carry the stored content), so
   * it goes to the server in the next round, which checks it against the
   * stored object as a tcp put would. */
  size_t *first = malloc((m ? m : 1) * sizeof *first);
  size_t *uidx = calloc(m ? m : 1, sizeof *uidx); /* calloc: quiets a false -Wmaybe-uninitialized */
  size_t *left = malloc((m ? m : 1) * sizeof *left), *next = malloc((m ? m : 1) * sizeof *next);
  int rc = ECS_ENOMEM;
  if (!first || !uidx || !left || !next)
    goto out;
  memcpy(left, idx, m * sizeof *left);
  size_t nleft = m;
  rc = ECS_OK;
  while (rc == ECS_OK && nleft > 0) {
    if (find_dups(keys, left, nleft, first) != ECS_OK) {
      rc = ECS_ENOMEM;
      break;
    }
    size_t um = 0;
    for (size_t j = 0; j < nleft; j++)
      if (first[j] == j)
        uidx[um++] = left[j];
    rc = put_unique(c, s, keys, ts, uidx, um, status, deadline, write);
    size_t nn = 0;
    for (size_t j = 0; rc == ECS_OK && j < nleft; j++) {
      if (first[j] == j)
        continue;
      size_t a = left[first[j]], b = left[j];
      uint64_t sa = ecs_checksum(ts[a].data, (size_t)ts[a].nbytes),
               sb = ecs_checksum(ts[b].data, (size_t)ts[b].nbytes);
      int same = same_tensor(&ts[a], sa, &ts[b], sb);
      if (status[a] == ECS_ECONFLICT && !same)
        next[nn++] = b;
      else
        status[b] = status[a] != ECS_OK ? status[a] : same ? ECS_OK : ECS_ECONFLICT;
    }
    memcpy(left, next, nn * sizeof *left);
    nleft = nn;
  }
out:
  free(first);
  free(uidx);
  free(left);
  free(next);
  return rc;
}

/* RESERVE -> write in place -> COMMIT for keys that are unique in the
 * batch.  write() moves the bytes (memcpy into the shared map, or RDMA
 * WRITEs); an item it could not write is committed with abort and gets the
 * write's status. */
static int put_unique(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                      const size_t *idx, size_t m, int *status, uint64_t deadline, ecs_cli_writer_fn write) {
  uint64_t *sums = malloc((m ? m : 1) * sizeof *sums);
  uint64_t *woff = malloc((m ? m : 1) * sizeof *woff), *wresv = malloc((m ? m : 1) * sizeof *wresv);
  size_t *wj = malloc((m ? m : 1) * sizeof *wj);
  const ecs_tensor_t **wsrc = malloc((m ? m : 1) * sizeof *wsrc);
  int *wst = malloc((m ? m : 1) * sizeof *wst);
  int rc = ECS_ENOMEM;
  if (!sums || !woff || !wresv || !wj || !wsrc || !wst)
    goto out;
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++) {
    const ecs_tensor_t *t = &ts[idx[j]];
    sums[j] = ecs_checksum(t->data, (size_t)t->nbytes);
    ecs_put_item_t it = {.key = keys[idx[j]].data,
                         .key_len = (uint16_t)keys[idx[j]].len,
                         .codec = ECS_CODEC_NONE,
                         .flags = c->put_flags,
                         .desc = t->desc,
                         .nbytes = t->nbytes,
                         .raw_nbytes = t->nbytes,
                         .checksum = sums[j]};
    ecs_proto_put_item_write(&c->w, &it);
  }
  uint32_t id;
  ecs_hdr_t h;
  rc = ecs__cli_send(c, s, ECS_OP_RESERVE, 0, (uint32_t)m, NULL, 0, 0, &id, deadline);
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, ECS_OP_RESERVE, id, &h, deadline);
  if (rc == ECS_OK && (h.status != ECS_OK || h.count != m || h.data_len != 0))
    rc = h.status != ECS_OK ? h.status : ECS_EPROTO;
  size_t nw = 0;
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, c->rmeta, h.meta_len);
    for (size_t j = 0; j < m && rc == ECS_OK; j++) {
      ecs_reserve_reply_t rr;
      if (ecs_proto_reserve_reply_read(&r, &rr) != ECS_OK) {
        rc = ECS_EPROTO;
        break;
      }
      status[idx[j]] = rr.status;
      if (rr.status != ECS_OK || rr.resv_id == 0)
        continue; /* an error, or already stored with this content */
      wj[nw] = j;
      woff[nw] = rr.off;
      wresv[nw] = rr.resv_id;
      wsrc[nw] = &ts[idx[j]];
      nw++;
    }
  }
  /* the bytes go in place; then one COMMIT settles every reservation */
  if (rc == ECS_OK && nw > 0)
    rc = write(c, s, wsrc, woff, nw, wst, deadline);
  if (rc == ECS_OK && nw > 0) {
    ecs_wbuf_reset(&c->w);
    for (size_t k = 0; k < nw; k++) {
      ecs_commit_item_t ci = {.resv_id = wresv[k], .checksum = sums[wj[k]], .abort = wst[k] != ECS_OK};
      ecs_proto_commit_item_write(&c->w, &ci);
    }
    rc = ecs__cli_send(c, s, ECS_OP_COMMIT, 0, (uint32_t)nw, NULL, 0, 0, &id, deadline);
    if (rc == ECS_OK)
      rc = ecs__cli_recv(c, s, ECS_OP_COMMIT, id, &h, deadline);
    if (rc == ECS_OK && (h.status != ECS_OK || h.count != nw))
      rc = h.status != ECS_OK ? h.status : ECS_EPROTO;
    if (rc == ECS_OK) {
      ecs_rbuf_t r;
      ecs_rbuf_init(&r, c->rmeta, h.meta_len);
      for (size_t k = 0; k < nw && rc == ECS_OK; k++) {
        int32_t st;
        rc = ecs_proto_status_read(&r, &st);
        status[idx[wj[k]]] = wst[k] != ECS_OK ? wst[k] : st;
      }
    }
  }
out:
  free(sums);
  free(woff);
  free(wresv);
  free(wj);
  free(wsrc);
  free(wst);
  if (rc == ECS_ENOMEM)
    return rc;
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK; /* a dropped connection aborts the reservations */
}

/* The shm writer: memcpy into the shared map, bounds-checked. */
static int shm_write(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_tensor_t *const *src, const uint64_t *off,
                     size_t n, int *st, uint64_t deadline) {
  (void)c;
  (void)deadline;
  for (size_t k = 0; k < n; k++)
    if (off[k] > s->map->len || src[k]->nbytes > s->map->len - off[k])
      return ECS_EPROTO;
  for (size_t k = 0; k < n; k++) {
    if (src[k]->nbytes)
      memcpy(s->map->base + off[k], src[k]->data, (size_t)src[k]->nbytes);
    st[k] = ECS_OK;
  }
  return ECS_OK;
}

/* ------------------------------------------------------------------ */
/* views                                                                */

static int view_one_server(ecs_client_t *c, size_t si, const ecs_key_t *keys, ecs_view_t *views,
                           const size_t *idx, size_t m, uint64_t deadline) {
  ecs_cli_srv_t *s = &c->srv[si];
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  if (s->path != ECS_PATH_SHM) {
    for (size_t j = 0; j < m; j++)
      views[idx[j]].status = ECS_ENOTSUP;
    return ECS_OK;
  }
  ecs_hdr_t h;
  rc = ecs__cli_lease(c, s, keys, idx, m, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  uint64_t *drop = malloc((m ? m : 1) * sizeof *drop);
  if (!drop)
    return ecs__cli_fail(c, s, ECS_ENOMEM);
  size_t ndrop = 0;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  for (size_t j = 0; j < m; j++) {
    ecs_view_t *v = &views[idx[j]];
    ecs_lease_reply_t l;
    if (ecs_proto_lease_reply_read(&r, &l) != ECS_OK ||
        (l.status == ECS_OK && !lease_in_bounds(s->map, &l))) {
      /* the connection goes, and every pin of this batch with it */
      for (size_t k = 0; k < j; k++)
        if (views[idx[k]].status == ECS_OK) {
          s->map->views--;
          memset(&views[idx[k]], 0, sizeof(ecs_view_t));
          views[idx[k]].status = ECS_EPROTO;
        }
      free(drop);
      return ecs__cli_fail(c, s, ECS_EPROTO);
    }
    v->status = l.status;
    v->nbytes = l.nbytes;
    v->desc = l.desc;
    if (l.status != ECS_OK)
      continue;
    const uint8_t *p = s->map->base + l.off;
    if (l.codec != ECS_CODEC_NONE)
      v->status = ECS_ENOTSUP; /* a compressed object has no raw view */
    else if (c->cfg.verify_checksum && ecs_checksum(p, (size_t)l.nbytes) != l.checksum)
      v->status = ECS_ECHECKSUM;
    if (v->status != ECS_OK) {
      drop[ndrop++] = l.lease_id;
      v->nbytes = 0;
      continue;
    }
    v->data = p;
    v->lease_ = l.lease_id;
    v->map_ = s->map;
    v->srv_ = (uint32_t)si;
    s->map->views++;
  }
  ecs__cli_release(c, s, drop, ndrop, deadline);
  free(drop);
  return ECS_OK;
}

typedef struct view_arg {
  const ecs_key_t *keys;
  ecs_view_t *views;
} view_arg_t;

static int view_share(ecs_client_t *c, ecs_cli_srv_t *s, const size_t *idx, size_t m, void *arg,
                      uint64_t deadline) {
  view_arg_t *a = arg;
  return view_one_server(c, (size_t)(s - c->srv), a->keys, a->views, idx, m, deadline);
}

static void view_mark(void *arg, size_t i, int rc) {
  ((view_arg_t *)arg)->views[i].status = rc;
}

int ecs_get_view_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_view_t *views, size_t n) {
  if (!c || (n && (!keys || !views)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  int *skip = calloc(n ? n : 1, sizeof *skip);
  if (!skip)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    memset(&views[i], 0, sizeof views[i]);
    views[i].status = keys[i].data && ecs_key_check(keys[i].data, keys[i].len) == ECS_OK ? ECS_OK : ECS_EKEY;
    skip[i] = views[i].status != ECS_OK;
  }
  view_arg_t a = {keys, views};
  int ret = ecs__cli_each_share(c, keys, skip, n, ecs__cli_deadline(c), view_share, view_mark, &a);
  free(skip);
  return ret;
}

int ecs_view_release(ecs_client_t *c, ecs_view_t *views, size_t n) {
  if (!c || (n && !views))
    return ECS_EINVAL;
  uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids)
    return ECS_ENOMEM;
  uint64_t deadline = ecs__cli_deadline(c);
  for (size_t si = 0; si < c->nsrv; si++) {
    ecs_cli_srv_t *s = &c->srv[si];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      ecs_view_t *v = &views[i];
      if (v->status != ECS_OK || !v->map_ || v->srv_ != si)
        continue;
      ecs_shm_map_t *m = v->map_;
      if (m == s->map && s->fd >= 0)
        ids[k++] = v->lease_; /* pins of an older connection died with it */
      m->views--;
      ecs__shm_map_put(m);
      memset(v, 0, sizeof *v);
      v->status = ECS_ENOTFOUND;
    }
    if (k)
      ecs__cli_release(c, s, ids, k, deadline);
  }
  free(ids);
  return ECS_OK;
}

const char *ecs_client_transport(const ecs_client_t *c) {
  size_t n[3] = {0, 0, 0};
  for (size_t i = 0; i < c->nsrv; i++)
    n[c->srv[i].path]++;
  return n[ECS_PATH_TCP] == c->nsrv    ? "tcp"
         : n[ECS_PATH_SHM] == c->nsrv  ? "shm"
         : n[ECS_PATH_RDMA] == c->nsrv ? "rdma"
                                       : "mixed";
}
