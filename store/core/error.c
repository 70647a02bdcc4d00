/* The one error table of ecstore; see include/ecstore/error.h. */
#include "ecstore/error.h"

#include <errno.h>
#include <stdlib.h>

const char *ecs_strerror(int err) {
  switch (err) {
  case ECS_OK: return "success";
#define ECS__ERR_STR(name, code, msg)                                                                        \
  case ECS_##name: return msg;
    ECS_ERRNO_MAP(ECS__ERR_STR)
#undef ECS__ERR_STR
  }
  return "unknown error";
}

const char *ecs_err_name(int err) {
  switch (err) {
  case ECS_OK: return "OK";
#define ECS__ERR_NAME(name, code, msg)                                                                       \
  case ECS_##name: return #name;
    ECS_ERRNO_MAP(ECS__ERR_NAME)
#undef ECS__ERR_NAME
  }
  return "UNKNOWN";
}

int ecs_from_errno(int e) {
  switch (abs(e)) {
  case 0: return ECS_OK;
  case EINVAL: return ECS_EINVAL;
  case ENOMEM: return ECS_ENOMEM;
  case ENOSPC: return ECS_ENOSPC;
  case ETIMEDOUT:
  case EAGAIN: return ECS_ETIMEDOUT;
  case ECONNREFUSED:
  case ECONNRESET:
  case EPIPE:
  case ENOTCONN:
  case EHOSTUNREACH:
  case ENETUNREACH: return ECS_ECONN;
  case ENODEV:
  case ENOENT: return ECS_ENODEV;
  case ENOTSUP: return ECS_ENOTSUP;
  case EBUSY: return ECS_EBUSY;
  case ECANCELED: return ECS_ECANCELED;
  case EOVERFLOW: return ECS_EOVERFLOW;
  default: return ECS_EIO;
  }
}
