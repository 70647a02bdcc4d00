/*
 * The backend table lookup and the object header shared by the disk and
 * redis backends.
 */
#include "ec_connector/backend.h"

#include <string.h>

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/*
 * Layout (little-endian):
 *   0  magic "ECT1"      4  version u32
 *   8  dtype u8          9  ndim u8        10..16 zero
 *  16  shape[8] u64     80  nbytes u64     88 checksum u64
 *  96..128 zero (reserved)
 */
void ecs__ec_hdr_encode(uint8_t out[ECS__EC_HDR_SIZE], const ecs_tensor_desc_t *desc, uint64_t nbytes,
                        uint64_t checksum) {
  memset(out, 0, ECS__EC_HDR_SIZE);
  memcpy(out, ECS__EC_HDR_MAGIC, 4);
  out[4] = (uint8_t)ECS__EC_HDR_VERSION;
  out[8] = desc->dtype;
  out[9] = desc->ndim;
  for (int i = 0; i < ECS_MAX_DIMS; i++)
    put_le64(out + 16 + 8 * i, i < desc->ndim ? desc->shape[i] : 0);
  put_le64(out + 80, nbytes);
  put_le64(out + 88, checksum);
}

int ecs__ec_hdr_decode(const uint8_t in[ECS__EC_HDR_SIZE], ecs_tensor_desc_t *desc, uint64_t *nbytes,
                       uint64_t *checksum) {
  if (memcmp(in, ECS__EC_HDR_MAGIC, 4) != 0 || in[4] != ECS__EC_HDR_VERSION || in[5] || in[6] || in[7])
    return ECS_ECHECKSUM;
  memset(desc, 0, sizeof *desc);
  desc->dtype = in[8];
  desc->ndim = in[9];
  if (desc->ndim > ECS_MAX_DIMS)
    return ECS_ECHECKSUM;
  for (int i = 0; i < desc->ndim; i++)
    desc->shape[i] = get_le64(in + 16 + 8 * i);
  *nbytes = get_le64(in + 80);
  *checksum = get_le64(in + 88);
  uint64_t want;
  if (ecs_tensor_nbytes(desc, &want) != ECS_OK || want != *nbytes)
    return ECS_ECHECKSUM;
  return ECS_OK;
}

int ecs__ec_tensor_check(const ecs_tensor_t *t) {
  uint64_t want;
  int rc = ecs_tensor_nbytes(&t->desc, &want);
  if (rc != ECS_OK)
    return ECS_EDTYPE;
  if (want != t->nbytes || (t->data == NULL && t->nbytes != 0))
    return ECS_EINVAL;
  return ECS_OK;
}

const ecs__ec_ops_t *ecs__ec_ops_for(int backend) {
  switch (backend) {
  case ECS_EC_BACKEND_ECSTORE: return &ecs__ec_ops_ecstore;
  case ECS_EC_BACKEND_DISK: return &ecs__ec_ops_disk;
  case ECS_EC_BACKEND_REDIS: return &ecs__ec_ops_redis;
  }
  return NULL;
}
