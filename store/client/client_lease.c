/*
 * What the shm and RDMA paths share: both move bytes in place, outside the
 * socket, so both ask the server first where the bytes lie.
 *
 * get:  LEASE pins the objects and says where each lies in the pool; the
 *       path moves the bytes; a one-way RELEASE unpins them.
 * put:  RESERVE allocates blocks; the path's writer moves the bytes into
 *       them; COMMIT has the server verify the checksums, then index and
 *       publish the objects (an item the writer could not move is
 *       committed with abort).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "store/core/checksum.h"
#include "store/client/client_priv.h"

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
  return ecs__cli_call(c, s, ECS_OP_LEASE, (uint32_t)m, NULL, 0, 0, ECS_CALL_COUNT, NULL, h, deadline);
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

static int same_tensor(const ecs_tensor_t *a, uint64_t asum, const ecs_tensor_t *b, uint64_t bsum) {
  if (a->nbytes != b->nbytes || asum != bsum || a->desc.dtype != b->desc.dtype ||
      a->desc.ndim != b->desc.ndim)
    return 0;
  for (unsigned d = 0; d < a->desc.ndim; d++)
    if (a->desc.shape[d] != b->desc.shape[d])
      return 0;
  return 1;
}

/* RESERVE for items idx[0..m) (unique keys): fills w[] with the items the
 * server wants written (*nw of them) and sets every item's status. */
static int reserve(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                   const size_t *idx, size_t m, int *status, ecs_cli_wr_t *w, size_t *nw, uint64_t deadline) {
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++) {
    const ecs_tensor_t *t = &ts[idx[j]];
    w[j].sum = ecs_checksum(t->data, (size_t)t->nbytes);
    ecs_put_item_t it = {.key = keys[idx[j]].data,
                         .key_len = (uint16_t)keys[idx[j]].len,
                         .codec = ECS_CODEC_NONE,
                         .flags = (uint8_t)(c->put_flags | c->sticky_put_flags),
                         .pin_ttl = c->sticky_pin_ttl,
                         .desc = t->desc,
                         .nbytes = t->nbytes,
                         .raw_nbytes = t->nbytes,
                         .checksum = w[j].sum};
    ecs_proto_put_item_write(&c->w, &it);
  }
  ecs_hdr_t h;
  int rc = ecs__cli_call(c, s, ECS_OP_RESERVE, (uint32_t)m, NULL, 0, 0, ECS_CALL_COUNT, NULL, &h, deadline);
  if (rc)
    return rc;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  size_t n = 0;
  for (size_t j = 0; j < m; j++) {
    ecs_reserve_reply_t rr;
    if (ecs_proto_reserve_reply_read(&r, &rr) != ECS_OK)
      return ECS_EPROTO;
    status[idx[j]] = rr.status;
    if (rr.status != ECS_OK || rr.resv_id == 0)
      continue; /* an error, or already stored with this content */
    /* n <= j: the entry moves down over one already read */
    w[n] = (ecs_cli_wr_t){.src = &ts[idx[j]],
                          .off = rr.off,
                          .resv_id = rr.resv_id,
                          .rkey = rr.rkey,
                          .sum = w[j].sum,
                          .item = idx[j]};
    n++;
  }
  *nw = n;
  return ECS_OK;
}

/* The bytes of a put in place are moved and committed in runs of about
 * COMMIT_RUN_BYTES, up to COMMIT_DEPTH COMMITs in flight: the server
 * hashes, indexes and publishes one run (and waits for its Redis records)
 * while this side moves the next, where one COMMIT after the last byte
 * left the two sides taking turns. */
#define COMMIT_RUN_BYTES (512u << 10)
#define COMMIT_DEPTH 4

/* Sends the COMMIT that settles reservations w[0..n): an item whose bytes
 * the writer could not move is aborted and keeps the writer's status. */
static int commit_send(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_cli_wr_t *w, size_t n, uint32_t *id,
                       uint64_t deadline) {
  ecs_wbuf_reset(&c->w);
  for (size_t k = 0; k < n; k++) {
    ecs_commit_item_t ci = {.resv_id = w[k].resv_id, .checksum = w[k].sum, .abort = w[k].status != ECS_OK};
    ecs_proto_commit_item_write(&c->w, &ci);
  }
  return ecs__cli_send(c, s, ECS_OP_COMMIT, 0, (uint32_t)n, NULL, 0, 0, id, deadline);
}

/* Reads the reply of COMMIT id for w[0..n) into the items' statuses. */
static int commit_recv(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_cli_wr_t *w, size_t n, int *status,
                       uint32_t id, uint64_t deadline) {
  ecs_hdr_t h;
  int rc = ecs__cli_reply(c, s, ECS_OP_COMMIT, id, (uint32_t)n, ECS_CALL_COUNT, "commit", &h, deadline);
  if (rc)
    return rc;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  for (size_t k = 0; k < n && rc == ECS_OK; k++) {
    int32_t st;
    rc = ecs_proto_status_read(&r, &st);
    status[w[k].item] = w[k].status != ECS_OK ? w[k].status : st;
  }
  return rc;
}

/* A COMMIT in flight: reservations w[lo..hi) and its request id. */
typedef struct commit_flight {
  size_t lo, hi;
  uint32_t id;
} commit_flight_t;

/* Moves and commits reservations w[0..n) in pipelined runs. */
static int write_commit(ecs_client_t *c, ecs_cli_srv_t *s, ecs_cli_wr_t *w, size_t n, int *status,
                        uint64_t deadline, ecs_cli_writer_fn write) {
  commit_flight_t fl[COMMIT_DEPTH];
  unsigned head = 0, nfl = 0;
  int rc = ECS_OK;
  for (size_t lo = 0; rc == ECS_OK && (lo < n || nfl > 0);) {
    if (lo < n && nfl < COMMIT_DEPTH) {
      size_t hi = lo + 1;
      uint64_t bytes = w[lo].src->nbytes;
      while (hi < n && bytes < COMMIT_RUN_BYTES)
        bytes += w[hi++].src->nbytes;
      commit_flight_t *f = &fl[(head + nfl) % COMMIT_DEPTH];
      rc = write(c, s, w + lo, hi - lo, deadline);
      if (rc == ECS_OK)
        rc = commit_send(c, s, w + lo, hi - lo, &f->id, deadline);
      f->lo = lo;
      f->hi = hi;
      nfl++;
      lo = hi;
      continue;
    }
    commit_flight_t *f = &fl[head];
    rc = commit_recv(c, s, w + f->lo, f->hi - f->lo, status, f->id, deadline);
    head = (head + 1) % COMMIT_DEPTH;
    nfl--;
  }
  return rc;
}

/* RESERVE, then the bytes moved in place and committed, for keys that are
 * unique in the batch.  write() moves the bytes (memcpy into the shared
 * map, or RDMA WRITEs). */
static int put_unique(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                      const size_t *idx, size_t m, int *status, uint64_t deadline, ecs_cli_writer_fn write) {
  ecs_cli_wr_t *w = calloc(m ? m : 1, sizeof *w);
  if (!w)
    return ECS_ENOMEM;
  size_t nw = 0;
  int rc = reserve(c, s, keys, ts, idx, m, status, w, &nw, deadline);
  if (rc == ECS_OK && nw > 0)
    rc = write_commit(c, s, w, nw, status, deadline, write);
  free(w);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK; /* a dropped connection aborts the reservations */
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
   * stored object as a tcp put would.  The four arrays are one round's
   * lists of positions, not per-item fields. */
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
