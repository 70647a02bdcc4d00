/*
 * RDMA transport: the connection blob (see rdma.h and docs/rdma.md), the
 * fixed-size wire record two endpoints exchange to connect.  Pure code,
 * built in every build, with or without libibverbs.
 */
#include "store/rdma/rdma.h"

#include <string.h>

#include "store/rdma/rdma_internal.h"

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
  if (b->qpn == 0 || b->qpn > ECS_RDMA_PSN_MASK || b->psn > ECS_RDMA_PSN_MASK)
    return 0;
  if (b->mtu < 1 || b->mtu > 5 || b->rd_atom == 0)
    return 0;
  if (b->link_layer != ECS_RDMA_LL_INFINIBAND && b->link_layer != ECS_RDMA_LL_ETHERNET)
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
