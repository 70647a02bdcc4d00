/* Raw protocol peers for tests (see raw.h). */
#include "support/raw.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/auth.h"
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

/* One HELLO round trip: the record h out, the reply record into *hr. */
static int raw_hello_round(int fd, const ecs_hello_t *h, ecs_hello_reply_t *hr) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_hello_write(&w, h);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_HELLO, 0, (uint32_t)w.len, 0);
  int rc = ecs_ts_raw_send(fd, hb, sizeof hb);
  if (rc == ECS_OK)
    rc = ecs_ts_raw_send(fd, w.p, w.len);
  ecs_wbuf_free(&w);
  ecs_hdr_t rh;
  if (rc == ECS_OK)
    rc = ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + RAW_IO_MS);
  if (rc == ECS_OK)
    rc = ecs_proto_hdr_decode(hb, UINT64_MAX, &rh);
  uint8_t meta[1024];
  if (rc == ECS_OK && (rh.status != ECS_OK || rh.meta_len > sizeof meta))
    rc = rh.status != ECS_OK ? rh.status : ECS_EPROTO;
  if (rc == ECS_OK)
    rc = ecs_net_read_all(fd, meta, rh.meta_len, ecs_now_ms() + RAW_IO_MS);
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, meta, rh.meta_len);
    rc = ecs_proto_hello_reply_read(&r, hr);
  }
  return rc;
}

int ecs_ts_raw_hello_fd(int fd, const char *ns, const char *token, int clear) {
  ecs_hello_t h = {.ns = (const uint8_t *)ns, .ns_len = (uint16_t)strlen(ns)};
  ecs_hello_reply_t hr;
  if (!token || clear) {
    if (token) {
      h.token = (const uint8_t *)token;
      h.token_len = (uint16_t)strlen(token);
    }
    return raw_hello_round(fd, &h, &hr);
  }
  uint8_t key[ECS_AUTH_KEY_SIZE], id[ECS_AUTH_ID_SIZE], cn[ECS_AUTH_NONCE_SIZE], mac[ECS_AUTH_MAC_SIZE];
  ecs__auth_random(cn, sizeof cn);
  ecs__auth_key(token, strlen(token), ns, key);
  ecs__auth_key_id(key, id);
  h.client_flags = ECS_HELLO_C_CHALLENGE;
  h.key_id = id;
  h.nonce = cn;
  int rc = raw_hello_round(fd, &h, &hr);
  if (rc != ECS_OK)
    return rc;
  ecs__auth_mac(key, 1, cn, hr.snonce, ns, hr.node_id, hr.addr, mac);
  if (!hr.proof || memcmp(mac, hr.smac, sizeof mac) != 0)
    return ECS_EAUTH; /* the server did not prove the key */
  ecs__auth_mac(key, 0, cn, hr.snonce, ns, hr.node_id, hr.addr, mac);
  ecs_hello_t pv = {.ns = h.ns, .ns_len = h.ns_len, .client_flags = ECS_HELLO_C_PROVE, .mac = mac};
  return raw_hello_round(fd, &pv, &hr);
}

int ecs_ts_raw_hello_from(int port, const char *src_ip, const char *ns, const char *token, int *fd) {
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*fd < 0)
    return ECS_ECONN;
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, src_ip, &a.sin_addr);
  struct sockaddr_in d = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &d.sin_addr);
  int rc =
      bind(*fd, (struct sockaddr *)&a, sizeof a) == 0 && connect(*fd, (struct sockaddr *)&d, sizeof d) == 0
          ? ecs_ts_raw_hello_fd(*fd, ns, token, 0)
          : ECS_ECONN;
  if (rc != ECS_OK) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

int ecs_ts_raw_hello(int port, const char *ns, const char *token, int *fd) {
  int rc = ecs_net_connect("127.0.0.1", port, RAW_IO_MS, fd);
  if (rc != ECS_OK)
    return rc;
  rc = ecs_ts_raw_hello_fd(*fd, ns, token, 0);
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
