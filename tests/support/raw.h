/*
 * Raw protocol peers, for tests that must misbehave on the wire: stall in
 * the middle of a request, never read a reply.  A well-behaved client
 * (libecstore) cannot be made to do that, so these speak the protocol by
 * hand through store/core/proto.h.  Every wait is bounded.
 */
#ifndef ECS_TS_RAW_H
#define ECS_TS_RAW_H

#include <stddef.h>
#include <stdint.h>

/* Connects to 127.0.0.1:port and says HELLO with namespace ns (no token).
 * ECS_OK (*fd is the socket) or an ECS_E* code. */
int ecs_ts_raw_open(int port, const char *ns, int *fd);

/* ecs_ts_raw_open with an auth token (NULL: none), proved as libecstore
 * does (the server's proof checked: ECS_EAUTH when it fails). */
int ecs_ts_raw_hello(int port, const char *ns, const char *token, int *fd);

/* The HELLO of ecs_ts_raw_hello on a connected socket; clear: send the
 * token in the clear as clients before the proof did. */
int ecs_ts_raw_hello_fd(int fd, const char *ns, const char *token, int clear);

/* ecs_ts_raw_hello from the IPv4 source address src_ip (127.x.y.z). */
int ecs_ts_raw_hello_from(int port, const char *src_ip, const char *ns, const char *token, int *fd);

/* Writes all n bytes within 2 s.  ECS_OK or an ECS_E* code. */
int ecs_ts_raw_send(int fd, const void *p, size_t n);

/* Encodes a request header (magic, ECS_PROTO_VERSION, req_id 7) into out[32]. */
void ecs_ts_raw_hdr(uint8_t out[32], uint8_t op, uint32_t count, uint32_t meta_len, uint64_t data_len);

/* Reads and discards whatever arrives until the peer closes.  Returns the
 * milliseconds it took (>= 0), or -1 when the peer still had not closed
 * after timeout_ms. */
long ecs_ts_raw_wait_close(int fd, int timeout_ms);

/* Fills n bytes from a xorshift32 seeded by seed (the tests' usual data). */
void ecs_ts_fill(void *p, size_t n, uint32_t seed);

#endif
