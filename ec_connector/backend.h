/*
 * Connector backends behind one table of operations.
 *
 * Each backend gives the same batch semantics as libecstore (ecstore.h):
 * every call takes n items and sets n statuses; the return is ECS_OK or a
 * whole-batch error (Redis down, server unreachable), which the items it
 * touched carry as their status too.  A handle is used by one thread at a
 * time: the connector opens one per role (saves, loads, has, KV).
 *
 *   put     status[i]: ECS_OK, ECS_ENOSPC / ECS_ETOOBIG, ECS_EIO, ...
 *   get     bufs[i].status: ECS_OK (bytes at data, nbytes, desc),
 *           ECS_ENOTFOUND, ECS_EBUFSMALL (nbytes = size needed, desc),
 *           ECS_ECHECKSUM (corrupt or truncated: a miss, never data)
 *   exists  out[i] 0/1; on a whole-batch error all 0 and the error returned
 *   remove  status[i]: ECS_OK or ECS_ENOTFOUND
 *
 * The disk and redis backends store a fixed 128-byte header in front of
 * the bytes (magic, version, dtype, shape, byte count, xxh3 checksum), all
 * little-endian, so a load verifies what it reads and returns the stored
 * shape instead of assuming one.
 */
#ifndef ECS_EC_BACKEND_H
#define ECS_EC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/ec_connector.h"
#include "ecstore/ecstore.h"

/* What a handle is for: META handles answer exists (the ecstore backend
 * then connects to Redis); DATA handles do put/get/remove. */
enum { ECS__EC_H_DATA = 0, ECS__EC_H_META = 1 };

typedef struct ecs__ec_ops {
  const char *name; /* "ecstore", "disk", "redis" */
  int (*open)(const ecs_ec_config_t *cfg, int kind, void **h, char *err, size_t errlen);
  void (*close)(void *h); /* accepts NULL */
  int (*put)(void *h, const ecs_key_t *keys, const ecs_tensor_t *t, size_t n, int *status);
  int (*get)(void *h, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n);
  int (*exists)(void *h, const ecs_key_t *keys, size_t n, int *out);
  int (*remove)(void *h, const ecs_key_t *keys, size_t n, int *status);
  const char *(*errmsg)(void *h); /* last whole-batch error detail */
  const char *(*path)(void *h);   /* "tcp", "shm", "rdma", "file", "redis" */
} ecs__ec_ops_t;

extern const ecs__ec_ops_t ecs__ec_ops_ecstore;
extern const ecs__ec_ops_t ecs__ec_ops_disk;
extern const ecs__ec_ops_t ecs__ec_ops_redis;

/* The table of a backend (ECS_EC_BACKEND_*), or NULL. */
const ecs__ec_ops_t *ecs__ec_ops_for(int backend);

/* ---- the object header of the disk and redis backends ---- */

#define ECS__EC_HDR_SIZE 128
#define ECS__EC_HDR_MAGIC "ECT1"
#define ECS__EC_HDR_VERSION 1u

/* Writes the header of a tensor with these bytes' checksum. */
void ecs__ec_hdr_encode(uint8_t out[ECS__EC_HDR_SIZE], const ecs_tensor_desc_t *desc, uint64_t nbytes,
                        uint64_t checksum);

/* Reads and checks a header: magic, version, dtype/shape valid and nbytes
 * equal to the shape's size.  ECS_OK or ECS_ECHECKSUM (corrupt). */
int ecs__ec_hdr_decode(const uint8_t in[ECS__EC_HDR_SIZE], ecs_tensor_desc_t *desc, uint64_t *nbytes,
                       uint64_t *checksum);

/* Checks a tensor given to put: valid desc and nbytes equal to its size.
 * ECS_OK, ECS_EDTYPE or ECS_EINVAL. */
int ecs__ec_tensor_check(const ecs_tensor_t *t);

#endif
