/*
 * ecstore error codes.
 *
 * Every ecstore function that can fail returns 0 on success or one of the
 * negative ECS_E* codes below; batch calls also return one such code per
 * item.  The table is an X-macro so that the enum, ecs_strerror() and
 * ecs_err_name() can never disagree.  Codes are stable: they travel on the
 * wire (docs/protocol.md), so new ones are only ever appended.
 *
 * Thread safety: every function here is thread-safe and returns a pointer to
 * a static string that must not be freed.
 */
#ifndef ECSTORE_ERROR_H
#define ECSTORE_ERROR_H

#include "ecstore/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ECS_ERRNO_MAP(X)                                                                                     \
  X(EINVAL, -1, "invalid argument")                                                                          \
  X(ENOMEM, -2, "out of host memory")                                                                        \
  X(ENOSPC, -3, "no space left in the pool")                                                                 \
  X(ETOOBIG, -4, "object larger than the pool can ever hold")                                                \
  X(ENOTFOUND, -5, "key not found")                                                                          \
  X(ECONFLICT, -6, "key exists with different content")                                                      \
  X(ETIMEDOUT, -7, "deadline exceeded")                                                                      \
  X(ECONN, -8, "connection failed or closed")                                                                \
  X(EPROTO, -9, "protocol error")                                                                            \
  X(ECHECKSUM, -10, "checksum mismatch")                                                                     \
  X(EBUFSMALL, -11, "buffer too small")                                                                      \
  X(EDOUBLEFREE, -12, "block already free")                                                                  \
  X(EBADFREE, -13, "offset was never handed out")                                                            \
  X(EBADSIZE, -14, "free with a size other than the allocated one")                                          \
  X(EREDIS, -15, "redis error")                                                                              \
  X(EAUTH, -16, "authentication failed")                                                                     \
  X(EIO, -17, "input/output error")                                                                          \
  X(EBUSY, -18, "resource busy")                                                                             \
  X(ESTALE, -19, "stale record (node restarted)")                                                            \
  X(ENOTSUP, -20, "operation not supported")                                                                 \
  X(ENODEV, -21, "no such device")                                                                           \
  X(ECORRUPT, -22, "internal invariant violated")                                                            \
  X(ECANCELED, -23, "operation canceled")                                                                    \
  X(EKEY, -24, "invalid key")                                                                                \
  X(EDTYPE, -25, "invalid dtype or shape")                                                                   \
  X(ENOTCONN, -26, "not connected")                                                                          \
  X(EOVERFLOW, -27, "value too large for its field")                                                         \
  X(ECODEC, -28, "compression codec error")                                                                  \
  X(EPERM, -29, "permission denied (the token lacks the right)")                                             \
  X(EQUOTA, -30, "the token's quota is spent (--acl-file quota)")                                            \
  X(EPINQUOTA, -31, "hard pins would pass their quota (--hard-pin-max, or the tenant's share of it)")

typedef enum ecs_errno {
  ECS_OK = 0,
#define ECS__ERR_ENUM(name, code, msg) ECS_##name = (code),
  ECS_ERRNO_MAP(ECS__ERR_ENUM)
#undef ECS__ERR_ENUM
} ecs_errno_t;

/* A short human-readable message for an ECS_* code (or "unknown error"). */
ECS_API const char *ecs_strerror(int err);

/* The code's name without the ECS_ prefix, e.g. "ENOSPC" (or "UNKNOWN"). */
ECS_API const char *ecs_err_name(int err);

/* Maps a positive or negative errno(3) value to the nearest ECS_* code. */
ECS_API int ecs_from_errno(int e);

#ifdef __cplusplus
}
#endif
#endif /* ECSTORE_ERROR_H */
