/* Raw protocol peers for tests (see raw.h). */
#include "support/raw.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/net.h"
#include "store/core/proto.h"

#define RAW_IO_MS 2000 /* bound on each send and on the HELLO reply */

void ecs_ts_fill(void *p, size_t n, uint32_t seed) {
  uint8_t *b = p;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b[i] = (uint8_t)x;
  }
}

int ecs_ts_raw_send(int fd, const void *p, size_t n) {
  struct iovec iov = {(void *)p, n};
  return ecs_net_writev_all(fd, &iov, 1, ecs_now_ms() + RAW_IO_MS);
}

void ecs_ts_raw_hdr(uint8_t out[32], uint8_t op, uint32_t count, uint32_t meta_len, uint64_t data_len) {
  ecs_hdr_t hd = {.magic = ECS_PROTO_MAGIC,
                  .version = ECS_PROTO_VERSION,
                  .opcode = op,
                  .req_id = 7,
                  .count = count,
                  .meta_len = meta_len,
                  .data_len = data_len};
  ecs_proto_hdr_encode(&hd, out);
}

int ecs_ts_raw_open(int port, const char *ns, int *fd) {
  return ecs_ts_raw_hello(port, ns, NULL, fd);
}

int ecs_ts_raw_hello(int port, const char *ns, const char *token, int *fd) {
  int rc = ecs_net_connect("127.0.0.1", port, RAW_IO_MS, fd);
  if (rc != ECS_OK)
    return rc;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hello_t h = {.ns = (const uint8_t *)ns, .ns_len = (uint16_t)strlen(ns)};
  if (token) {
    h.token = (const uint8_t *)token;
    h.token_len = (uint16_t)strlen(token);
  }
  ecs_proto_hello_write(&w, &h);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_HELLO, 0, (uint32_t)w.len, 0);
  rc = ecs_ts_raw_send(*fd, hb, sizeof hb);
  if (rc == ECS_OK)
    rc = ecs_ts_raw_send(*fd, w.p, w.len);
  ecs_wbuf_free(&w);
  ecs_hdr_t rh;
  if (rc == ECS_OK)
    rc = ecs_net_read_all(*fd, hb, sizeof hb, ecs_now_ms() + RAW_IO_MS);
  if (rc == ECS_OK)
    rc = ecs_proto_hdr_decode(hb, UINT64_MAX, &rh);
  uint8_t skip[512];
  if (rc == ECS_OK && (rh.status != ECS_OK || rh.meta_len > sizeof skip))
    rc = rh.status != ECS_OK ? rh.status : ECS_EPROTO;
  if (rc == ECS_OK)
    rc = ecs_net_read_all(*fd, skip, rh.meta_len, ecs_now_ms() + RAW_IO_MS);
  if (rc != ECS_OK) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

long ecs_ts_raw_wait_close(int fd, int timeout_ms) {
  uint64_t t0 = ecs_now_ms(), end = t0 + (uint64_t)timeout_ms;
  uint8_t buf[65536];
  for (;;) {
    uint64_t now = ecs_now_ms();
    if (now >= end)
      return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, (int)(end - now));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      continue;
    ssize_t r = read(fd, buf, sizeof buf);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return (long)(ecs_now_ms() - t0);
  }
}
