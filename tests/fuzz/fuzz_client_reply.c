/*
 * Fuzz target: the client's reply decoding, i.e. what a hostile or broken
 * server can make the client do.
 *
 * Input:
 *   byte 0     which request the reply answers (low 4 bits, reply_kinds[]),
 *              bit 4: verify checksums, bit 5: an allocating get
 *   byte 1     m, the items the request asked for (0..16)
 *   m bytes    each item's buffer capacity / 16 (0: no buffer at all)
 *   then       the reply: a 32-byte header, meta_len bytes of records and
 *              the payload; for LEASE the rest of the input is the "pool"
 *              the leases point into (the shm path's mapping)
 *
 * Each reply goes through the client's own steps, in its order:
 * recv_reply and ecs__cli_call's checks (store/client/client_conn.c); for GET,
 * the real planning step ecs__tcp_plan_payloads (store/client/client_tcp.c), the
 * payload landing in the iovecs it planned, and ecs__cli_deliver (the
 * checksum, the copy or the lz4 / zstd decompression of bytes the server
 * chose); for LEASE, shm_get's bounds check and delivery (client_shm.c);
 * ecs__cli_read_statuses for status replies; the HELLO, STAT, RESERVE,
 * ATTACH and RDMA_CONNECT readers as their callers use them.
 *
 * Buffers are allocated at exactly their capacity, so a write past one is
 * an ASan report.  Invariants: the planned iovecs and the compressed
 * scratch add up to data_len and each iovec fits its buffer; a compressed
 * item is not empty and lies inside the scratch area; a delivered
 * item never claims more bytes than its buffer holds; decoded strings are
 * NUL-terminated inside their arrays; records re-encode to themselves.
 */
#include <string.h>

#include "ecstore/ecstore.h"
#include "store/client/client_priv.h"
#include "store/core/codec.h"
#include "store/core/proto.h"
#include "store/rdma/rdma.h"
#include "fuzz.h"

#define FUZZ_MAX_ITEMS 16
#define FUZZ_REQ_ID 1u
#define FUZZ_MAX_OBJECT (1u << 20) /* the client's max_object_size in this run */

static const uint8_t reply_kinds[16] = {
    ECS_OP_GET,    ECS_OP_GET,          ECS_OP_GET,    ECS_OP_LEASE,  ECS_OP_LEASE,  ECS_OP_HELLO,
    ECS_OP_STAT,   ECS_OP_PUT,          ECS_OP_EXISTS, ECS_OP_REMOVE, ECS_OP_COMMIT, ECS_OP_RESERVE,
    ECS_OP_ATTACH, ECS_OP_RDMA_CONNECT, ECS_OP_PING,   ECS_OP_GET,
};

/* The client as these steps see it: config, reply records. */
static ecs_client_t *fuzz_client(int verify) {
  ecs_client_t *c = calloc(1, sizeof *c);
  FUZZ_CHECK(c != NULL);
  ecs_client_config_init(&c->cfg);
  c->cfg.verify_checksum = verify;
  c->cfg.max_object_size = FUZZ_MAX_OBJECT;
  ecs_wbuf_init(&c->w);
  return c;
}

static void free_client(ecs_client_t *c) {
  free(c->rmeta);
  ecs_wbuf_free(&c->w);
  free(c);
}

/* GET over the socket: tcp_get after ecs__cli_call. */
static void get_reply(ecs_client_t *c, const ecs_hdr_t *h, fuzz_in_t *in, ecs_get_buf_t *bufs, size_t m,
                      int alloc) {
  size_t idx[FUZZ_MAX_ITEMS], iov_item[FUZZ_MAX_ITEMS];
  struct iovec iov[FUZZ_MAX_ITEMS];
  ecs_cli_get_item_t items[FUZZ_MAX_ITEMS];
  uint64_t caps[FUZZ_MAX_ITEMS];
  for (size_t j = 0; j < m; j++) {
    idx[j] = m - 1 - j; /* the batch driver's indices need not be in order */
    caps[j] = bufs[j].capacity;
  }
  uint64_t ztotal = 0;
  int niov = ecs__tcp_plan_payloads(c, h, bufs, idx, m, alloc, items, iov, iov_item, &ztotal);
  if (niov < 0)
    return;
  FUZZ_CHECK((size_t)niov <= m);
  uint64_t sum = ztotal;
  for (int i = 0; i < niov; i++) {
    size_t j = iov_item[i];
    ecs_get_buf_t *b = &bufs[idx[j]];
    FUZZ_CHECK(j < m && items[j].rep.status == ECS_OK && items[j].rep.codec == ECS_CODEC_NONE);
    FUZZ_CHECK(iov[i].iov_base == b->data && iov[i].iov_len == items[j].rep.nbytes);
    FUZZ_CHECK(iov[i].iov_len <= (alloc ? FUZZ_MAX_OBJECT : caps[idx[j]]));
    FUZZ_CHECK(iov[i].iov_len <= b->capacity);
    sum += iov[i].iov_len;
  }
  FUZZ_CHECK(sum == h->data_len);  /* planned bytes are the reply's payload, no more, no less */
  for (size_t j = 0; j < m; j++) { /* compressed items: inside the scratch area, never empty */
    const ecs_cli_get_item_t *it = &items[j];
    if (bufs[idx[j]].status == ECS_OK && it->rep.codec != ECS_CODEC_NONE)
      FUZZ_CHECK(it->rep.nbytes > 0 && it->zoff < ztotal && it->rep.nbytes <= ztotal - it->zoff);
  }
  const uint8_t *payload = fuzz_take(in, (size_t)h->data_len);
  if (!payload)
    return; /* the connection would break or time out mid-payload */
  /* the iovecs in reply order, raw items into their buffers and compressed
   * ones into the scratch area, then the bytes land (recv_payloads) */
  uint8_t *scratch = ztotal ? malloc((size_t)ztotal) : NULL;
  FUZZ_CHECK(!ztotal || scratch);
  const uint8_t *p = payload;
  for (size_t j = 0; j < m; j++) {
    const ecs_get_reply_t *rep = &items[j].rep;
    ecs_get_buf_t *b = &bufs[idx[j]];
    if (rep->status != ECS_OK || rep->nbytes == 0)
      continue;
    uint8_t *dst = rep->codec != ECS_CODEC_NONE ? scratch + items[j].zoff : b->data;
    memcpy(dst, p, (size_t)rep->nbytes);
    p += rep->nbytes;
    if (rep->codec == ECS_CODEC_NONE && c->cfg.verify_checksum && b->status == ECS_OK &&
        ecs_checksum(dst, (size_t)rep->nbytes) != rep->checksum) {
      b->status = ECS_ECHECKSUM;
      b->nbytes = 0;
    }
  }
  for (size_t j = 0; j < m; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    const ecs_get_reply_t *rep = &items[j].rep;
    if (b->status != ECS_OK)
      continue;
    if (rep->codec != ECS_CODEC_NONE)
      b->status = ecs__cli_deliver(c, b, scratch + items[j].zoff, rep->codec, rep->nbytes, rep->raw_nbytes,
                                   rep->checksum, alloc);
    if (b->status == ECS_OK) {
      FUZZ_CHECK(b->nbytes <= b->capacity);
      FUZZ_CHECK(b->nbytes == rep->raw_nbytes);
      FUZZ_CHECK(alloc || b->nbytes <= caps[idx[j]]);
    }
  }
  free(scratch);
}

/* LEASE on the shm path: shm_get after ecs__cli_lease; pool is the mapping. */
static void lease_reply(ecs_client_t *c, const ecs_hdr_t *h, const uint8_t *pool, size_t pool_len,
                        ecs_get_buf_t *bufs, size_t m, int alloc) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  for (size_t j = 0; j < m; j++) {
    ecs_get_buf_t *b = &bufs[j];
    uint64_t cap = b->capacity;
    ecs_lease_reply_t l;
    int rc = ecs_proto_lease_reply_read(&r, &l);
    if (rc != ECS_OK || (l.status == ECS_OK && !(l.off <= pool_len && l.nbytes <= pool_len - l.off)))
      return; /* EPROTO: the batch fails, the connection is dropped */
    FUZZ_CHECK(l.desc.ndim <= ECS_MAX_DIMS);
    if (l.status == ECS_OK) {
      uint64_t size;
      FUZZ_CHECK(ecs_tensor_nbytes(&l.desc, &size) == ECS_OK && size == l.raw_nbytes);
      FUZZ_CHECK(l.codec != ECS_CODEC_NONE || l.nbytes == l.raw_nbytes);
    }
    b->status = l.status;
    b->nbytes = l.nbytes;
    b->desc = l.desc;
    if (l.status != ECS_OK)
      continue;
    if (l.codec == ECS_CODEC_NONE && !alloc && l.nbytes <= b->capacity && (b->data || !l.nbytes)) {
      if (l.nbytes)
        memcpy(b->data, pool + l.off, (size_t)l.nbytes);
      continue;
    }
    b->status = ecs__cli_deliver(c, b, pool + l.off, l.codec, l.nbytes, l.raw_nbytes, l.checksum, alloc);
    if (b->status == ECS_OK)
      FUZZ_CHECK(b->nbytes == l.raw_nbytes && b->nbytes <= b->capacity && (alloc || b->nbytes <= cap));
  }
}

static void hello_reply(const ecs_client_t *c, const ecs_hdr_t *h) {
  ecs_rbuf_t r;
  ecs_hello_reply_t hr, back;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  if (ecs_proto_hello_reply_read(&r, &hr) != ECS_OK)
    return;
  FUZZ_CHECK(memchr(hr.node_id, '\0', sizeof hr.node_id) != NULL);
  FUZZ_CHECK(memchr(hr.shm_path, '\0', sizeof hr.shm_path) != NULL);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_hello_reply_write(&w, &hr);
  ecs_rbuf_init(&r, w.p, w.len);
  FUZZ_CHECK(ecs_proto_hello_reply_read(&r, &back) == ECS_OK && r.pos == w.len);
  FUZZ_CHECK(strcmp(back.node_id, hr.node_id) == 0 && strcmp(back.shm_path, hr.shm_path) == 0 &&
             back.epoch == hr.epoch && back.pool_size == hr.pool_size && back.max_items == hr.max_items &&
             back.max_data == hr.max_data);
  ecs_wbuf_free(&w);
}

static void stat_reply(const ecs_client_t *c, const ecs_hdr_t *h) {
  ecs_rbuf_t r;
  ecs_stat_reply_t st, back;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  if (ecs_proto_stat_read(&r, &st) != ECS_OK)
    return;
  FUZZ_CHECK(r.pos == sizeof st); /* sixteen u64 counters */
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_stat_write(&w, &st);
  FUZZ_CHECK(w.len == r.pos && memcmp(w.p, c->rmeta, w.len) == 0);
  ecs_rbuf_init(&r, w.p, w.len);
  FUZZ_CHECK(ecs_proto_stat_read(&r, &back) == ECS_OK && memcmp(&back, &st, sizeof st) == 0);
  ecs_wbuf_free(&w);
}

static void reserve_reply(const ecs_client_t *c, const ecs_hdr_t *h, size_t m) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  for (size_t j = 0; j < m; j++) {
    ecs_reserve_reply_t rr;
    if (ecs_proto_reserve_reply_read(&r, &rr) != ECS_OK)
      return;
    FUZZ_CHECK(r.pos == (j + 1) * 24);
  }
}

/* ATTACH is read apart from ecs__cli_call (its reply carries the pool fd):
 * client_shm.c attach(). */
static void attach_reply(fuzz_in_t *in) {
  const uint8_t *hb = fuzz_take(in, ECS_PROTO_HDR_SIZE);
  if (!hb)
    return;
  ecs_hdr_t h;
  int rc = ecs_proto_hdr_decode(hb, 0, &h);
  uint8_t meta[64];
  if (rc == ECS_OK && (!(h.flags & ECS_FLAG_REPLY) || h.opcode != ECS_OP_ATTACH || h.req_id != FUZZ_REQ_ID ||
                       h.meta_len > sizeof meta))
    rc = ECS_EPROTO;
  if (rc != ECS_OK)
    return;
  FUZZ_CHECK(h.data_len == 0 && h.meta_len <= sizeof meta);
  const uint8_t *mp = fuzz_take(in, h.meta_len);
  if (!mp || h.status != ECS_OK)
    return;
  memcpy(meta, mp, h.meta_len);
  ecs_rbuf_t r;
  ecs_attach_reply_t ar;
  ecs_rbuf_init(&r, meta, h.meta_len);
  if (ecs_proto_attach_reply_read(&r, &ar) == ECS_OK)
    FUZZ_CHECK(r.pos == 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in_t in = {data, size, 0};
  uint8_t sel = fuzz_u8(&in);
  uint8_t op = reply_kinds[sel & 15];
  int verify = (sel >> 4) & 1, alloc = (sel >> 5) & 1;
  size_t m = fuzz_u8(&in) % (FUZZ_MAX_ITEMS + 1);
  ecs_get_buf_t bufs[FUZZ_MAX_ITEMS];
  memset(bufs, 0, sizeof bufs);
  for (size_t j = 0; j < m; j++) {
    size_t cap = (size_t)fuzz_u8(&in) * 16;
    if (!alloc && cap) {
      bufs[j].data = malloc(cap); /* exactly its capacity: ASan sees a write past it */
      FUZZ_CHECK(bufs[j].data != NULL);
      bufs[j].capacity = cap;
    }
  }
  if (op == ECS_OP_ATTACH) {
    attach_reply(&in);
    goto out;
  }
  ecs_client_t *c = fuzz_client(verify);
  /* recv_reply: the header, then exactly meta_len bytes of records */
  const uint8_t *hb = fuzz_take(&in, ECS_PROTO_HDR_SIZE);
  ecs_hdr_t h;
  if (!hb || ecs_proto_hdr_decode(hb, UINT64_MAX, &h) != ECS_OK || !(h.flags & ECS_FLAG_REPLY) ||
      h.opcode != op || h.req_id != FUZZ_REQ_ID)
    goto done;
  const uint8_t *meta = fuzz_take(&in, h.meta_len);
  if (!meta)
    goto done;
  c->rmeta = malloc(h.meta_len ? h.meta_len : 1); /* exactly meta_len: a read past it is seen */
  FUZZ_CHECK(c->rmeta != NULL);
  memcpy(c->rmeta, meta, h.meta_len);
  c->rmeta_cap = h.meta_len;
  /* ecs__cli_call: the reply's status, its count, whether it may carry data */
  unsigned check = op == ECS_OP_GET     ? ECS_CALL_COUNT | ECS_CALL_PAYLOAD
                   : op == ECS_OP_HELLO ? ECS_CALL_PAYLOAD
                   : op == ECS_OP_STAT || op == ECS_OP_PING || op == ECS_OP_RDMA_CONNECT ? 0
                                                                                         : ECS_CALL_COUNT;
  if (h.status != ECS_OK || ((check & ECS_CALL_COUNT) && h.count != m) ||
      (!(check & ECS_CALL_PAYLOAD) && h.data_len))
    goto done;
  switch (op) {
  case ECS_OP_GET: get_reply(c, &h, &in, bufs, m, alloc); break;
  case ECS_OP_LEASE: lease_reply(c, &h, in.p + in.pos, in.len - in.pos, bufs, m, alloc); break;
  case ECS_OP_HELLO: hello_reply(c, &h); break;
  case ECS_OP_STAT: stat_reply(c, &h); break;
  case ECS_OP_RESERVE: reserve_reply(c, &h, m); break;
  case ECS_OP_PUT:
  case ECS_OP_EXISTS:
  case ECS_OP_REMOVE:
  case ECS_OP_COMMIT: {
    size_t idx[FUZZ_MAX_ITEMS];
    int st[FUZZ_MAX_ITEMS];
    for (size_t j = 0; j < m; j++)
      idx[j] = j;
    if (ecs__cli_read_statuses(c, &h, idx, m, st) == ECS_OK)
      FUZZ_CHECK(h.meta_len >= 4 * m);
    break;
  }
  case ECS_OP_RDMA_CONNECT: /* exchange(), then ecs_rdma_ep_connect's decode */
    if (h.meta_len == ECS_RDMA_BLOB_SIZE) {
      ecs_rdma_blob b;
      if (ecs_rdma_blob_decode(c->rmeta, h.meta_len, &b) == ECS_OK) {
        uint8_t out[ECS_RDMA_BLOB_SIZE];
        FUZZ_CHECK(ecs_rdma_blob_encode(&b, out) == ECS_OK);
        FUZZ_CHECK(!b.has_region || (b.region_len != 0 && b.region_addr + b.region_len >= b.region_addr));
      }
    }
    break;
  default: break;
  }
done:
  free_client(c);
out:
  for (size_t j = 0; j < m; j++)
    free(bufs[j].data);
  return 0;
}
