/* Socket helpers; see net.h. */
#include "store/core/net.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ecstore/error.h"

uint64_t ecs_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t ecs_wall_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t ecs_wall_ms(void) {
  return ecs_wall_us() / 1000u;
}

int ecs_net_parse_hostport(const char *s, char *host, size_t host_cap, int *port) {
  if (!s || !*s)
    return ECS_EINVAL;
  const char *colon;
  const char *hstart = s;
  size_t hlen;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return ECS_EINVAL;
    hstart = s + 1;
    hlen = (size_t)(close - hstart);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return ECS_EINVAL;
    hlen = (size_t)(colon - s);
  }
  if (hlen == 0 || hlen >= host_cap)
    return ECS_EINVAL;
  char *end = NULL;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (errno || end == colon + 1 || *end != '\0' || p < 0 || p > 65535)
    return ECS_EINVAL;
  memcpy(host, hstart, hlen);
  host[hlen] = '\0';
  *port = (int)p;
  return ECS_OK;
}

int ecs_net_set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return ecs_from_errno(errno);
  int fdfl = fcntl(fd, F_GETFD, 0);
  if (fdfl >= 0)
    (void)fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC);
  return ECS_OK;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  return getaddrinfo(host, ps, &hints, res) == 0 ? ECS_OK : ECS_ECONN;
}

int ecs_net_listen(const char *host, int port, int backlog, int *fd_out) {
  struct addrinfo *res = NULL;
  int rc = resolve(host, port, 1, &res);
  if (rc)
    return ECS_EINVAL;
  rc = ECS_EIO;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && (backlog < 0 || listen(fd, backlog) == 0) &&
        ecs_net_set_nonblock(fd) == ECS_OK) {
      *fd_out = fd;
      rc = ECS_OK;
      break;
    }
    rc = ecs_from_errno(errno);
    close(fd);
  }
  freeaddrinfo(res);
  return rc;
}

int ecs_net_local_port(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
    return -1;
  if (ss.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return -1;
}

static int remaining_ms(uint64_t deadline_ms) {
  uint64_t now = ecs_now_ms();
  if (now >= deadline_ms)
    return 0;
  uint64_t left = deadline_ms - now;
  return left > INT_MAX ? INT_MAX : (int)left;
}

/* Waits for events on fd until the deadline.  ECS_OK or ECS_ETIMEDOUT. */
static int wait_fd(int fd, short events, uint64_t deadline_ms) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int left = remaining_ms(deadline_ms);
    if (left == 0)
      return ECS_ETIMEDOUT;
    int n = poll(&p, 1, left);
    if (n > 0)
      return ECS_OK;
    if (n == 0)
      return ECS_ETIMEDOUT;
    if (errno != EINTR)
      return ECS_ECONN;
  }
}

int ecs_net_connect(const char *host, int port, int timeout_ms, int *fd_out) {
  struct addrinfo *res = NULL;
  if (resolve(host, port, 0, &res)) {
    errno = EHOSTUNREACH; /* a name that does not resolve, told apart from a refusal */
    return ECS_ECONN;
  }
  uint64_t deadline = ecs_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
  int rc = ECS_ECONN;
  int last_err = ECONNREFUSED;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      rc = ECS_OK;
    } else if (errno == EINPROGRESS) {
      rc = wait_fd(fd, POLLOUT, deadline);
      if (rc == ECS_OK) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
          rc = ECS_ECONN;
          last_err = err ? err : errno;
        }
      }
    } else {
      rc = ECS_ECONN;
      last_err = errno;
    }
    if (rc == ECS_OK) {
      *fd_out = fd;
      break;
    }
    close(fd);
    if (rc == ECS_ETIMEDOUT)
      break;
  }
  freeaddrinfo(res);
  if (rc == ECS_ECONN)
    errno = last_err; /* callers name the cause: "connection refused" says what to check */
  return rc;
}

void ecs_iov_advance(struct iovec **iov, int *cnt, size_t n) {
  while (n > 0 && *cnt > 0) {
    if (n >= (*iov)->iov_len) {
      n -= (*iov)->iov_len;
      (*iov)++;
      (*cnt)--;
    } else {
      (*iov)->iov_base = (char *)(*iov)->iov_base + n;
      (*iov)->iov_len -= n;
      n = 0;
    }
  }
  while (*cnt > 0 && (*iov)->iov_len == 0) {
    (*iov)++;
    (*cnt)--;
  }
}

int ecs_net_writev_all(int fd, struct iovec *iov, int cnt, uint64_t deadline_ms) {
  ecs_iov_advance(&iov, &cnt, 0);
  while (cnt > 0) {
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)(cnt > IOV_MAX ? IOV_MAX : cnt);
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (n > 0) {
      ecs_iov_advance(&iov, &cnt, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_fd(fd, POLLOUT, deadline_ms);
      if (rc)
        return rc;
      continue;
    }
    return ECS_ECONN;
  }
  return ECS_OK;
}

int ecs_net_readv_all(int fd, struct iovec *iov, int cnt, uint64_t deadline_ms) {
  ecs_iov_advance(&iov, &cnt, 0);
  while (cnt > 0) {
    ssize_t n = readv(fd, iov, cnt > IOV_MAX ? IOV_MAX : cnt);
    if (n > 0) {
      ecs_iov_advance(&iov, &cnt, (size_t)n);
      continue;
    }
    if (n == 0)
      return ECS_ECONN;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = wait_fd(fd, POLLIN, deadline_ms);
      if (rc)
        return rc;
      continue;
    }
    return ECS_ECONN;
  }
  return ECS_OK;
}

int ecs_net_read_all_fd(int fd, void *buf, size_t n, uint64_t deadline_ms, int *passed) {
  *passed = -1;
  size_t got = 0;
  while (got < n) {
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {(char *)buf + got, n - got};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (r > 0) {
      for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int))) {
          int f;
          memcpy(&f, CMSG_DATA(cm), sizeof f);
          if (*passed >= 0)
            close(f); /* only one is expected */
          else
            *passed = f;
        }
      }
      got += (size_t)r;
      continue;
    }
    int rc = ECS_ECONN;
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      rc = wait_fd(fd, POLLIN, deadline_ms);
    if (rc) {
      if (*passed >= 0)
        close(*passed);
      *passed = -1;
      return rc;
    }
  }
  return ECS_OK;
}

int ecs_net_connect_unix(const char *path, uint64_t deadline_ms, int *fd_out) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof a.sun_path)
    return ECS_EINVAL;
  memcpy(a.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return ECS_ECONN;
  for (;;) {
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
      break;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN) { /* backlog full: wait and retry before the deadline */
      if (ecs_now_ms() >= deadline_ms) {
        close(fd);
        return ECS_ETIMEDOUT;
      }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    close(fd);
    return ECS_ECONN;
  }
  *fd_out = fd;
  return ECS_OK;
}

int ecs_net_peer_uid(int fd, unsigned *uid) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof cr)
    return ECS_ECONN;
  *uid = (unsigned)cr.uid;
  return ECS_OK;
}

/* The peer's address as 16 bytes (IPv4 mapped into IPv6), for comparing. */
static int addr16(const struct sockaddr *sa, uint8_t out[16]) {
  if (sa->sa_family == AF_INET) {
    memset(out, 0, 10);
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    return 1;
  }
  if (sa->sa_family == AF_INET6) {
    memcpy(out, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    return 1;
  }
  return 0;
}

/* 1 for 127.0.0.0/8 (IPv4 mapped) and ::1. */
static int is_loopback16(const uint8_t a[16]) {
  static const uint8_t v6_loop[16] = {[15] = 1};
  static const uint8_t v4_mapped[12] = {[10] = 0xff, [11] = 0xff};
  return !memcmp(a, v6_loop, 16) || (!memcmp(a, v4_mapped, 12) && a[12] == 127);
}

int ecs_net_peer_is_local(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  uint8_t peer[16], mine[16];
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0 || !addr16((struct sockaddr *)&ss, peer))
    return 0;
  if (is_loopback16(peer))
    return 1;
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0)
    return 0;
  int local = 0;
  for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
    local = i->ifa_addr && addr16(i->ifa_addr, mine) && !memcmp(peer, mine, 16);
  freeifaddrs(ifs);
  return local;
}

int ecs_net_tune_local(int fd) {
  struct sockaddr_storage me, peer;
  socklen_t ml = sizeof me, pl = sizeof peer;
  uint8_t a[16], b[16];
  if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 ||
      getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 || !addr16((struct sockaddr *)&me, a) ||
      !addr16((struct sockaddr *)&peer, b))
    return 0; /* not TCP over IP (a Unix socket has no congestion control) */
  if (!is_loopback16(b) && memcmp(a, b, 16) != 0)
    return 0;
  static const char cc[] = "reno";
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, sizeof cc - 1) == 0;
}

int ecs_net_read_all(int fd, void *buf, size_t n, uint64_t deadline_ms) {
  struct iovec iov = {.iov_base = buf, .iov_len = n};
  return ecs_net_readv_all(fd, &iov, 1, deadline_ms);
}

int ecs_ct_equal(const void *a, size_t alen, const void *b, size_t blen) {
  const unsigned char *x = a, *y = b;
  size_t n = alen > blen ? alen : blen;
  unsigned diff = (unsigned)(alen ^ blen);
  for (size_t i = 0; i < n; i++) {
    unsigned char cx = i < alen ? x[i] : 0;
    unsigned char cy = i < blen ? y[i] : 0;
    diff |= (unsigned)(cx ^ cy);
  }
  return diff == 0;
}
