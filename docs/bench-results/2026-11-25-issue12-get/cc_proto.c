#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/sendfile.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <xxhash.h>
#define N 32
#define SZ (64 << 10)
static int mode;
static int CH = 5;
static int memfd;
static uint8_t *pool;
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}
static double cpu(int who) {
  struct rusage r;
  getrusage(who, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}
static void *srv(void *p) {
  int fd = (int)(intptr_t)p;
  char q[64];
  for (;;) {
    if (read(fd, q, 48) <= 0)
      break;
    if (mode == 0) {
      struct iovec v[N + 1];
      v[0].iov_base = q;
      v[0].iov_len = 32;
      for (int i = 0; i < N; i++) {
        v[i + 1].iov_base = pool + (size_t)i * SZ * 2;
        v[i + 1].iov_len = SZ;
      }
      struct iovec *vv = v;
      int c = N + 1;
      while (c) {
        ssize_t n = writev(fd, vv, c);
        if (n < 0) {
          perror("w");
          exit(1);
        }
        while (n > 0) {
          if ((size_t)n >= vv->iov_len) {
            n -= vv->iov_len;
            vv++;
            c--;
          } else {
            vv->iov_base = (char *)vv->iov_base + n;
            vv->iov_len -= n;
            n = 0;
          }
        }
      }
    } else {
      send(fd, q, 32, MSG_MORE);
      for (int i = 0; i < N; i++) {
        off_t o = (off_t)i * SZ * 2;
        size_t left = SZ;
        while (left) {
          ssize_t n = sendfile(fd, memfd, &o, left);
          if (n <= 0) {
            perror("sf");
            exit(1);
          }
          left -= n;
        }
      }
    }
  }
  return NULL;
}
int main(int argc, char **argv) {
  mode = atoi(argv[1]);
  if (getenv("CHUNK"))
    CH = atoi(getenv("CHUNK"));
  double secs = atof(argv[2]);
  memfd = memfd_create("pool", 0);
  ftruncate(memfd, (size_t)N * SZ * 2);
  pool = mmap(0, (size_t)N * SZ * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);
  for (size_t i = 0; i < (size_t)N * SZ * 2; i++)
    pool[i] = (uint8_t)(i * 7);
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  bind(l, (void *)&a, sizeof a);
  listen(l, 1);
  socklen_t al = sizeof a;
  getsockname(l, (void *)&a, &al);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  connect(c, (void *)&a, sizeof a);
  int s = accept(l, 0, 0);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, 4);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, 4);
  if (getenv("CC")) {
    const char *cc = getenv("CC");
    setsockopt(c, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc));
    setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc));
  }
  if (getenv("RB")) {
    int v = atoi(getenv("RB"));
    setsockopt(c, SOL_SOCKET, SO_RCVBUF, &v, 4);
  }
  if (getenv("SB")) {
    int v = atoi(getenv("SB"));
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &v, 4);
  }
  pthread_t th;
  pthread_create(&th, 0, srv, (void *)(intptr_t)s);
  uint8_t *buf[N];
  for (int i = 0; i < N; i++) {
    buf[i] = malloc(SZ);
    memset(buf[i], 0, SZ);
  }
  uint8_t hdr[32];
  char q[48] = {0};
  long calls = 0;
  double t0 = now(), c0 = cpu(RUSAGE_SELF);
  uint64_t acc = 0;
  while (now() - t0 < secs) {
    write(c, q, 48);
    struct iovec v[N + 1];
    v[0].iov_base = hdr;
    v[0].iov_len = 32;
    for (int i = 0; i < N; i++) {
      v[i + 1].iov_base = buf[i];
      v[i + 1].iov_len = SZ;
    }
    struct iovec *vv = v;
    int cn = N + 1;
    int hashed = 0;
    while (cn) {
      ssize_t n = readv(c, vv, cn > CH ? CH : cn);
      if (n <= 0) {
        perror("r");
        exit(1);
      }
      while (n > 0) {
        if ((size_t)n >= vv->iov_len) {
          n -= vv->iov_len;
          vv++;
          cn--;
        } else {
          vv->iov_base = (char *)vv->iov_base + n;
          vv->iov_len -= n;
          n = 0;
        }
      }
      int done = N + 1 - cn;
      while (hashed < done) {
        if (hashed > 0)
          acc += XXH3_64bits(buf[hashed - 1], SZ);
        hashed++;
      }
    }
    calls++;
  }
  double el = now() - t0, cp = cpu(RUSAGE_SELF) - c0;
  printf("mode %d: %.2f GB/s, cpu (both) %.0f us/call, wall %.0f us/call %lu\n", mode,
         calls * (double)N * SZ / el / 1e9, cp / calls * 1e6, el / calls * 1e6, (unsigned long)(acc & 1));
  return 0;
}
