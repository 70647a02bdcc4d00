/*
 * Helpers shared by the example programs (see ex_util.h).
 */
#include "examples/ex_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "examples/ex_model.h"
#include "store/core/net.h"
#include "store/core/parse.h"

volatile sig_atomic_t ex_stop;

static void ex_on_stop(int sig) {
  (void)sig;
  ex_stop = 1;
}

void ex_signals_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = ex_on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

uint64_t ex_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int ex_listen(const char *hostport, const char *port_file, int *fd, int *port) {
  char host[128];
  int p, rc = ecs_net_parse_hostport(hostport, host, sizeof host, &p);
  if (rc != ECS_OK)
    return rc;
  if ((rc = ecs_net_listen(host, p, 128, fd)) != ECS_OK)
    return rc;
  *port = ecs_net_local_port(*fd);
  if (port_file != NULL && port_file[0] != '\0') {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%d\n", *port) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0) {
      close(*fd);
      return ECS_EIO;
    }
  }
  return ECS_OK;
}

int ex_accept(int lfd, int timeout_ms) {
  struct pollfd pfd = {lfd, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0)
    return -1;
  int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0)
    return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int ex_parse_wh(const char *s, uint32_t *w, uint32_t *h) {
  char *end;
  errno = 0;
  unsigned long a = strtoul(s, &end, 10);
  if (end == s || (*end != 'x' && *end != 'X'))
    return -1;
  const char *b = end + 1;
  unsigned long c = strtoul(b, &end, 10);
  if (end == b || *end != '\0' || errno != 0 || a == 0 || c == 0 || a > EX_MAX_SIDE || c > EX_MAX_SIDE)
    return -1;
  *w = (uint32_t)a;
  *h = (uint32_t)c;
  return 0;
}

long long ex_opt_int(const char *opt, const char *val, long long lo, long long hi) {
  long long v;
  if (val == NULL || ecs_parse_int(val, lo, hi, &v) != ECS_OK) {
    fprintf(stderr, "error: %s wants a whole number in [%lld, %lld], got '%s'\n", opt, lo, hi,
            val ? val : "(nothing)");
    exit(2);
  }
  return v;
}

size_t ex_split_list(char *s, char **items, size_t max) {
  size_t n = 0;
  char *save = NULL;
  for (char *t = strtok_r(s, ",", &save); t != NULL && n < max; t = strtok_r(NULL, ",", &save))
    if (*t != '\0')
      items[n++] = t;
  return n;
}

static int ex_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double ex_pct(double *v, size_t n, double p) {
  if (n == 0)
    return 0.0;
  qsort(v, n, sizeof *v, ex_cmp_double);
  size_t rank = (size_t)((p / 100.0) * (double)n + 0.999999);
  if (rank == 0)
    rank = 1;
  if (rank > n)
    rank = n;
  return v[rank - 1];
}

double ex_mean(const double *v, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += v[i];
  return n ? s / (double)n : 0.0;
}
