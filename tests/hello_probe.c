/*
 * ecs-hello-probe: what a server's HELLO reply hands a client, read off the
 * wire, for tests/netns_shm_secret.sh (review finding A1: the shm upgrade
 * secret must reach only clients on the server's host).
 *
 *   hello HOST:PORT NS [TOKEN_FILE]
 *       says HELLO on a fresh TCP connection (with a token: CHALLENGE, the
 *       server's proof checked, then PROVE; without: a plain HELLO), and
 *       prints the final reply's flags word as it came on the wire and what
 *       follows the shm path:
 *         "hello flags=0xF upgrade=issued|none shm_path=PATH"
 *       exit 0 when the HELLO was accepted
 *   connect HOST:PORT NS [TOKEN_FILE]
 *       connects with libecstore (transport auto) and pings; prints
 *       "transport=T" (ecs_client_transport); exit 0 when the ping worked
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ecstore/ecstore.h"
#include "store/core/auth.h"
#include "store/core/net.h"
#include "store/core/proto.h"

#define TIMEOUT_MS 5000

static int read_token(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f || !fgets(out, (int)cap, f)) {
    if (f)
      fclose(f);
    return -1;
  }
  fclose(f);
  out[strcspn(out, "\r\n")] = '\0';
  return 0;
}

/* One HELLO round trip: the record in w out, the reply's meta into meta
 * (at most cap bytes, its length in *len). */
static int hello_rt(int fd, const ecs_wbuf_t *w, uint8_t *meta, size_t cap, size_t *len) {
  static uint32_t id;
  uint64_t deadline = ecs_now_ms() + TIMEOUT_MS;
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = ECS_OP_HELLO,
                 .req_id = ++id,
                 .meta_len = (uint32_t)w->len};
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, hb);
  struct iovec iov[2] = {{.iov_base = hb, .iov_len = sizeof hb}, {.iov_base = w->p, .iov_len = w->len}};
  if (ecs_net_writev_all(fd, iov, 2, deadline) || ecs_net_read_all(fd, hb, sizeof hb, deadline)) {
    fprintf(stderr, "ecs-hello-probe: HELLO: connection failed\n");
    return -1;
  }
  if (ecs_proto_hdr_decode(hb, 0, &h) || h.opcode != ECS_OP_HELLO || h.req_id != id || h.meta_len > cap) {
    fprintf(stderr, "ecs-hello-probe: HELLO: malformed reply\n");
    return -1;
  }
  if (ecs_net_read_all(fd, meta, h.meta_len, deadline))
    return -1;
  if (h.status != ECS_OK) {
    fprintf(stderr, "ecs-hello-probe: HELLO refused: %s\n", ecs_strerror(h.status));
    return -1;
  }
  *len = h.meta_len;
  return 0;
}

static int cmd_hello(const char *host, int port, const char *ns, const char *token) {
  int fd;
  if (ecs_net_connect(host, port, TIMEOUT_MS, &fd)) {
    fprintf(stderr, "ecs-hello-probe: cannot connect to %s:%d\n", host, port);
    return 1;
  }
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hello_t hl = {.ns = (const uint8_t *)ns, .ns_len = (uint16_t)strlen(ns)};
  uint8_t meta[4096];
  size_t len = 0;
  int rc = 0;
  if (token) {
    uint8_t key[ECS_AUTH_KEY_SIZE], kid[ECS_AUTH_ID_SIZE], cn[ECS_AUTH_NONCE_SIZE], mac[ECS_AUTH_MAC_SIZE];
    ecs__auth_key(token, strlen(token), ns, key);
    ecs__auth_key_id(key, kid);
    rc = ecs__auth_random(cn, sizeof cn);
    hl.client_flags = ECS_HELLO_C_CHALLENGE;
    hl.key_id = kid;
    hl.nonce = cn;
    ecs_proto_hello_write(&w, &hl);
    ecs_hello_reply_t hr;
    ecs_rbuf_t r;
    if (rc == 0)
      rc = hello_rt(fd, &w, meta, sizeof meta, &len);
    if (rc == 0) {
      ecs_rbuf_init(&r, meta, len);
      rc = ecs_proto_hello_reply_read(&r, &hr) == ECS_OK && hr.proof ? 0 : -1;
    }
    if (rc == 0) {
      ecs__auth_mac(key, 1, cn, hr.snonce, ns, hr.node_id, hr.addr, mac);
      rc = ecs_ct_equal(mac, sizeof mac, hr.smac, sizeof hr.smac) ? 0 : -1;
      if (rc)
        fprintf(stderr, "ecs-hello-probe: the server's proof is wrong\n");
    }
    if (rc == 0) {
      ecs__auth_mac(key, 0, cn, hr.snonce, ns, hr.node_id, hr.addr, mac);
      ecs_hello_t pv = {.ns = hl.ns, .ns_len = hl.ns_len, .client_flags = ECS_HELLO_C_PROVE, .mac = mac};
      ecs_wbuf_reset(&w);
      ecs_proto_hello_write(&w, &pv);
      rc = hello_rt(fd, &w, meta, sizeof meta, &len);
    }
  } else {
    ecs_proto_hello_write(&w, &hl);
    rc = hello_rt(fd, &w, meta, sizeof meta, &len);
  }
  ecs_wbuf_free(&w);
  close(fd);
  if (rc)
    return 1;
  /* the flags word straight from the bytes (offset 2, little-endian), then
   * the record as the client library decodes it */
  ecs_hello_reply_t hr;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, len);
  if (len < 4 || ecs_proto_hello_reply_read(&r, &hr) != ECS_OK) {
    fprintf(stderr, "ecs-hello-probe: malformed HELLO reply record\n");
    return 1;
  }
  unsigned flags = (unsigned)meta[3] << 8 | meta[2];
  int secret = 0;
  for (size_t i = 0; i < sizeof hr.upgrade_secret; i++)
    secret |= hr.upgrade_secret[i];
  printf("hello flags=0x%x upgrade=%s shm_path=%s\n", flags,
         (flags & ECS_HELLO_F_UPGRADE) || hr.upgrade_id || secret ? "issued" : "none", hr.shm_path);
  return 0;
}

static int cmd_connect(const char *addr, const char *ns, const char *token) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = addr;
  cfg.ns = ns;
  cfg.auth_token = token;
  cfg.timeout_ms = TIMEOUT_MS;
  ecs_client_t *c = NULL;
  char err[300] = "";
  int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
  if (rc == ECS_OK)
    rc = ecs_ping(c);
  if (rc) {
    fprintf(stderr, "ecs-hello-probe: connect %s: %s: %s\n", addr, ecs_strerror(rc),
            c ? ecs_client_errmsg(c) : err);
    ecs_client_close(c);
    return 1;
  }
  printf("transport=%s\n", ecs_client_transport(c));
  ecs_client_close(c);
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 4 || argc > 5) {
    fprintf(stderr, "usage: ecs-hello-probe hello|connect HOST:PORT NS [TOKEN_FILE]\n");
    return 2;
  }
  char host[256], token[300];
  int port = 0;
  if (ecs_net_parse_hostport(argv[2], host, sizeof host, &port) || port <= 0) {
    fprintf(stderr, "ecs-hello-probe: bad address '%s'\n", argv[2]);
    return 2;
  }
  if (argc == 5 && read_token(argv[4], token, sizeof token)) {
    fprintf(stderr, "ecs-hello-probe: cannot read a token from %s\n", argv[4]);
    return 2;
  }
  const char *tok = argc == 5 ? token : NULL;
  if (!strcmp(argv[1], "hello"))
    return cmd_hello(host, port, argv[3], tok);
  if (!strcmp(argv[1], "connect"))
    return cmd_connect(argv[2], argv[3], tok);
  fprintf(stderr, "ecs-hello-probe: unknown command '%s'\n", argv[1]);
  return 2;
}
