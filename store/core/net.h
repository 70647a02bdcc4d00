/*
 * Socket helpers shared by the server and the client: address parsing,
 * listening, connecting with a deadline, and whole-buffer I/O bounded by a
 * deadline.  All sockets are non-blocking; waits use poll(2).
 *
 * Thread safety: every function is thread-safe (no shared state).
 */
#ifndef ECS_NET_H
#define ECS_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Monotonic milliseconds, and wall-clock milliseconds / microseconds. */
uint64_t ecs_now_ms(void);
uint64_t ecs_wall_ms(void);
uint64_t ecs_wall_us(void);

/* Splits "HOST:PORT" (or "[v6]:PORT") into host and port.  ECS_OK or
 * ECS_EINVAL (missing/invalid port, host too long). */
int ecs_net_parse_hostport(const char *s, char *host, size_t host_cap, int *port);

/* A non-blocking listening TCP socket bound to host:port (SO_REUSEADDR).
 * backlog < 0: bound only; the caller calls listen(2) later. */
int ecs_net_listen(const char *host, int port, int backlog, int *fd_out);

/* The port a socket is bound to (for --listen HOST:0), or -1. */
int ecs_net_local_port(int fd);

/* Connects to host:port within timeout_ms; the socket is non-blocking with
 * TCP_NODELAY.  ECS_OK, ECS_ECONN (refused, unreachable, bad host) or
 * ECS_ETIMEDOUT.  On ECS_ECONN, errno holds the cause (ECONNREFUSED,
 * EHOSTUNREACH for a name that does not resolve, ...). */
int ecs_net_connect(const char *host, int port, int timeout_ms, int *fd_out);

/* Sets O_NONBLOCK and FD_CLOEXEC. */
int ecs_net_set_nonblock(int fd);

/* Drops n bytes from the front of an iovec array, updating *iov / *cnt. */
void ecs_iov_advance(struct iovec **iov, int *cnt, size_t n);

/* Writes every byte of iov[0..cnt) (the array is modified) before the
 * monotonic deadline_ms.  ECS_OK, ECS_ETIMEDOUT or ECS_ECONN. */
int ecs_net_writev_all(int fd, struct iovec *iov, int cnt, uint64_t deadline_ms);

/* Reads exactly the bytes of iov[0..cnt) (the array is modified) before
 * the deadline.  ECS_OK, ECS_ETIMEDOUT or ECS_ECONN (EOF or error). */
int ecs_net_readv_all(int fd, struct iovec *iov, int cnt, uint64_t deadline_ms);

/* read_all of one buffer that may carry one SCM_RIGHTS descriptor; *passed
 * is the descriptor received (close-on-exec) or -1. */
int ecs_net_read_all_fd(int fd, void *buf, size_t n, uint64_t deadline_ms, int *passed);

/* Connects a non-blocking Unix stream socket to path before the deadline.
 * ECS_OK, ECS_ECONN or ECS_ETIMEDOUT. */
int ecs_net_connect_unix(const char *path, uint64_t deadline_ms, int *fd_out);

/* The uid of the process at the other end of a connected Unix socket, as
 * the kernel recorded it at connect() or listen() (SO_PEERCRED).  ECS_OK
 * or ECS_ECONN. */
int ecs_net_peer_uid(int fd, unsigned *uid);

/* 1 when the peer of connected TCP socket fd is on this host (a loopback
 * address, or an address of one of its interfaces), else 0. */
int ecs_net_peer_is_local(int fd);

/* For a TCP connection within this host (the peer's address is a
 * loopback one, or the socket's own: the kernel routes both through the
 * loopback device), sets the "reno" congestion control on fd.  A
 * congestion controller has nothing to model on loopback, and the
 * system's may cost a lot there: BBR (a common default) paces its sends
 * with hrtimers and tasklets, which on loopback, where the receiver's TCP
 * runs on the sender's CPU, took 35-40% more CPU per 2 MiB get reply
 * (docs/bench-results/2026-11-25-issue12-get.md).  Reno is always
 * built in and any user may choose it.  A connection to another host keeps
 * the system's choice.  Returns 1 when set, 0 when left as it was (not
 * local, or refused). */
int ecs_net_tune_local(int fd);

/* readv_all of one buffer. */
int ecs_net_read_all(int fd, void *buf, size_t n, uint64_t deadline_ms);

/* Constant-time comparison of two byte strings (lengths compared too). */
int ecs_ct_equal(const void *a, size_t alen, const void *b, size_t blen);

#endif
