/* Internal client entry points for tests (not installed). */
#ifndef ECS_CLIENT_INTERNAL_H
#define ECS_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/ecstore.h"

/* Asks the server owning key to flip one byte of the stored object (the
 * server must run with --enable-debug-ops).  ECS_OK, ECS_ENOTFOUND or
 * ECS_ENOTSUP. */
int ecs__client_debug_corrupt(ecs_client_t *c, const void *key, size_t key_len);

/* The socket of server i (-1 when not connected), for fault tests. */
int ecs__client_server_fd(ecs_client_t *c, size_t server);

/* Drops server i's connection and opens it again (connect, HELLO, the
 * transport's upgrade) as a call with left_ms of its deadline left does:
 * for tests of the reconnect's bound. */
int ecs__client_reconnect(ecs_client_t *c, size_t server, int left_ms);

/* The QP number of server i's RDMA endpoint (fault-injection tests). */
int ecs__client_rdma_qpn(ecs_client_t *c, size_t server, uint32_t *qpn);

#endif
