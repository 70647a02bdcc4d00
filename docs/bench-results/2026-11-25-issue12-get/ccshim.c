#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
/* measurement only: accepted TCP sockets get reno, as ecstore's own do */
static void tune(int fd) {
  if (fd >= 0)
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
}
int accept(int s, struct sockaddr *a, socklen_t *l) {
  static int (*f)(int, struct sockaddr *, socklen_t *);
  if (!f)
    f = dlsym(RTLD_NEXT, "accept");
  int fd = f(s, a, l);
  tune(fd);
  return fd;
}
int accept4(int s, struct sockaddr *a, socklen_t *l, int fl) {
  static int (*f)(int, struct sockaddr *, socklen_t *, int);
  if (!f)
    f = dlsym(RTLD_NEXT, "accept4");
  int fd = f(s, a, l, fl);
  tune(fd);
  return fd;
}
