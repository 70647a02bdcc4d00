/*
 * Connections within one host leave the system's congestion control for
 * reno (store/core/net.h, ecs_net_tune_local): BBR, a common default, paces
 * its sends, and on loopback that cost 35-40% more CPU per get reply
 * (docs/bench-results/2026-11-25-issue12-get.md).
 *
 * The unit part checks the helper on a loopback pair (and that a Unix
 * socket is left alone).  The integration part checks both ends of a real
 * client's connection to a real ecstore-server: the client's socket with
 * getsockopt, the server's (in another process) through the kernel's
 * socket diagnostics (NETLINK_SOCK_DIAG, what `ss -i` reads), after a put
 * and a get of a 2 MiB batch whose bytes are compared.
 *
 * On a machine whose default is already reno this passes without the fix;
 * with any other default (bbr, cubic) it fails without it.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "support/fixture.h"

/* The congestion control of fd (a TCP socket) into out. */
static int cc_of(int fd, char *out, size_t cap) {
  socklen_t len = (socklen_t)(cap - 1);
  memset(out, 0, cap);
  return getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, out, &len);
}

/* A connected loopback pair: *a the connecting end, *b the accepted one. */
static void loopback_pair(int *a, int *b) {
  int l;
  assert_int_equal(ecs_net_listen("127.0.0.1", 0, 4, &l), ECS_OK);
  assert_int_equal(ecs_net_connect("127.0.0.1", ecs_net_local_port(l), 2000, a), ECS_OK);
  *b = -1;
  for (int i = 0; i < 200 && *b < 0; i++) {
    *b = accept(l, NULL, NULL);
    if (*b < 0)
      usleep(10000);
  }
  assert_true(*b >= 0);
  close(l);
}

static void test_helper_sets_reno_on_loopback(void **state) {
  (void)state;
  int a, b;
  loopback_pair(&a, &b);
  assert_int_equal(ecs_net_tune_local(a), 1);
  assert_int_equal(ecs_net_tune_local(b), 1);
  char cc[32];
  assert_int_equal(cc_of(a, cc, sizeof cc), 0);
  assert_string_equal(cc, "reno");
  assert_int_equal(cc_of(b, cc, sizeof cc), 0);
  assert_string_equal(cc, "reno");
  close(a);
  close(b);
}

/* A pair over ::1, when this host has IPv6 loopback (else skipped). */
static void test_helper_sets_reno_on_ipv6_loopback(void **state) {
  (void)state;
  int l;
  if (ecs_net_listen("::1", 0, 4, &l) != ECS_OK) {
    printf("skip: test_helper_sets_reno_on_ipv6_loopback: cannot listen on ::1 (no IPv6 loopback here)\n");
    skip();
    return;
  }
  int a, b = -1;
  assert_int_equal(ecs_net_connect("::1", ecs_net_local_port(l), 2000, &a), ECS_OK);
  for (int i = 0; i < 200 && b < 0; i++) {
    b = accept(l, NULL, NULL);
    if (b < 0)
      usleep(10000);
  }
  assert_true(b >= 0);
  assert_int_equal(ecs_net_tune_local(a), 1);
  assert_int_equal(ecs_net_tune_local(b), 1);
  char cc[32];
  assert_int_equal(cc_of(b, cc, sizeof cc), 0);
  assert_string_equal(cc, "reno");
  close(a);
  close(b);
  close(l);
}

/* A connection to one of this host's own non-loopback addresses goes
 * through lo too: tuned (skipped when the host has no such address). */
static void test_helper_sets_reno_to_own_address(void **state) {
  (void)state;
  struct ifaddrs *ifs = NULL;
  char host[INET_ADDRSTRLEN] = "";
  if (getifaddrs(&ifs) == 0) {
    for (struct ifaddrs *i = ifs; i && !host[0]; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
        continue;
      const struct in_addr *in = &((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
      if ((ntohl(in->s_addr) >> 24) != 127)
        inet_ntop(AF_INET, in, host, sizeof host);
    }
    freeifaddrs(ifs);
  }
  int l;
  if (!host[0] || ecs_net_listen(host, 0, 4, &l) != ECS_OK) {
    printf("skip: test_helper_sets_reno_to_own_address: %s\n",
           host[0] ? "cannot listen on this host's own address"
                   : "this host has no non-loopback IPv4 address");
    skip();
    return;
  }
  int a, b = -1;
  assert_int_equal(ecs_net_connect(host, ecs_net_local_port(l), 2000, &a), ECS_OK);
  for (int i = 0; i < 200 && b < 0; i++) {
    b = accept(l, NULL, NULL);
    if (b < 0)
      usleep(10000);
  }
  assert_true(b >= 0);
  assert_int_equal(ecs_net_tune_local(a), 1);
  assert_int_equal(ecs_net_tune_local(b), 1);
  char cc[32];
  assert_int_equal(cc_of(a, cc, sizeof cc), 0);
  assert_string_equal(cc, "reno");
  close(a);
  close(b);
  close(l);
}

static void test_helper_leaves_unix_sockets(void **state) {
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  assert_int_equal(ecs_net_tune_local(sv[0]), 0);
  assert_int_equal(ecs_net_tune_local(-1), 0);
  close(sv[0]);
  close(sv[1]);
}

/* The congestion control of the established IPv4 TCP socket whose local
 * port is sport and remote port dport, as the kernel reports it to a
 * socket-diagnostics dump (any process's socket).  0, or -1 when it was
 * not found. */
static int diag_cc(int sport, int dport, char *out, size_t cap) {
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0)
    return -1;
  struct timeval tv = {5, 0};
  setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct {
    struct nlmsghdr nh;
    struct inet_diag_req_v2 r;
  } req;
  memset(&req, 0, sizeof req);
  req.nh.nlmsg_len = sizeof req;
  req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.r.sdiag_family = AF_INET;
  req.r.sdiag_protocol = IPPROTO_TCP;
  req.r.idiag_states = 1u << 1; /* TCP_ESTABLISHED */
  req.r.idiag_ext = 1u << (INET_DIAG_CONG - 1);
  int found = -1;
  if (send(nl, &req, sizeof req, 0) != (ssize_t)sizeof req) {
    close(nl);
    return -1;
  }
  static char buf[1 << 16];
  for (int done = 0; !done;) {
    ssize_t n = recv(nl, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
        done = 1;
        break;
      }
      struct inet_diag_msg *m = NLMSG_DATA(h);
      if (ntohs(m->id.idiag_sport) != sport || ntohs(m->id.idiag_dport) != dport)
        continue;
      int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
      for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
        if (a->rta_type != INET_DIAG_CONG)
          continue;
        size_t k = (size_t)RTA_PAYLOAD(a) < cap - 1 ? (size_t)RTA_PAYLOAD(a) : cap - 1;
        memcpy(out, RTA_DATA(a), k);
        out[k] = '\0';
        found = 0;
      }
    }
  }
  close(nl);
  return found;
}

static void test_both_ends_of_a_real_connection(void **state) {
  (void)state;
  ecs_ts_env_t env;
  memset(&env, 0, sizeof env);
  assert_int_equal(ecs_ts_env_start(&env, NULL), 0);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, env.servers, "tcp");
  ecs_client_t *c = ecs_ts_connect(&cfg);
  assert_non_null(c);

  /* a 32 x 64 KiB batch there and back: the bytes are right */
  enum { N = 32, SZ = 64 << 10 };
  ecs_key_t keys[N];
  ecs_tensor_t ts[N];
  ecs_get_buf_t gb[N];
  char names[N][16];
  uint8_t *src = malloc((size_t)N * SZ), *dst = calloc((size_t)N, SZ);
  assert_non_null(src);
  assert_non_null(dst);
  for (size_t i = 0; i < (size_t)N * SZ; i++)
    src[i] = (uint8_t)(i * 131 + (i >> 16));
  int st[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "cc-%d", i);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    ts[i] = (ecs_tensor_t){.desc = {.dtype = ECS_DTYPE_U8, .ndim = 1, .shape = {SZ}},
                           .data = src + (size_t)i * SZ,
                           .nbytes = SZ};
    gb[i] = (ecs_get_buf_t){.data = dst + (size_t)i * SZ, .capacity = SZ};
  }
  assert_int_equal(ecs_put_batch(c, keys, ts, N, st), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(ecs_get_batch(c, keys, gb, N), ECS_OK);
  for (int i = 0; i < N; i++) {
    assert_int_equal(gb[i].status, ECS_OK);
    assert_int_equal(gb[i].nbytes, SZ);
  }
  assert_memory_equal(src, dst, (size_t)N * SZ);

  int fd = ecs__client_server_fd(c, 0);
  assert_true(fd >= 0);
  char cc[32];
  assert_int_equal(cc_of(fd, cc, sizeof cc), 0);
  assert_string_equal(cc, "reno"); /* the client's end (puts) */
  int mine = ecs_net_local_port(fd);
  assert_true(mine > 0);
  assert_int_equal(diag_cc(env.server.port, mine, cc, sizeof cc), 0);
  assert_string_equal(cc, "reno"); /* the server's end (get replies) */

  free(src);
  free(dst);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&env), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_helper_sets_reno_on_loopback),
      cmocka_unit_test(test_helper_sets_reno_on_ipv6_loopback),
      cmocka_unit_test(test_helper_sets_reno_to_own_address),
      cmocka_unit_test(test_helper_leaves_unix_sockets),
      cmocka_unit_test(test_both_ends_of_a_real_connection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
