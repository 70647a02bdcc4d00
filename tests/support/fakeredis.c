/* A fake Redis that fails part-way through a batch (see fakeredis.h). */
#include "support/fakeredis.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/net.h"

#define FAKE_MAX_CONNS 64
#define FAKE_MAX_ARGS 4096
#define FAKE_POLL_MS 50

typedef struct fake_conn {
  struct ecs_ts_fakeredis *f; /* owner */
  int fd;                     /* the socket */
  pthread_t th;               /* its thread */
} fake_conn_t;

struct ecs_ts_fakeredis {
  int budget, mode;       /* see fakeredis.h */
  int lfd, port;          /* listening socket and its port */
  atomic_int stop;        /* set by stop() */
  atomic_ullong answered; /* data replies given */
  atomic_ullong failed;   /* data commands failed */
  char *hostile;          /* hostile mode: the reply every data command gets, else NULL */
  size_t hostile_len;     /* its length */
  char *unit;             /* what the filler repeats */
  uint64_t filler;        /* filler bytes after each hostile reply */
  atomic_ullong hsent;    /* hostile replies sent */
  atomic_ullong taken;    /* filler bytes written */
  atomic_int armed;       /* hostile mode on */
  pthread_t acceptor;     /* the accept loop */
  pthread_mutex_t mu;     /* guards conns */
  fake_conn_t *conns[FAKE_MAX_CONNS];
  int nconns;
};

/* Writes all of p or gives up (the peer went away). */
static int fake_write(int fd, const char *p, size_t n) {
  struct iovec iov = {(void *)p, n};
  return ecs_net_writev_all(fd, &iov, 1, ecs_now_ms() + 2000);
}

/* Parses one RESP array of bulk strings from buf[0..len).  Returns the
 * bytes it used, 0 when incomplete, -1 when malformed.  argv[i] points
 * into buf (not NUL-terminated), argl[i] its length. */
static long fake_parse(const char *buf, size_t len, int *argc, const char **argv, size_t *argl) {
  size_t pos = 0;
  if (len < 1)
    return 0;
  if (buf[0] != '*')
    return -1;
  const char *nl = memchr(buf, '\n', len);
  if (!nl)
    return 0;
  long n = strtol(buf + 1, NULL, 10);
  if (n < 1 || n > FAKE_MAX_ARGS)
    return -1;
  pos = (size_t)(nl - buf) + 1;
  for (long i = 0; i < n; i++) {
    if (pos >= len)
      return 0;
    if (buf[pos] != '$')
      return -1;
    nl = memchr(buf + pos, '\n', len - pos);
    if (!nl)
      return 0;
    long bl = strtol(buf + pos + 1, NULL, 10);
    if (bl < 0)
      return -1;
    pos = (size_t)(nl - buf) + 1;
    if (len - pos < (size_t)bl + 2)
      return 0;
    argv[i] = buf + pos;
    argl[i] = (size_t)bl;
    pos += (size_t)bl + 2;
  }
  *argc = (int)n;
  return (long)pos;
}

static int is_cmd(const char *a, size_t l, const char *name) {
  return l == strlen(name) && strncasecmp(a, name, l) == 0;
}

/* Hostile mode: the reply, then the filler, 64 KiB per write, until the
 * victim stops reading (a write that cannot finish in 2 s) or hangs up. */
static int fake_hostile(fake_conn_t *c) {
  ecs_ts_fakeredis_t *f = c->f;
  f->hsent++; /* first: the victim may act on it before the write returns */
  if (fake_write(c->fd, f->hostile, f->hostile_len) != 0)
    return -1;
  size_t ul = strlen(f->unit), cap = ul ? (65536 / ul) * ul : 0;
  char *chunk = cap ? malloc(cap) : NULL;
  for (size_t o = 0; chunk && o < cap; o += ul)
    memcpy(chunk + o, f->unit, ul);
  for (uint64_t left = chunk ? f->filler : 0; left > 0 && !f->stop;) {
    size_t n = left < cap ? (size_t)left : cap;
    if (fake_write(c->fd, chunk, n) != 0)
      break;
    f->taken += n;
    left -= n;
  }
  free(chunk);
  return 0;
}

/* Answers one command.  Returns -1 to close the connection. */
static int fake_answer(fake_conn_t *c, int *given, int argc, const char **argv, const size_t *argl) {
  ecs_ts_fakeredis_t *f = c->f;
  int eval = is_cmd(argv[0], argl[0], "EVAL") || is_cmd(argv[0], argl[0], "EVALSHA");
  int data = eval || is_cmd(argv[0], argl[0], "EXISTS");
  if (f->hostile != NULL && f->armed) {
    if (is_cmd(argv[0], argl[0], "AUTH") || is_cmd(argv[0], argl[0], "SELECT"))
      return fake_write(c->fd, "+OK\r\n", 5);
    if (is_cmd(argv[0], argl[0], "PING"))
      return fake_write(c->fd, "+PONG\r\n", 7);
    return fake_hostile(c);
  }
  if (!data) {
    if (is_cmd(argv[0], argl[0], "SCRIPT"))
      return fake_write(c->fd, "$40\r\n0123456789abcdef0123456789abcdef01234567\r\n", 47);
    if (is_cmd(argv[0], argl[0], "PING"))
      return fake_write(c->fd, "+PONG\r\n", 7);
    return fake_write(c->fd, "+OK\r\n", 5);
  }
  if (*given >= f->budget) {
    f->failed++;
    if (f->mode == ECS_TS_FAKE_CLOSE)
      return -1;
    return fake_write(c->fd, "-ERR injected failure\r\n", 23);
  }
  (*given)++;
  f->answered++;
  if (!eval)
    return fake_write(c->fd, ":1\r\n", 4);
  long nk = argc > 2 ? strtol(argv[2], NULL, 10) : 0; /* argv[2] ends at "\r\n" */
  if (nk < 0 || nk > argc)
    nk = 0;
  /* the check script's mode (ARGV[2], after the keys): "l" asks for each
   * record whole (exists and lookup), answered as a live one-holder record */
  int whole = 3 + nk + 1 < argc && argl[3 + nk + 1] == 1 && argv[3 + nk + 1][0] == 'l';
  static const char rec[] = "*12\r\n$6\r\nnode-x\r\n$1\r\n1\r\n$1\r\n0\r\n$1\r\n1\r\n$1\r\n1\r\n"
                            "$1\r\n7\r\n$1\r\n1\r\n$16\r\n0000000000000000\r\n$1\r\n0\r\n$1\r\n1\r\n"
                            "$6\r\nnode-x\r\n$1\r\n1\r\n";
  size_t unit = whole ? sizeof rec - 1 : 4;
  size_t cap = 32 + (size_t)nk * unit;
  char *out = malloc(cap);
  if (!out)
    return -1;
  size_t o = (size_t)snprintf(out, cap, "*%ld\r\n", nk);
  for (long i = 0; i < nk; i++) {
    memcpy(out + o, whole ? rec : ":1\r\n", unit);
    o += unit;
  }
  int rc = fake_write(c->fd, out, o);
  free(out);
  return rc;
}

static void *fake_conn_main(void *p) {
  fake_conn_t *c = p;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  const char **argv = malloc(FAKE_MAX_ARGS * sizeof *argv);
  size_t *argl = malloc(FAKE_MAX_ARGS * sizeof *argl);
  int given = 0;
  while (buf && argv && argl && !c->f->stop) {
    int argc = 0;
    long used = fake_parse(buf, len, &argc, argv, argl);
    if (used < 0)
      break;
    if (used > 0) {
      if (fake_answer(c, &given, argc, argv, argl) != 0)
        break;
      memmove(buf, buf + used, len - (size_t)used);
      len -= (size_t)used;
      continue;
    }
    if (len == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb)
        break;
      buf = nb;
      cap *= 2;
    }
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    if (poll(&pf, 1, FAKE_POLL_MS) <= 0)
      continue;
    ssize_t r = read(c->fd, buf + len, cap - len);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
      break;
    if (r > 0)
      len += (size_t)r;
  }
  shutdown(c->fd, SHUT_RDWR);
  free(buf);
  free(argv);
  free(argl);
  return NULL;
}

static void *fake_accept_main(void *p) {
  ecs_ts_fakeredis_t *f = p;
  while (!f->stop) {
    struct pollfd pf = {.fd = f->lfd, .events = POLLIN};
    if (poll(&pf, 1, FAKE_POLL_MS) <= 0)
      continue;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
      continue;
    fake_conn_t *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&f->mu);
    int room = f->nconns < FAKE_MAX_CONNS;
    if (c && room && ecs_net_set_nonblock(fd) == 0) {
      c->f = f;
      c->fd = fd;
      if (pthread_create(&c->th, NULL, fake_conn_main, c) == 0) {
        f->conns[f->nconns++] = c;
        c = NULL;
        fd = -1;
      }
    }
    pthread_mutex_unlock(&f->mu);
    free(c);
    if (fd >= 0)
      close(fd);
  }
  return NULL;
}

int ecs_ts_fakeredis_start(int budget, int mode, ecs_ts_fakeredis_t **out) {
  *out = NULL;
  ecs_ts_fakeredis_t *f = calloc(1, sizeof *f);
  if (!f)
    return ECS_ENOMEM;
  f->budget = budget;
  f->mode = mode;
  pthread_mutex_init(&f->mu, NULL);
  int rc = ecs_net_listen("127.0.0.1", 0, 64, &f->lfd);
  if (rc != ECS_OK) {
    pthread_mutex_destroy(&f->mu);
    free(f);
    return rc;
  }
  f->port = ecs_net_local_port(f->lfd);
  if (pthread_create(&f->acceptor, NULL, fake_accept_main, f) != 0) {
    close(f->lfd);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return ECS_ENOMEM;
  }
  *out = f;
  return ECS_OK;
}

int ecs_ts_fakeredis_start_hostile(const char *reply, size_t len, const char *unit, uint64_t filler_bytes,
                                   ecs_ts_fakeredis_t **out) {
  char *h = malloc(len + 1), *u = strdup(unit ? unit : "");
  if (h == NULL || u == NULL) {
    free(h);
    free(u);
    return ECS_ENOMEM;
  }
  memcpy(h, reply, len);
  int rc = ecs_ts_fakeredis_start(0, ECS_TS_FAKE_ERROR, out);
  if (rc != ECS_OK) {
    free(h);
    free(u);
    return rc;
  }
  /* the acceptor runs already, but no connection reads these before its
   * first command, and the victim connects only after we return */
  (*out)->hostile = h;
  (*out)->hostile_len = len;
  (*out)->unit = u;
  (*out)->filler = filler_bytes;
  (*out)->armed = 1;
  return ECS_OK;
}

void ecs_ts_fakeredis_set_hostile(ecs_ts_fakeredis_t *f, int on) {
  f->armed = on;
  f->budget = on ? 0 : 1 << 30;
}

uint64_t ecs_ts_fakeredis_hostile_sent(const ecs_ts_fakeredis_t *f) {
  return f->hsent;
}

uint64_t ecs_ts_fakeredis_filler_taken(const ecs_ts_fakeredis_t *f) {
  return f->taken;
}

int ecs_ts_fakeredis_port(const ecs_ts_fakeredis_t *f) {
  return f->port;
}

uint64_t ecs_ts_fakeredis_answered(const ecs_ts_fakeredis_t *f) {
  return f->answered;
}

uint64_t ecs_ts_fakeredis_failed(const ecs_ts_fakeredis_t *f) {
  return f->failed;
}

void ecs_ts_fakeredis_stop(ecs_ts_fakeredis_t *f) {
  if (!f)
    return;
  f->stop = 1;
  pthread_join(f->acceptor, NULL);
  for (int i = 0; i < f->nconns; i++) {
    pthread_join(f->conns[i]->th, NULL);
    close(f->conns[i]->fd);
    free(f->conns[i]);
  }
  close(f->lfd);
  pthread_mutex_destroy(&f->mu);
  free(f->hostile);
  free(f->unit);
  free(f);
}
