/*
 * The client's socket data path: the bytes travel in the request and the
 * reply themselves.  Used over TCP, and for the puts of a read-only shm
 * mapping over its Unix socket.
 *
 * put:  one PUT request per run of items of about PUT_PIPE_BYTES (never
 *       over the server's max_data), each item compressed first when the
 *       handle asks for a codec; up to PUT_PIPE_DEPTH requests in flight
 *       before the oldest reply is read, so that the server's wait for its
 *       Redis records overlaps the sending of the next requests.
 * get:  the header and the item records first, then the payload with one
 *       readv whose iovecs point straight into the caller's buffers, so no
 *       payload byte is copied in user space; raw items are checksummed
 *       slice by slice as they land.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/core/checksum.h"
#include "store/client/client_priv.h"
#include "store/core/codec.h"

/* ------------------------------------------------------------------ */
/* put                                                                  */

/* A put batch is cut into requests of about this many payload bytes... */
#define PUT_PIPE_BYTES (512u << 10)
/* ...and this many are sent before the oldest reply is read.  A server
 * answers a PUT once Redis acknowledged its records; it reads and runs the
 * requests behind it meanwhile (at most 8 parked per connection) and
 * replies in order, so the round trips overlap.  The replies are a few
 * bytes each: the socket buffers hold them while we send, so sending
 * ahead cannot deadlock (an older server, which reads one request at a
 * time, simply leaves the next ones in the socket buffer). */
#define PUT_PIPE_DEPTH 4

/* Compresses one tensor for the wire with the handle's codec.  Returns a
 * malloc'd buffer of *len bytes and sets *codec, or NULL when the bytes go
 * raw (small, incompressible, auto said no, or any codec error: raw is
 * always a correct fallback). */
static void *compress_item(int codec, const ecs_tensor_t *t, size_t *len, uint8_t *used) {
  if (t->nbytes < 4096)
    return NULL; /* not worth a codec frame */
  int req = codec;
  if (codec & ECS_CODEC_AUTO) {
    int ch = ecs_codec_choose(codec, t->desc.dtype, t->data, (size_t)t->nbytes, 0);
    if (ch <= 0)
      return NULL;
    req = ch;
  }
  size_t cap = ecs_codec_bound(req, (size_t)t->nbytes);
  void *buf = cap ? malloc(cap) : NULL;
  size_t out = 0;
  uint8_t u = ECS_CODEC_NONE;
  if (!buf ||
      ecs_codec_compress(req, t->desc.dtype, t->data, (size_t)t->nbytes, buf, cap, &out, &u, 0) != ECS_OK ||
      u == ECS_CODEC_NONE || out >= t->nbytes) {
    free(buf);
    return NULL;
  }
  *len = out;
  *used = u;
  return buf;
}

/* Sends one PUT request for items idx[0..m), whose payload the caller
 * keeps within s->max_data unless m is 1: a single item that is still
 * over it after compression gets ECS_ETOOBIG alone, unsent (*sent 0).
 * *id is the request's id, for put_recv. */
static int put_send(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                    const size_t *idx, size_t m, int *status, uint32_t *id, int *sent, uint64_t deadline) {
  *sent = 0;
  /* calloc: gcc, once it inlines ecs__cli_send (as hidden visibility
   * lets it), cannot see that only the nd entries written are read */
  struct iovec *data = calloc(m ? m : 1, sizeof *data);
  void **zbuf = calloc(m ? m : 1, sizeof *zbuf);
  if (!data || !zbuf) {
    free(data);
    free(zbuf);
    return ECS_ENOMEM;
  }
  ecs_wbuf_reset(&c->w);
  uint64_t total = 0;
  int nd = 0;
  for (size_t j = 0; j < m; j++) {
    const ecs_tensor_t *t = &ts[idx[j]];
    const void *stored = t->data;
    size_t slen = (size_t)t->nbytes;
    uint8_t codec = ECS_CODEC_NONE;
    if (c->codec != ECS_CODEC_NONE)
      zbuf[j] = compress_item(c->codec, t, &slen, &codec);
    if (zbuf[j])
      stored = zbuf[j];
    ecs_put_item_t it = {.key = keys[idx[j]].data,
                         .key_len = (uint16_t)keys[idx[j]].len,
                         .codec = codec,
                         .flags = (uint8_t)(c->put_flags | c->sticky_put_flags),
                         .pin_ttl = c->sticky_pin_ttl,
                         .desc = t->desc,
                         .nbytes = slen,
                         .raw_nbytes = t->nbytes,
                         .checksum = ecs_checksum(stored, slen)};
    ecs_proto_put_item_write(&c->w, &it);
    if (slen) {
      data[nd].iov_base = (void *)stored;
      data[nd].iov_len = slen;
      nd++;
    }
    total += slen;
  }
  int rc = ECS_OK;
  if (total > s->max_data) { /* m is 1 here (ecs__tcp_put) */
    for (size_t j = 0; j < m; j++)
      status[idx[j]] = ECS_ETOOBIG;
  } else {
    rc = ecs__cli_send(c, s, ECS_OP_PUT, 0, (uint32_t)m, data, nd, total, id, deadline);
    *sent = rc == ECS_OK;
  }
  free(data);
  for (size_t j = 0; j < m; j++)
    free(zbuf[j]);
  free(zbuf);
  return rc;
}

/* Reads the reply of the PUT sent as id for items idx[0..m). */
static int put_recv(ecs_client_t *c, ecs_cli_srv_t *s, const size_t *idx, size_t m, int *status, uint32_t id,
                    uint64_t deadline) {
  ecs_hdr_t h;
  int rc = ecs__cli_reply(c, s, ECS_OP_PUT, id, (uint32_t)m, ECS_CALL_COUNT, "put", &h, deadline);
  if (rc == ECS_OK)
    rc = ecs__cli_read_statuses(c, &h, idx, m, status);
  return rc;
}

/* A PUT in flight: its items idx[lo..hi) and its request id. */
typedef struct put_flight {
  size_t lo, hi;
  uint32_t id;
} put_flight_t;

/* Over the socket a request carries at most the server's max_data payload
 * bytes, so the items are sent in runs that fit (a compressed item is never
 * larger than its raw bytes): an item too big for any request fails alone
 * with ECS_ETOOBIG and never takes its neighbours with it.  The runs are
 * pipelined (PUT_PIPE_DEPTH in flight); a failure drops the connection,
 * whose stream position is then unknown, as for any call. */
int ecs__tcp_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                 const size_t *idx, size_t m, int *status, uint64_t deadline) {
  put_flight_t fl[PUT_PIPE_DEPTH];
  unsigned head = 0, nfl = 0;
  uint64_t run = s->max_data < PUT_PIPE_BYTES ? s->max_data : PUT_PIPE_BYTES;
  int rc = ECS_OK;
  for (size_t lo = 0; lo < m || nfl > 0;) {
    if (lo < m && nfl < PUT_PIPE_DEPTH) {
      size_t hi = lo + 1;
      uint64_t sum = ts[idx[lo]].nbytes;
      while (sum < run && hi < m && ts[idx[hi]].nbytes <= s->max_data - sum) {
        sum += ts[idx[hi]].nbytes;
        hi++;
      }
      put_flight_t *f = &fl[(head + nfl) % PUT_PIPE_DEPTH];
      int sent = 0;
      rc = put_send(c, s, keys, ts, idx + lo, hi - lo, status, &f->id, &sent, deadline);
      if (rc)
        break;
      if (sent) {
        f->lo = lo;
        f->hi = hi;
        nfl++;
      }
      lo = hi;
      continue;
    }
    put_flight_t *f = &fl[head];
    rc = put_recv(c, s, idx + f->lo, f->hi - f->lo, status, f->id, deadline);
    if (rc)
      break;
    head = (head + 1) % PUT_PIPE_DEPTH;
    nfl--;
  }
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
}

/* ------------------------------------------------------------------ */
/* get                                                                  */

/* One item of a get's reply (client_priv.h). */
typedef ecs_cli_get_item_t get_item_t;

/* Reads a get's payloads into iov[0..niov) (whole items in reply order;
 * iov_item[i] is the reply index of iov[i]) in slices of about
 * ECS_SUM_SLICE bytes, and checksums each raw item's bytes right after
 * each slice lands, while they are still in cache: one trip through
 * memory instead of two, and the hashing overlaps the server's sending.
 * A mismatch marks the item ECS_ECHECKSUM.  Compressed items are checked
 * later, by ecs__cli_deliver; empty ones, which have no iovec, by the
 * caller. */
static int recv_payloads(ecs_client_t *c, ecs_cli_srv_t *s, const struct iovec *iov, int niov,
                         const size_t *iov_item, const get_item_t *items, ecs_get_buf_t *bufs,
                         const size_t *idx, uint64_t deadline) {
  struct iovec v[ECS_CLI_IOV_CHUNK];
  int vi[ECS_CLI_IOV_CHUNK];    /* which iov each slice piece is from */
  size_t vo[ECS_CLI_IOV_CHUNK]; /* at what offset in it */
  size_t vl[ECS_CLI_IOV_CHUNK]; /* how many bytes (readv_all consumes v) */
  ecs_sum_t *sum = NULL;        /* for an item that spans slices */
  int rc = ECS_OK, i = 0;
  size_t off = 0;
  while (rc == ECS_OK && i < niov) {
    int k = 0;
    size_t slice_bytes = 0;
    while (i < niov && k < ECS_CLI_IOV_CHUNK && slice_bytes < ECS_SUM_SLICE) {
      size_t take = iov[i].iov_len - off;
      if (take > ECS_SUM_SLICE - slice_bytes)
        take = ECS_SUM_SLICE - slice_bytes;
      v[k].iov_base = (uint8_t *)iov[i].iov_base + off;
      v[k].iov_len = take;
      vi[k] = i;
      vo[k] = off;
      vl[k] = take;
      k++;
      slice_bytes += take;
      off += take;
      if (off == iov[i].iov_len) {
        i++;
        off = 0;
      }
    }
    rc = ecs_net_readv_all(s->fd, v, k, deadline);
    if (rc != ECS_OK || !c->cfg.verify_checksum)
      continue;
    for (int q = 0; q < k; q++) {
      size_t j = iov_item[vi[q]];
      if (items[j].rep.codec != ECS_CODEC_NONE)
        continue;
      const uint8_t *p = (const uint8_t *)iov[vi[q]].iov_base + vo[q];
      int first = vo[q] == 0, last = vo[q] + vl[q] == iov[vi[q]].iov_len;
      uint64_t got_sum;
      if (first && last) {
        got_sum = ecs_checksum(p, vl[q]);
      } else if (sum || (sum = ecs_sum_new()) != NULL) {
        if (first)
          ecs_sum_reset(sum);
        ecs_sum_update(sum, p, vl[q]);
        if (!last)
          continue;
        got_sum = ecs_sum_digest(sum);
      } else if (last) { /* no memory for a state: hash the whole item now */
        got_sum = ecs_checksum(iov[vi[q]].iov_base, iov[vi[q]].iov_len);
      } else {
        continue;
      }
      if (got_sum != items[j].rep.checksum) {
        bufs[idx[j]].status = ECS_ECHECKSUM;
        bufs[idx[j]].nbytes = 0;
      }
    }
  }
  ecs_sum_free(sum);
  return rc;
}

/* What a GET item asks the server for at most, and so the most the client
 * accepts in the reply: the caller's capacity (0 without a buffer), or for
 * an allocating get the configured max_object_size, never unbounded. */
static uint64_t asked_capacity(const ecs_client_t *c, const ecs_get_buf_t *b, int alloc) {
  return alloc ? c->cfg.max_object_size : (b->data ? b->capacity : 0);
}

/* Reads the reply's records into items[] and sets each buffer's status;
 * points iov[] at where each raw payload goes (allocating it with alloc)
 * and places compressed ones in a scratch area of *ztotal bytes.  Returns
 * the number of iovecs, or a negative error. */
static int plan_payloads(ecs_client_t *c, const ecs_hdr_t *h, ecs_get_buf_t *bufs, const size_t *idx,
                         size_t m, int alloc, get_item_t *items, struct iovec *iov, size_t *iov_item,
                         uint64_t *ztotal) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  int niov = 0;
  uint64_t total = 0;
  *ztotal = 0;
  for (size_t j = 0; j < m; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    ecs_get_reply_t *rep = &items[j].rep;
    if (ecs_proto_get_reply_read(&r, rep) != ECS_OK)
      return ECS_EPROTO;
    b->status = rep->status;
    b->nbytes = rep->status == ECS_EBUFSMALL ? rep->raw_nbytes : rep->nbytes;
    b->desc = rep->desc;
    if (rep->status != ECS_OK)
      continue;
    /* Every size here is the server's word: each is bounded before it is
     * added, allocated or read into, so a hostile server cannot wrap the
     * sums (2^64-8 + 24 = 16) into a small buffer and write past it.  The
     * request said how much each item may take (the caller's capacity, or
     * max_object_size for an allocating get); data_len bounds the sum. */
    uint64_t cap = asked_capacity(c, b, alloc);
    if (rep->nbytes > cap || rep->nbytes > h->data_len - total)
      return ECS_EPROTO; /* more than we asked for, or than the reply holds */
    total += rep->nbytes;
    if (rep->codec != ECS_CODEC_NONE) {
      if (!ecs_codec_frame_ok(rep->codec, rep->nbytes, rep->raw_nbytes)) /* before any size is used */
        return ECS_EPROTO;
      if (alloc && rep->raw_nbytes > cap) {
        /* its compressed bytes fit but the tensor does not: drained into
         * the scratch buffer, never decoded */
        b->status = ECS_EBUFSMALL;
        b->nbytes = rep->raw_nbytes;
      }
      items[j].zoff = *ztotal;
      *ztotal += rep->nbytes; /* <= total <= data_len: cannot wrap */
      continue;
    }
    if (alloc) {
      free(b->data); /* a retry's first attempt may have allocated it */
      b->data = malloc(rep->nbytes ? (size_t)rep->nbytes : 1);
      if (!b->data)
        return ECS_ENOMEM;
      b->capacity = rep->nbytes;
    }
    if (rep->nbytes) {
      iov[niov].iov_base = b->data;
      iov[niov].iov_len = (size_t)rep->nbytes;
      iov_item[niov] = j;
      niov++;
    }
  }
  if (total != h->data_len)
    return ECS_EPROTO;
  return niov;
}

int ecs__tcp_plan_payloads(ecs_client_t *c, const ecs_hdr_t *h, ecs_get_buf_t *bufs, const size_t *idx,
                           size_t m, int alloc, ecs_cli_get_item_t *items, struct iovec *iov,
                           size_t *iov_item, uint64_t *ztotal) {
  return plan_payloads(c, h, bufs, idx, m, alloc, items, iov, iov_item, ztotal);
}

static int tcp_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                   const size_t *idx, size_t m, int alloc, uint64_t deadline) {
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++) {
    ecs_get_item_t it = {.key = keys[idx[j]].data,
                         .key_len = (uint16_t)keys[idx[j]].len,
                         .capacity = asked_capacity(c, &bufs[idx[j]], alloc)};
    ecs_proto_get_item_write(&c->w, &it);
  }
  ecs_hdr_t h;
  int rc = ecs__cli_call(c, s, ECS_OP_GET, (uint32_t)m, NULL, 0, 0, ECS_CALL_COUNT | ECS_CALL_PAYLOAD, "get",
                         &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  /* Records first: they say where each payload goes.  Raw payloads are
   * read straight into the caller's buffers; compressed ones into one
   * scratch buffer, then decompressed into the caller's. */
  /* calloc: gcc cannot see that plan_payloads fills what is read */
  struct iovec *iov = calloc(m ? m : 1, sizeof *iov);
  size_t *iov_item = calloc(m ? m : 1, sizeof *iov_item); /* iov index -> item index */
  get_item_t *items = malloc((m ? m : 1) * sizeof *items);
  uint8_t *scratch = NULL;
  uint64_t ztotal = 0;
  int niov = 0;
  if (!iov || !iov_item || !items)
    rc = ECS_ENOMEM;
  if (rc == ECS_OK) {
    niov = plan_payloads(c, &h, bufs, idx, m, alloc, items, iov, iov_item, &ztotal);
    if (niov < 0)
      rc = niov;
  }
  if (rc == ECS_OK && ztotal) {
    scratch = malloc((size_t)ztotal);
    if (!scratch)
      rc = ECS_ENOMEM;
  }
  /* the iovecs in reply order: raw items into their buffers, compressed
   * ones into the scratch buffer */
  if (rc == ECS_OK && ztotal) {
    niov = 0;
    for (size_t j = 0; j < m; j++) {
      const ecs_get_reply_t *rep = &items[j].rep;
      if (rep->status != ECS_OK || rep->nbytes == 0)
        continue;
      iov[niov].iov_base = rep->codec != ECS_CODEC_NONE ? scratch + items[j].zoff : bufs[idx[j]].data;
      iov[niov].iov_len = (size_t)rep->nbytes;
      iov_item[niov] = j;
      niov++;
    }
  }
  if (rc == ECS_OK)
    rc = recv_payloads(c, s, iov, niov, iov_item, items, bufs, idx, deadline);
  for (size_t j = 0; rc == ECS_OK && j < m; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    const ecs_get_reply_t *rep = &items[j].rep;
    if (b->status != ECS_OK)
      continue;
    if (rep->codec != ECS_CODEC_NONE)
      b->status = ecs__cli_deliver(c, b, scratch + items[j].zoff, rep->codec, rep->nbytes, rep->raw_nbytes,
                                   rep->checksum, alloc);
    else if (rep->nbytes == 0 && c->cfg.verify_checksum && ecs_checksum(NULL, 0) != rep->checksum)
      b->status = ECS_ECHECKSUM; /* an empty item had no iovec to check */
    if (b->status == ECS_ECHECKSUM || b->status == ECS_ECODEC)
      b->nbytes = 0;
  }
  free(iov);
  free(iov_item);
  free(items);
  free(scratch);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
}

/* Views need the pool mapped: none over a socket (view NULL). */
const ecs_cli_ops_t ecs__cli_tcp_ops = {
    .name = "tcp",
    .upgrade = NULL,
    .put = ecs__tcp_put,
    .get = tcp_get,
    .view = NULL,
    .drop = NULL,
};
