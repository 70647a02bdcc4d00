/*
 * ecstore wire protocol codec (store/core/proto.h, docs/protocol.md).
 *
 * No I/O here: writers append little-endian records to a growable buffer,
 * readers decode records from a bounded buffer.  Readers work in two steps:
 * first they consume the whole record, so that a truncated or overlong
 * record is an ECS_EPROTO (the message framing is broken and nothing after
 * it can be trusted); then they validate the fields, so that a bad key or
 * dtype is an ECS_EKEY / ECS_EDTYPE for that item alone, with the reader
 * already positioned at the next record.  That split is what lets one bad
 * item in a batch fail alone.
 */
#include "store/core/proto.h"

#include "store/core/auth.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The decoded header happens to have the wire layout (natural alignment, no
 * padding); the codec does not rely on it, but the wire offsets are pinned
 * here so that the documented table and this file cannot drift apart. */
_Static_assert(sizeof(ecs_hdr_t) == ECS_PROTO_HDR_SIZE, "wire header is 32 bytes");
_Static_assert(offsetof(ecs_hdr_t, version) == 4, "header layout");
_Static_assert(offsetof(ecs_hdr_t, opcode) == 5, "header layout");
_Static_assert(offsetof(ecs_hdr_t, flags) == 6, "header layout");
_Static_assert(offsetof(ecs_hdr_t, req_id) == 8, "header layout");
_Static_assert(offsetof(ecs_hdr_t, status) == 12, "header layout");
_Static_assert(offsetof(ecs_hdr_t, count) == 16, "header layout");
_Static_assert(offsetof(ecs_hdr_t, meta_len) == 20, "header layout");
_Static_assert(offsetof(ecs_hdr_t, data_len) == 24, "header layout");
_Static_assert(ECS_MAX_KEY <= UINT16_MAX, "key_len travels as u16");
_Static_assert(ECS_MAX_DIMS <= UINT8_MAX, "ndim travels as u8");

/* ---- little-endian primitives ------------------------------------------ */

static void le16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p) {
  return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* ---- header ------------------------------------------------------------- */

void ecs_proto_hdr_encode(const ecs_hdr_t *h, uint8_t out[ECS_PROTO_HDR_SIZE]) {
  le32(out + 0, h->magic);
  out[4] = h->version;
  out[5] = h->opcode;
  le16(out + 6, h->flags);
  le32(out + 8, h->req_id);
  le32(out + 12, (uint32_t)h->status);
  le32(out + 16, h->count);
  le32(out + 20, h->meta_len);
  le64(out + 24, h->data_len);
}

static int op_known(unsigned op) {
  switch (op) {
  case ECS_OP_HELLO:
  case ECS_OP_PUT:
  case ECS_OP_GET:
  case ECS_OP_EXISTS:
  case ECS_OP_REMOVE:
  case ECS_OP_STAT:
  case ECS_OP_PING:
  case ECS_OP_LEASE:
  case ECS_OP_RELEASE:
  case ECS_OP_RESERVE:
  case ECS_OP_COMMIT:
  case ECS_OP_ATTACH:
  case ECS_OP_RDMA_CONNECT:
  case ECS_OP_UPGRADE:
  case ECS_OP_PULL:
  case ECS_OP_DEBUG: return 1;
  default: return 0;
  }
}

/* Every field is decoded before anything is checked, so that a server can
 * echo req_id and opcode in the error reply to a bad header. */
int ecs_proto_hdr_decode(const uint8_t in[ECS_PROTO_HDR_SIZE], uint64_t max_data, ecs_hdr_t *h) {
  h->magic = get32(in + 0);
  h->version = in[4];
  h->opcode = in[5];
  h->flags = get16(in + 6);
  h->req_id = get32(in + 8);
  h->status = (int32_t)get32(in + 12);
  h->count = get32(in + 16);
  h->meta_len = get32(in + 20);
  h->data_len = get64(in + 24);
  if (h->magic != ECS_PROTO_MAGIC || h->version != ECS_PROTO_VERSION || !op_known(h->opcode) ||
      h->count > ECS_PROTO_MAX_ITEMS || h->meta_len > ECS_PROTO_MAX_META)
    return ECS_EPROTO;
  if (h->data_len > max_data)
    return ECS_ETOOBIG;
  return ECS_OK;
}

/* ---- write buffer ------------------------------------------------------- */

void ecs_wbuf_init(ecs_wbuf_t *w) {
  w->p = NULL;
  w->len = 0;
  w->cap = 0;
  w->err = ECS_OK;
}

void ecs_wbuf_reset(ecs_wbuf_t *w) {
  w->len = 0;
  w->err = ECS_OK;
}

void ecs_wbuf_free(ecs_wbuf_t *w) {
  if (w == NULL)
    return;
  free(w->p);
  ecs_wbuf_init(w);
}

/* Makes room for n more bytes and returns where they go, or NULL once the
 * buffer has failed (err is then set and stays set until reset). */
static uint8_t *wbuf_grow(ecs_wbuf_t *w, size_t n) {
  if (w->err != ECS_OK)
    return NULL;
  if (n > SIZE_MAX - w->len) {
    w->err = ECS_ENOMEM;
    return NULL;
  }
  size_t need = w->len + n;
  if (need > w->cap) {
    size_t cap = w->cap != 0 ? w->cap : 256;
    while (cap < need)
      cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = realloc(w->p, cap);
    if (p == NULL) {
      w->err = ECS_ENOMEM;
      return NULL;
    }
    w->p = p;
    w->cap = cap;
  }
  uint8_t *dst = w->p + w->len;
  w->len = need;
  return dst;
}

void ecs_wbuf_put(ecs_wbuf_t *w, const void *src, size_t n) {
  if (n == 0)
    return;
  uint8_t *dst = wbuf_grow(w, n);
  if (dst != NULL)
    memcpy(dst, src, n);
}

void ecs_wbuf_u8(ecs_wbuf_t *w, uint8_t v) {
  uint8_t *dst = wbuf_grow(w, 1);
  if (dst != NULL)
    *dst = v;
}

void ecs_wbuf_u16(ecs_wbuf_t *w, uint16_t v) {
  uint8_t *dst = wbuf_grow(w, 2);
  if (dst != NULL)
    le16(dst, v);
}

void ecs_wbuf_u32(ecs_wbuf_t *w, uint32_t v) {
  uint8_t *dst = wbuf_grow(w, 4);
  if (dst != NULL)
    le32(dst, v);
}

void ecs_wbuf_u64(ecs_wbuf_t *w, uint64_t v) {
  uint8_t *dst = wbuf_grow(w, 8);
  if (dst != NULL)
    le64(dst, v);
}

static void wbuf_zeros(ecs_wbuf_t *w, size_t n) {
  uint8_t *dst = wbuf_grow(w, n);
  if (dst != NULL)
    memset(dst, 0, n);
}

/* ---- read buffer -------------------------------------------------------- */

void ecs_rbuf_init(ecs_rbuf_t *r, const void *p, size_t len) {
  r->p = p;
  r->len = p != NULL ? len : 0;
  r->pos = 0;
  r->err = ECS_OK;
}

/* Returns the next n bytes and advances, or NULL (err set, pos unchanged)
 * when fewer are left.  Errors are sticky: after the first overrun every
 * read fails, so a caller may check err once per record. */
static const uint8_t *rbuf_take(ecs_rbuf_t *r, size_t n) {
  static const uint8_t empty[1];
  if (r->err != ECS_OK)
    return NULL;
  if (n > r->len - r->pos) {
    r->err = ECS_EPROTO;
    return NULL;
  }
  if (n == 0)
    return r->p != NULL ? r->p + r->pos : empty; /* never NULL on success */
  const uint8_t *s = r->p + r->pos;
  r->pos += n;
  return s;
}

uint8_t ecs_rbuf_u8(ecs_rbuf_t *r) {
  const uint8_t *s = rbuf_take(r, 1);
  return s != NULL ? s[0] : 0;
}

uint16_t ecs_rbuf_u16(ecs_rbuf_t *r) {
  const uint8_t *s = rbuf_take(r, 2);
  return s != NULL ? get16(s) : 0;
}

uint32_t ecs_rbuf_u32(ecs_rbuf_t *r) {
  const uint8_t *s = rbuf_take(r, 4);
  return s != NULL ? get32(s) : 0;
}

uint64_t ecs_rbuf_u64(ecs_rbuf_t *r) {
  const uint8_t *s = rbuf_take(r, 8);
  return s != NULL ? get64(s) : 0;
}

const uint8_t *ecs_rbuf_bytes(ecs_rbuf_t *r, size_t n) {
  return rbuf_take(r, n);
}

/* A reader's verdict on a record that did not fit (or that the caller fed
 * an already-failed buffer): the stream is broken. */
static int rbuf_fail(ecs_rbuf_t *r) {
  if (r->err == ECS_OK)
    r->err = ECS_EPROTO;
  return ECS_EPROTO;
}

/* ---- shared record parts ------------------------------------------------ */

/* ndim u64 dimensions.  The writer emits the ndim it is given; dimensions
 * past ECS_MAX_DIMS (which no valid desc has) are written as 0 so that the
 * record stays well framed and the reader rejects it with ECS_EDTYPE. */
static void shape_write(ecs_wbuf_t *w, const ecs_tensor_desc_t *d) {
  for (unsigned i = 0; i < d->ndim; i++)
    ecs_wbuf_u64(w, i < ECS_MAX_DIMS ? d->shape[i] : 0);
}

static void shape_read(ecs_rbuf_t *r, ecs_tensor_desc_t *d) {
  for (unsigned i = 0; i < d->ndim; i++) {
    uint64_t v = ecs_rbuf_u64(r);
    if (i < ECS_MAX_DIMS)
      d->shape[i] = v;
  }
}

/* dtype and ndim known, and the shape's byte size equal to raw_nbytes (and
 * to nbytes when the payload is raw). */
static int tensor_check(uint8_t codec, const ecs_tensor_desc_t *d, uint64_t nbytes, uint64_t raw_nbytes) {
  uint64_t size;
  if (ecs_tensor_nbytes(d, &size) != ECS_OK)
    return ECS_EDTYPE;
  if (size != raw_nbytes)
    return ECS_EDTYPE;
  if (codec == ECS_CODEC_NONE && size != nbytes)
    return ECS_EDTYPE;
  return ECS_OK;
}

/* ---- PUT item ----------------------------------------------------------- */

uint16_t ecs_proto_pin_ttl_encode(uint64_t ms) {
  uint64_t s = ms / 1000 + (ms % 1000 != 0);
  if (s <= 0x7fff)
    return (uint16_t)s;
  uint64_t m = s / 60 + (s % 60 != 0);
  return (uint16_t)(0x8000u | (m < 0x7fff ? m : 0x7fff));
}

uint64_t ecs_proto_pin_ttl_decode(uint16_t v) {
  return (v & 0x8000u) ? (uint64_t)(v & 0x7fffu) * 60000u : (uint64_t)v * 1000u;
}

void ecs_proto_put_item_write(ecs_wbuf_t *w, const ecs_put_item_t *it) {
  ecs_wbuf_u16(w, it->key_len);
  ecs_wbuf_u8(w, it->codec);
  ecs_wbuf_u8(w, it->desc.dtype);
  ecs_wbuf_u8(w, it->desc.ndim);
  ecs_wbuf_u8(w, it->flags);
  ecs_wbuf_u16(w, it->pin_ttl);
  ecs_wbuf_u64(w, it->nbytes);
  ecs_wbuf_u64(w, it->raw_nbytes);
  ecs_wbuf_u64(w, it->checksum);
  shape_write(w, &it->desc);
  ecs_wbuf_put(w, it->key, it->key_len);
}

int ecs_proto_put_item_read(ecs_rbuf_t *r, ecs_put_item_t *it) {
  memset(it, 0, sizeof *it);
  it->key_len = ecs_rbuf_u16(r);
  it->codec = ecs_rbuf_u8(r);
  it->desc.dtype = ecs_rbuf_u8(r);
  it->desc.ndim = ecs_rbuf_u8(r);
  it->flags = ecs_rbuf_u8(r);
  it->pin_ttl = ecs_rbuf_u16(r); /* reserved before PIN_TTL: older clients send 0 */
  it->nbytes = ecs_rbuf_u64(r);
  it->raw_nbytes = ecs_rbuf_u64(r);
  it->checksum = ecs_rbuf_u64(r);
  shape_read(r, &it->desc);
  it->key = rbuf_take(r, it->key_len);
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  if (ecs_key_check(it->key, it->key_len) != ECS_OK)
    return ECS_EKEY;
  if (it->flags & ~ECS_PUT_F_KNOWN)
    return ECS_EINVAL; /* a flag from a newer client: fail the item, not silently ignore it */
  return tensor_check(it->codec, &it->desc, it->nbytes, it->raw_nbytes);
}

/* ---- GET item ----------------------------------------------------------- */

void ecs_proto_get_item_write(ecs_wbuf_t *w, const ecs_get_item_t *it) {
  ecs_wbuf_u16(w, it->key_len);
  wbuf_zeros(w, 6);
  ecs_wbuf_u64(w, it->capacity);
  ecs_wbuf_put(w, it->key, it->key_len);
}

int ecs_proto_get_item_read(ecs_rbuf_t *r, ecs_get_item_t *it) {
  memset(it, 0, sizeof *it);
  it->key_len = ecs_rbuf_u16(r);
  (void)rbuf_take(r, 6); /* reserved */
  it->capacity = ecs_rbuf_u64(r);
  it->key = rbuf_take(r, it->key_len);
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  return ecs_key_check(it->key, it->key_len);
}

/* ---- PULL item ------------------------------------------------------------ */

void ecs_proto_pull_item_write(ecs_wbuf_t *w, const ecs_pull_item_t *it) {
  ecs_wbuf_u16(w, it->key_len);
  ecs_wbuf_u16(w, it->addr_len);
  ecs_wbuf_u32(w, it->timeout_ms);
  ecs_wbuf_put(w, it->addr, it->addr_len);
  ecs_wbuf_put(w, it->key, it->key_len);
}

int ecs_proto_pull_item_read(ecs_rbuf_t *r, ecs_pull_item_t *it) {
  memset(it, 0, sizeof *it);
  it->key_len = ecs_rbuf_u16(r);
  it->addr_len = ecs_rbuf_u16(r);
  it->timeout_ms = ecs_rbuf_u32(r);
  it->addr = (const char *)rbuf_take(r, it->addr_len);
  it->key = rbuf_take(r, it->key_len);
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  int rc = ecs_key_check(it->key, it->key_len);
  if (rc == ECS_OK && (it->addr_len == 0 || it->addr_len > ECS_PULL_MAX_ADDR))
    rc = ECS_EINVAL;
  return rc;
}

/* ---- GET reply item ----------------------------------------------------- */

void ecs_proto_get_reply_write(ecs_wbuf_t *w, const ecs_get_reply_t *it) {
  ecs_wbuf_u32(w, (uint32_t)it->status);
  ecs_wbuf_u8(w, it->codec);
  ecs_wbuf_u8(w, it->desc.dtype);
  ecs_wbuf_u8(w, it->desc.ndim);
  wbuf_zeros(w, 1);
  ecs_wbuf_u64(w, it->nbytes);
  ecs_wbuf_u64(w, it->raw_nbytes);
  ecs_wbuf_u64(w, it->checksum);
  shape_write(w, &it->desc);
}

/* The tensor fields are only promised for a hit: an ENOTFOUND reply may
 * carry a zeroed description, an EBUFSMALL one only needs nbytes.  ndim is
 * bounded for every status because desc cannot hold more dimensions. */
int ecs_proto_get_reply_read(ecs_rbuf_t *r, ecs_get_reply_t *it) {
  memset(it, 0, sizeof *it);
  it->status = (int32_t)ecs_rbuf_u32(r);
  it->codec = ecs_rbuf_u8(r);
  it->desc.dtype = ecs_rbuf_u8(r);
  it->desc.ndim = ecs_rbuf_u8(r);
  (void)rbuf_take(r, 1); /* reserved */
  it->nbytes = ecs_rbuf_u64(r);
  it->raw_nbytes = ecs_rbuf_u64(r);
  it->checksum = ecs_rbuf_u64(r);
  shape_read(r, &it->desc);
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  if (it->desc.ndim > ECS_MAX_DIMS)
    return ECS_EDTYPE;
  if (it->status != ECS_OK)
    return ECS_OK;
  return tensor_check(it->codec, &it->desc, it->nbytes, it->raw_nbytes);
}

/* ---- key and status items ----------------------------------------------- */

void ecs_proto_key_write(ecs_wbuf_t *w, const void *key, uint16_t key_len) {
  ecs_wbuf_u16(w, key_len);
  ecs_wbuf_put(w, key, key_len);
}

int ecs_proto_key_read(ecs_rbuf_t *r, const uint8_t **key, uint16_t *key_len) {
  uint16_t n = ecs_rbuf_u16(r);
  const uint8_t *k = rbuf_take(r, n);
  *key = k;
  *key_len = n;
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  return ecs_key_check(k, n);
}

void ecs_proto_status_write(ecs_wbuf_t *w, int32_t status) {
  ecs_wbuf_u32(w, (uint32_t)status);
}

int ecs_proto_status_read(ecs_rbuf_t *r, int32_t *status) {
  *status = (int32_t)ecs_rbuf_u32(r);
  return r->err != ECS_OK ? rbuf_fail(r) : ECS_OK;
}

/* ---- HELLO -------------------------------------------------------------- */

void ecs_proto_hello_write(ecs_wbuf_t *w, const ecs_hello_t *h) {
  ecs_wbuf_u16(w, h->token_len);
  ecs_wbuf_u16(w, h->ns_len);
  ecs_wbuf_u32(w, h->client_flags);
  ecs_wbuf_put(w, h->token, h->token_len);
  ecs_wbuf_put(w, h->ns, h->ns_len);
  if (h->client_flags & ECS_HELLO_C_CHALLENGE) {
    ecs_wbuf_put(w, h->key_id, ECS_AUTH_ID_SIZE);
    ecs_wbuf_put(w, h->nonce, ECS_AUTH_NONCE_SIZE);
  } else if (h->client_flags & ECS_HELLO_C_PROVE) {
    ecs_wbuf_put(w, h->mac, ECS_AUTH_MAC_SIZE);
  }
}

/* A bad HELLO ends the connection whatever is wrong with it, so every
 * failure here is ECS_EPROTO. */
int ecs_proto_hello_read(ecs_rbuf_t *r, ecs_hello_t *h) {
  memset(h, 0, sizeof *h);
  h->token_len = ecs_rbuf_u16(r);
  h->ns_len = ecs_rbuf_u16(r);
  h->client_flags = ecs_rbuf_u32(r);
  if (r->err != ECS_OK || h->token_len > ECS_PROTO_MAX_TOKEN || h->ns_len == 0 ||
      h->ns_len > ECS_PROTO_MAX_NS)
    return rbuf_fail(r);
  uint32_t auth = h->client_flags & (ECS_HELLO_C_CHALLENGE | ECS_HELLO_C_PROVE);
  if (auth == (ECS_HELLO_C_CHALLENGE | ECS_HELLO_C_PROVE) || (auth && h->token_len))
    return rbuf_fail(r);
  h->token = rbuf_take(r, h->token_len);
  h->ns = rbuf_take(r, h->ns_len);
  if (auth == ECS_HELLO_C_CHALLENGE) {
    h->key_id = rbuf_take(r, ECS_AUTH_ID_SIZE);
    h->nonce = rbuf_take(r, ECS_AUTH_NONCE_SIZE);
  } else if (auth == ECS_HELLO_C_PROVE) {
    h->mac = rbuf_take(r, ECS_AUTH_MAC_SIZE);
  }
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  return ECS_OK;
}

void ecs_proto_hello_reply_write(ecs_wbuf_t *w, const ecs_hello_reply_t *h) {
  uint16_t n = (uint16_t)strnlen(h->node_id, sizeof h->node_id - 1);
  ecs_wbuf_u16(w, n);
  ecs_wbuf_u16(w, (uint16_t)((h->upgrade_id ? ECS_HELLO_F_UPGRADE : 0) | (h->proof ? ECS_HELLO_F_PROOF : 0)));
  ecs_wbuf_u32(w, h->max_items);
  ecs_wbuf_u64(w, h->epoch);
  ecs_wbuf_u64(w, h->pool_size);
  ecs_wbuf_u64(w, h->max_data);
  ecs_wbuf_put(w, h->node_id, n);
  uint16_t pn = (uint16_t)strnlen(h->shm_path, sizeof h->shm_path - 1);
  ecs_wbuf_u16(w, pn);
  ecs_wbuf_put(w, h->shm_path, pn);
  if (h->upgrade_id) {
    ecs_wbuf_u64(w, h->upgrade_id);
    ecs_wbuf_put(w, h->upgrade_secret, ECS_UPGRADE_SECRET_SIZE);
  }
  if (h->proof) {
    uint16_t an = (uint16_t)strnlen(h->addr, sizeof h->addr - 1);
    ecs_wbuf_u16(w, an);
    ecs_wbuf_put(w, h->addr, an);
    ecs_wbuf_put(w, h->snonce, sizeof h->snonce);
    ecs_wbuf_put(w, h->smac, sizeof h->smac);
  }
}

int ecs_proto_hello_reply_read(ecs_rbuf_t *r, ecs_hello_reply_t *h) {
  memset(h, 0, sizeof *h);
  uint16_t n = ecs_rbuf_u16(r);
  uint16_t flags = ecs_rbuf_u16(r); /* other bits: reserved, ignored */
  h->max_items = ecs_rbuf_u32(r);
  h->epoch = ecs_rbuf_u64(r);
  h->pool_size = ecs_rbuf_u64(r);
  h->max_data = ecs_rbuf_u64(r);
  if (r->err != ECS_OK || n >= sizeof h->node_id)
    return rbuf_fail(r);
  const uint8_t *id = rbuf_take(r, n);
  if (id == NULL)
    return rbuf_fail(r);
  memcpy(h->node_id, id, n);
  h->node_id[n] = '\0';
  uint16_t pn = ecs_rbuf_u16(r);
  if (r->err != ECS_OK || pn >= sizeof h->shm_path)
    return rbuf_fail(r);
  const uint8_t *path = rbuf_take(r, pn);
  if (path == NULL)
    return rbuf_fail(r);
  memcpy(h->shm_path, path, pn);
  h->shm_path[pn] = '\0';
  if (flags & ECS_HELLO_F_UPGRADE) {
    h->upgrade_id = ecs_rbuf_u64(r);
    const uint8_t *sec = rbuf_take(r, ECS_UPGRADE_SECRET_SIZE);
    if (r->err != ECS_OK || h->upgrade_id == 0 || sec == NULL)
      return rbuf_fail(r);
    memcpy(h->upgrade_secret, sec, ECS_UPGRADE_SECRET_SIZE);
  }
  if (flags & ECS_HELLO_F_PROOF) {
    uint16_t an = ecs_rbuf_u16(r);
    if (r->err != ECS_OK || an >= sizeof h->addr)
      return rbuf_fail(r);
    const uint8_t *a = rbuf_take(r, an);
    const uint8_t *sn = rbuf_take(r, sizeof h->snonce);
    const uint8_t *sm = rbuf_take(r, sizeof h->smac);
    if (r->err != ECS_OK || a == NULL || sn == NULL || sm == NULL)
      return rbuf_fail(r);
    memcpy(h->addr, a, an);
    h->addr[an] = '\0';
    memcpy(h->snonce, sn, sizeof h->snonce);
    memcpy(h->smac, sm, sizeof h->smac);
    h->proof = 1;
  }
  return ECS_OK;
}

/* ---- STAT reply --------------------------------------------------------- */

/* The wire order is the declaration order; the table keeps the two in one
 * place and the assertion notices a field added to one but not the other. */
static const size_t stat_fields[] = {
    offsetof(ecs_stat_reply_t, pool_size),
    offsetof(ecs_stat_reply_t, bytes_in_use),
    offsetof(ecs_stat_reply_t, bytes_free),
    offsetof(ecs_stat_reply_t, largest_free),
    offsetof(ecs_stat_reply_t, bytes_requested),
    offsetof(ecs_stat_reply_t, objects),
    offsetof(ecs_stat_reply_t, puts),
    offsetof(ecs_stat_reply_t, gets),
    offsetof(ecs_stat_reply_t, hits),
    offsetof(ecs_stat_reply_t, misses),
    offsetof(ecs_stat_reply_t, evictions),
    offsetof(ecs_stat_reply_t, removes),
    offsetof(ecs_stat_reply_t, connections),
    offsetof(ecs_stat_reply_t, epoch),
    offsetof(ecs_stat_reply_t, redis_ok),
    offsetof(ecs_stat_reply_t, pool_locked),
    offsetof(ecs_stat_reply_t, pool_cuda_registered),
};
_Static_assert(sizeof stat_fields / sizeof stat_fields[0] * sizeof(uint64_t) == sizeof(ecs_stat_reply_t),
               "every ecs_stat_reply_t field is in the wire table");

void ecs_proto_stat_write(ecs_wbuf_t *w, const ecs_stat_reply_t *s) {
  for (size_t i = 0; i < sizeof stat_fields / sizeof stat_fields[0]; i++) {
    uint64_t v;
    memcpy(&v, (const char *)s + stat_fields[i], sizeof v);
    ecs_wbuf_u64(w, v);
  }
}

/* Reads the known counters; a newer server may append more, which the
 * caller is free to leave unread.  An older server's reply ends after
 * fewer: the base ones must be there, a later one that is not (the meta
 * section ends before it) reads as ECS_STAT_ABSENT.  A reply that ends in
 * the middle of a counter is malformed. */
int ecs_proto_stat_read(ecs_rbuf_t *r, ecs_stat_reply_t *s) {
  memset(s, 0, sizeof *s);
  for (size_t i = 0; i < sizeof stat_fields / sizeof stat_fields[0]; i++) {
    uint64_t v = ECS_STAT_ABSENT;
    if (i < ECS_STAT_BASE_COUNTERS || r->pos != r->len)
      v = ecs_rbuf_u64(r);
    memcpy((char *)s + stat_fields[i], &v, sizeof v);
  }
  return r->err != ECS_OK ? rbuf_fail(r) : ECS_OK;
}

/* ---- lease, reserve, commit, attach ------------------------------------ */

void ecs_proto_lease_reply_write(ecs_wbuf_t *w, const ecs_lease_reply_t *it) {
  ecs_wbuf_u32(w, (uint32_t)it->status);
  ecs_wbuf_u8(w, it->codec);
  ecs_wbuf_u8(w, it->desc.dtype);
  ecs_wbuf_u8(w, it->desc.ndim);
  wbuf_zeros(w, 1);
  ecs_wbuf_u64(w, it->off);
  ecs_wbuf_u64(w, it->nbytes);
  ecs_wbuf_u64(w, it->raw_nbytes);
  ecs_wbuf_u64(w, it->checksum);
  ecs_wbuf_u64(w, it->lease_id);
  ecs_wbuf_u32(w, it->rkey);
  wbuf_zeros(w, 4);
  shape_write(w, &it->desc);
}

int ecs_proto_lease_reply_read(ecs_rbuf_t *r, ecs_lease_reply_t *it) {
  memset(it, 0, sizeof *it);
  it->status = (int32_t)ecs_rbuf_u32(r);
  it->codec = ecs_rbuf_u8(r);
  it->desc.dtype = ecs_rbuf_u8(r);
  it->desc.ndim = ecs_rbuf_u8(r);
  (void)rbuf_take(r, 1); /* reserved */
  it->off = ecs_rbuf_u64(r);
  it->nbytes = ecs_rbuf_u64(r);
  it->raw_nbytes = ecs_rbuf_u64(r);
  it->checksum = ecs_rbuf_u64(r);
  it->lease_id = ecs_rbuf_u64(r);
  it->rkey = ecs_rbuf_u32(r);
  (void)rbuf_take(r, 4); /* reserved */
  shape_read(r, &it->desc);
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  if (it->desc.ndim > ECS_MAX_DIMS)
    return ECS_EDTYPE;
  if (it->status != ECS_OK)
    return ECS_OK;
  return tensor_check(it->codec, &it->desc, it->nbytes, it->raw_nbytes);
}

void ecs_proto_reserve_reply_write(ecs_wbuf_t *w, const ecs_reserve_reply_t *it) {
  ecs_wbuf_u32(w, (uint32_t)it->status);
  ecs_wbuf_u32(w, it->rkey);
  ecs_wbuf_u64(w, it->off);
  ecs_wbuf_u64(w, it->resv_id);
}

int ecs_proto_reserve_reply_read(ecs_rbuf_t *r, ecs_reserve_reply_t *it) {
  memset(it, 0, sizeof *it);
  it->status = (int32_t)ecs_rbuf_u32(r);
  it->rkey = ecs_rbuf_u32(r);
  it->off = ecs_rbuf_u64(r);
  it->resv_id = ecs_rbuf_u64(r);
  return r->err != ECS_OK ? rbuf_fail(r) : ECS_OK;
}

void ecs_proto_commit_item_write(ecs_wbuf_t *w, const ecs_commit_item_t *it) {
  ecs_wbuf_u64(w, it->resv_id);
  ecs_wbuf_u64(w, it->checksum);
  ecs_wbuf_u32(w, it->abort);
  wbuf_zeros(w, 4);
}

int ecs_proto_commit_item_read(ecs_rbuf_t *r, ecs_commit_item_t *it) {
  memset(it, 0, sizeof *it);
  it->resv_id = ecs_rbuf_u64(r);
  it->checksum = ecs_rbuf_u64(r);
  it->abort = ecs_rbuf_u32(r);
  (void)rbuf_take(r, 4); /* reserved */
  if (r->err != ECS_OK)
    return rbuf_fail(r);
  return it->abort > 1 ? ECS_EPROTO : ECS_OK;
}

void ecs_proto_attach_reply_write(ecs_wbuf_t *w, const ecs_attach_reply_t *it) {
  ecs_wbuf_u64(w, it->pool_size);
  ecs_wbuf_u32(w, it->flags);
  wbuf_zeros(w, 4);
}

int ecs_proto_attach_reply_read(ecs_rbuf_t *r, ecs_attach_reply_t *it) {
  memset(it, 0, sizeof *it);
  it->pool_size = ecs_rbuf_u64(r);
  it->flags = ecs_rbuf_u32(r);
  (void)rbuf_take(r, 4); /* reserved */
  return r->err != ECS_OK ? rbuf_fail(r) : ECS_OK;
}

void ecs_proto_upgrade_write(ecs_wbuf_t *w, const ecs_upgrade_t *it) {
  ecs_wbuf_u32(w, it->phase);
  wbuf_zeros(w, 4);
  if (it->phase == ECS_UPGRADE_PROVE) {
    ecs_wbuf_u64(w, it->upgrade_id);
    ecs_wbuf_put(w, it->mac, ECS_UPGRADE_MAC_SIZE);
  }
}

int ecs_proto_upgrade_read(ecs_rbuf_t *r, ecs_upgrade_t *it) {
  memset(it, 0, sizeof *it);
  it->phase = ecs_rbuf_u32(r);
  uint32_t reserved = ecs_rbuf_u32(r);
  if (r->err != ECS_OK || reserved != 0 ||
      (it->phase != ECS_UPGRADE_CHALLENGE && it->phase != ECS_UPGRADE_PROVE))
    return rbuf_fail(r);
  if (it->phase == ECS_UPGRADE_PROVE) {
    it->upgrade_id = ecs_rbuf_u64(r);
    const uint8_t *mac = rbuf_take(r, ECS_UPGRADE_MAC_SIZE);
    if (r->err != ECS_OK || mac == NULL)
      return rbuf_fail(r);
    memcpy(it->mac, mac, ECS_UPGRADE_MAC_SIZE);
  }
  return ECS_OK;
}

void ecs_proto_u64_write(ecs_wbuf_t *w, uint64_t v) {
  ecs_wbuf_u64(w, v);
}

int ecs_proto_u64_read(ecs_rbuf_t *r, uint64_t *v) {
  *v = ecs_rbuf_u64(r);
  return r->err != ECS_OK ? rbuf_fail(r) : ECS_OK;
}
