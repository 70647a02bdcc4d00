/*
 * Fuzz target: the server's request decoding.
 *
 * Input: one byte of connection state (bit 0: already authenticated, bit 1:
 * a local Unix-socket peer, bit 2: --enable-debug-ops, bit 3: RDMA on),
 * then the bytes a peer sends on one connection: frames of a 32-byte
 * header, meta_len bytes of records and data_len bytes of payload.
 *
 * Each frame goes through the decode sequence of the server, in its order
 * (store/server/server_conn.c conn_on_readable, then ecs__server_dispatch and the
 * handlers of store/server/server_ops.c): the header and its limits, the rule
 * before HELLO, the opcode table's flags, then each handler's record loop
 * with the same proto.c readers and the same "records fill the meta
 * section" check.  Where the server would close the connection the run
 * ends; where it answers an item or a whole request with an error it goes
 * on.  The object store itself is not involved: this is the parsing a
 * peer controls.
 *
 * Invariants: a header re-encodes to its own bytes; every key and string
 * points inside the records; a record that decodes re-encodes and decodes
 * to the same fields; an item that decodes OK has a shape whose size is
 * its raw size; PUT's payload sizes add up to data_len without wrapping.
 */
#include <string.h>

#include "ecstore/error.h"
#include "ecstore/tensor.h"
#include "store/core/proto.h"
#include "store/rdma/rdma.h"
#include "store/server/server_internal.h"
#include "fuzz.h"

#define FUZZ_MAX_REQUEST (64u << 20) /* the server's --max-request in this run */

/* Connection state the decode sequence depends on. */
typedef struct fconn {
  int authed;    /* HELLO accepted */
  int local;     /* the Unix socket (ATTACH allowed) */
  int debug_ops; /* --enable-debug-ops */
  int rdma;      /* an RDMA device is open */
} fconn_t;

enum { GO_ON = 0, CLOSE = 1 };

static void check_desc(const ecs_tensor_desc_t *a, const ecs_tensor_desc_t *b) {
  FUZZ_CHECK(a->dtype == b->dtype && a->ndim == b->ndim);
  for (unsigned i = 0; i < a->ndim && i < ECS_MAX_DIMS; i++)
    FUZZ_CHECK(a->shape[i] == b->shape[i]);
}

/* A put item read OK (or failed alone): its key is inside the records, and
 * written back and read again it is the same item with the same verdict. */
static void check_put_item(const ecs_put_item_t *it, int rc, const uint8_t *meta, size_t len) {
  FUZZ_CHECK(fuzz_inside(it->key, it->key_len, meta, len));
  if (rc == ECS_OK) {
    uint64_t size;
    FUZZ_CHECK(it->key_len >= 1 && it->key_len <= ECS_MAX_KEY);
    FUZZ_CHECK(ecs_tensor_nbytes(&it->desc, &size) == ECS_OK && size == it->raw_nbytes);
    FUZZ_CHECK(it->codec != ECS_CODEC_NONE || it->nbytes == it->raw_nbytes);
    FUZZ_CHECK((it->flags & ~ECS_PUT_F_KNOWN) == 0);
  }
  if (it->desc.ndim > ECS_MAX_DIMS)
    return; /* the writer cannot express it (and the item failed) */
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_put_item_write(&w, it);
  FUZZ_CHECK(w.err == ECS_OK);
  ecs_rbuf_t r;
  ecs_put_item_t back;
  ecs_rbuf_init(&r, w.p, w.len);
  int rc2 = ecs_proto_put_item_read(&r, &back);
  FUZZ_CHECK(rc2 == rc && r.pos == w.len);
  FUZZ_CHECK(back.key_len == it->key_len && memcmp(back.key, it->key, it->key_len) == 0);
  FUZZ_CHECK(back.codec == it->codec && back.flags == it->flags && back.nbytes == it->nbytes &&
             back.raw_nbytes == it->raw_nbytes && back.checksum == it->checksum);
  check_desc(&back.desc, &it->desc);
  ecs_wbuf_free(&w);
}

static void check_get_item(const ecs_get_item_t *it, int rc, const uint8_t *meta, size_t len) {
  FUZZ_CHECK(fuzz_inside(it->key, it->key_len, meta, len));
  FUZZ_CHECK(rc != ECS_OK || (it->key_len >= 1 && it->key_len <= ECS_MAX_KEY));
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_get_item_write(&w, it);
  ecs_rbuf_t r;
  ecs_get_item_t back;
  ecs_rbuf_init(&r, w.p, w.len);
  FUZZ_CHECK(ecs_proto_get_item_read(&r, &back) == rc && r.pos == w.len);
  FUZZ_CHECK(back.capacity == it->capacity && back.key_len == it->key_len &&
             memcmp(back.key, it->key, it->key_len) == 0);
  ecs_wbuf_free(&w);
}

/* The records of one request, read as the handler of its opcode reads
 * them.  Returns CLOSE where the server closes the connection. */
static int read_records(const ecs_hdr_t *h, const uint8_t *meta, fconn_t *cs) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h->meta_len);
  switch (h->opcode) {
  case ECS_OP_HELLO: { /* handle_hello */
    if (cs->local)
      return CLOSE; /* never on the Unix socket: the token stays off it */
    ecs_hello_t hl;
    if (ecs_proto_hello_read(&r, &hl) != ECS_OK)
      return CLOSE;
    FUZZ_CHECK(hl.token_len <= ECS_PROTO_MAX_TOKEN && hl.ns_len >= 1 && hl.ns_len <= ECS_PROTO_MAX_NS);
    FUZZ_CHECK(fuzz_inside(hl.token, hl.token_len, meta, h->meta_len));
    FUZZ_CHECK(fuzz_inside(hl.ns, hl.ns_len, meta, h->meta_len));
    /* HELLO has no reserved bytes: what was read writes back byte for byte */
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    ecs_proto_hello_write(&w, &hl);
    FUZZ_CHECK(w.len == r.pos && memcmp(w.p, meta, w.len) == 0);
    ecs_wbuf_free(&w);
    /* the server's namespace in this run is "fuzz", with no token */
    if (hl.ns_len != 4 || memcmp(hl.ns, "fuzz", 4) != 0)
      return CLOSE;
    cs->authed = 1;
    return GO_ON;
  }
  case ECS_OP_PUT:       /* handle_put_begin */
  case ECS_OP_RESERVE: { /* handle_reserve */
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->count; i++) {
      ecs_put_item_t it;
      int rc = ecs_proto_put_item_read(&r, &it);
      FUZZ_CHECK(r.pos <= r.len);
      if (rc == ECS_EPROTO || r.err)
        return CLOSE;
      check_put_item(&it, rc, meta, h->meta_len);
      if (h->opcode == ECS_OP_PUT) {
        if (it.nbytes > UINT64_MAX - total)
          return CLOSE;
        total += it.nbytes;
      }
    }
    if (r.pos != r.len)
      return CLOSE;
    if (h->opcode == ECS_OP_PUT) {
      if (total != h->data_len)
        return CLOSE;
      FUZZ_CHECK(total <= FUZZ_MAX_REQUEST); /* the header bounded data_len, so the sum is bounded */
    }
    return GO_ON;
  }
  case ECS_OP_GET: /* handle_get */
    for (uint32_t i = 0; i < h->count; i++) {
      ecs_get_item_t it;
      int rc = ecs_proto_get_item_read(&r, &it);
      if (rc == ECS_EPROTO || r.err)
        return CLOSE;
      check_get_item(&it, rc, meta, h->meta_len);
    }
    return r.pos == r.len ? GO_ON : CLOSE;
  case ECS_OP_EXISTS: /* handle_keys */
  case ECS_OP_REMOVE:
  case ECS_OP_LEASE: /* handle_lease */
    for (uint32_t i = 0; i < h->count; i++) {
      const uint8_t *key;
      uint16_t klen;
      int rc = ecs_proto_key_read(&r, &key, &klen);
      if (rc == ECS_EPROTO || r.err)
        return CLOSE;
      FUZZ_CHECK(fuzz_inside(key, klen, meta, h->meta_len));
      FUZZ_CHECK(rc != ECS_OK || (klen >= 1 && klen <= ECS_MAX_KEY));
    }
    return r.pos == r.len ? GO_ON : CLOSE;
  case ECS_OP_RELEASE: /* handle_release */
    for (uint32_t i = 0; i < h->count; i++) {
      uint64_t id;
      if (ecs_proto_u64_read(&r, &id) != ECS_OK)
        return CLOSE;
    }
    FUZZ_CHECK(r.pos == (size_t)h->count * 8);
    return r.pos == r.len ? GO_ON : CLOSE;
  case ECS_OP_COMMIT: /* handle_commit */
    for (uint32_t i = 0; i < h->count; i++) {
      ecs_commit_item_t ci;
      if (ecs_proto_commit_item_read(&r, &ci) != ECS_OK)
        return CLOSE;
      FUZZ_CHECK(ci.abort <= 1);
    }
    return r.pos == r.len ? GO_ON : CLOSE;
  case ECS_OP_PULL: /* ecs__handle_pull: a bad record ends the connection, a bad key or address only its item
                     */
    for (uint32_t i = 0; i < h->count; i++) {
      ecs_pull_item_t it;
      int rc = ecs_proto_pull_item_read(&r, &it);
      if (rc == ECS_EPROTO || r.err != ECS_OK)
        return CLOSE;
      if (rc == ECS_OK) {
        FUZZ_CHECK(it.key_len >= 1 && it.key_len <= ECS_MAX_KEY);
        FUZZ_CHECK(it.addr_len >= 1 && it.addr_len <= ECS_PULL_MAX_ADDR);
        FUZZ_CHECK(fuzz_inside(it.key, it.key_len, meta, h->meta_len));
        FUZZ_CHECK(fuzz_inside((const uint8_t *)it.addr, it.addr_len, meta, h->meta_len));
      }
    }
    return r.pos == r.len ? GO_ON : CLOSE;
  case ECS_OP_STAT: /* handle_stat, handle_ping: records are not read */
  case ECS_OP_PING: return GO_ON;
  case ECS_OP_ATTACH: /* handle_attach */
    if (!cs->local)
      return GO_ON; /* ENOTSUP, connection kept */
    (void)ecs_rbuf_u32(&r);
    return r.err ? CLOSE : GO_ON;
  case ECS_OP_RDMA_CONNECT: { /* handle_rdma_connect, then ecs_rdma_ep_connect */
    if (!cs->rdma)
      return GO_ON;
    if (h->meta_len != ECS_RDMA_BLOB_SIZE)
      return CLOSE;
    ecs_rdma_blob b, back;
    if (ecs_rdma_blob_decode(meta, h->meta_len, &b) != ECS_OK)
      return GO_ON; /* the endpoint refuses it; the reply says so */
    uint8_t out[ECS_RDMA_BLOB_SIZE];
    FUZZ_CHECK(ecs_rdma_blob_encode(&b, out) == ECS_OK);
    FUZZ_CHECK(ecs_rdma_blob_decode(out, sizeof out, &back) == ECS_OK);
    FUZZ_CHECK(memcmp(&b, &back, sizeof b) == 0);
    return GO_ON;
  }
  case ECS_OP_UPGRADE: { /* handle_upgrade: the shm socket's challenge-response */
    if (!cs->local)
      return GO_ON; /* ENOTSUP, connection kept */
    if (cs->authed)
      return CLOSE; /* EPROTO: an upgraded connection upgrades no more */
    ecs_upgrade_t u;
    if (ecs_proto_upgrade_read(&r, &u) != ECS_OK || r.pos != r.len)
      return CLOSE;
    FUZZ_CHECK(u.phase == ECS_UPGRADE_CHALLENGE || u.phase == ECS_UPGRADE_PROVE);
    /* no reserved byte is let through: what was read writes back byte for byte */
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    ecs_proto_upgrade_write(&w, &u);
    FUZZ_CHECK(w.len == r.pos && memcmp(w.p, meta, w.len) == 0);
    ecs_wbuf_free(&w);
    return GO_ON;
  }
  case ECS_OP_DEBUG: { /* handle_debug */
    if (!cs->debug_ops)
      return GO_ON;
    uint32_t sub = ecs_rbuf_u32(&r);
    const uint8_t *key;
    uint16_t klen;
    if (!r.err && sub == DEBUG_CORRUPT && ecs_proto_key_read(&r, &key, &klen) == ECS_OK)
      FUZZ_CHECK(fuzz_inside(key, klen, meta, h->meta_len));
    return GO_ON;
  }
  default: FUZZ_CHECK(0 && "the header decoder let an unknown opcode through"); return CLOSE;
  }
}

/* One frame at in->pos; CLOSE when the connection ends (or the input
 * does: the server would wait for the rest until --io-timeout-ms). */
static int one_frame(fuzz_in_t *in, fconn_t *cs) {
  const uint8_t *hb = fuzz_take(in, ECS_PROTO_HDR_SIZE);
  if (!hb)
    return CLOSE;
  ecs_hdr_t h;
  int rc = ecs_proto_hdr_decode(hb, FUZZ_MAX_REQUEST, &h);
  uint8_t again[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, again); /* every field was decoded, even for a bad header */
  FUZZ_CHECK(memcmp(again, hb, sizeof again) == 0);
  if (rc == ECS_OK) {
    FUZZ_CHECK(h.count <= ECS_PROTO_MAX_ITEMS && h.meta_len <= ECS_PROTO_MAX_META &&
               h.data_len <= FUZZ_MAX_REQUEST);
  }
  /* conn_on_readable: before HELLO only a small HELLO is read */
  /* ...and on the Unix socket an UPGRADE instead (its only pre-auth opcode) */
  if (rc == ECS_OK && !cs->authed &&
      (h.opcode != (cs->local ? ECS_OP_UPGRADE : ECS_OP_HELLO) || h.meta_len > PREAUTH_MAX_META ||
       h.data_len))
    return CLOSE;
  if (rc != ECS_OK || (h.flags & ECS_FLAG_REPLY))
    return CLOSE;
  const uint8_t *meta = fuzz_take(in, h.meta_len);
  if (!meta)
    return CLOSE;
  /* ecs__server_dispatch: only PUT carries data, only RELEASE NOREPLY */
  if (!cs->authed && h.opcode != (cs->local ? ECS_OP_UPGRADE : ECS_OP_HELLO))
    return CLOSE;
  if ((h.data_len != 0 && h.opcode != ECS_OP_PUT) ||
      ((h.flags & ECS_FLAG_NOREPLY) && h.opcode != ECS_OP_RELEASE))
    return CLOSE;
  if (read_records(&h, meta, cs) == CLOSE)
    return CLOSE;
  /* PUT's payload follows the records (server_conn.c, C_DATA) */
  if (h.data_len && !fuzz_take(in, (size_t)h.data_len))
    return CLOSE;
  return GO_ON;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in_t in = {data, size, 0};
  uint8_t mode = fuzz_u8(&in);
  fconn_t cs = {
      .authed = mode & 1, .local = (mode >> 1) & 1, .debug_ops = (mode >> 2) & 1, .rdma = (mode >> 3) & 1};
  while (one_frame(&in, &cs) == GO_ON)
    ;
  return 0;
}
