/* The Prometheus endpoint; see store/server/metrics.h. */
#include "store/server/metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/log.h"
#include "store/core/net.h"

/* 50 µs to 10 s: a small get on shm is tens of µs, a large put over a slow
 * link or one stuck behind Redis is seconds. */
const double ecs_hist_bounds_s[ECS_HIST_NBOUNDS] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                    0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                                    0.5,     1.0,    2.5,     10.0};

void ecs_hist_observe(ecs_hist_t *h, uint64_t ns) {
  double s = (double)ns / 1e9;
  size_t i = 0;
  while (i < ECS_HIST_NBOUNDS && s > ecs_hist_bounds_s[i])
    i++;
  h->bucket[i]++;
  h->count++;
  h->sum_ns += ns;
}

/* ---- text ------------------------------------------------------------- */

void ecs_mbuf_printf(ecs_mbuf_t *b, const char *fmt, ...) {
  if (b->err)
    return;
  for (;;) {
    size_t room = b->cap - b->len;
    va_list ap;
    va_start(ap, fmt);
    int n = room ? vsnprintf(b->p + b->len, room, fmt, ap) : -2;
    va_end(ap);
    if (n == -1) {
      b->err = 1;
      return;
    }
    if (n >= 0 && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (n >= 0 && cap - b->len <= (size_t)n)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->err = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
}

void ecs_mbuf_free(ecs_mbuf_t *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* A label value with \, " and newline escaped, as the format asks. */
static void put_label_value(ecs_mbuf_t *b, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      ecs_mbuf_printf(b, "\\%c", *v);
    else if (*v == '\n')
      ecs_mbuf_printf(b, "\\n");
    else
      ecs_mbuf_printf(b, "%c", *v);
  }
}

static void head(ecs_mbuf_t *b, const char *name, const char *help, const char *type) {
  ecs_mbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void ecs_metrics_gauge(ecs_mbuf_t *b, const char *name, const char *help, double v) {
  head(b, name, help, "gauge");
  ecs_mbuf_printf(b, "%s %.17g\n", name, v);
}

void ecs_metrics_counter(ecs_mbuf_t *b, const char *name, const char *help, uint64_t v) {
  head(b, name, help, "counter");
  ecs_mbuf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

void ecs_metrics_info(ecs_mbuf_t *b, const char *name, const char *help, const char *k1, const char *v1,
                      const char *k2, const char *v2) {
  head(b, name, help, "gauge");
  ecs_mbuf_printf(b, "%s{%s=\"", name, k1);
  put_label_value(b, v1);
  ecs_mbuf_printf(b, "\",%s=\"", k2);
  put_label_value(b, v2);
  ecs_mbuf_printf(b, "\"} 1\n");
}

void ecs_metrics_histograms(ecs_mbuf_t *b, const char *name, const char *help, const char *label,
                            const char *const values[], const ecs_hist_t *const hists[], size_t n) {
  head(b, name, help, "histogram");
  for (size_t i = 0; i < n; i++) {
    const ecs_hist_t *h = hists[i];
    uint64_t cum = 0;
    for (size_t k = 0; k <= ECS_HIST_NBOUNDS; k++) {
      cum += h->bucket[k];
      ecs_mbuf_printf(b, "%s_bucket{%s=\"", name, label);
      put_label_value(b, values[i]);
      if (k < ECS_HIST_NBOUNDS)
        ecs_mbuf_printf(b, "\",le=\"%g\"} %llu\n", ecs_hist_bounds_s[k], (unsigned long long)cum);
      else
        ecs_mbuf_printf(b, "\",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    ecs_mbuf_printf(b, "%s_sum{%s=\"", name, label);
    put_label_value(b, values[i]);
    ecs_mbuf_printf(b, "\"} %.9f\n", (double)h->sum_ns / 1e9);
    ecs_mbuf_printf(b, "%s_count{%s=\"", name, label);
    put_label_value(b, values[i]);
    ecs_mbuf_printf(b, "\"} %llu\n", (unsigned long long)h->count);
  }
}

/* ---- HTTP request ------------------------------------------------------ */

ecs_http_req_t ecs_metrics_http_parse(const char *buf, size_t len) {
  /* The head ends at the first blank line; bare LF line ends are accepted
   * too (curl never sends them, hand-typed requests do). */
  size_t end = 0;
  for (size_t i = 0; i + 1 < len && !end; i++) {
    if (buf[i] == '\n' && buf[i + 1] == '\n')
      end = i + 2;
    else if (i + 3 < len && !memcmp(buf + i, "\r\n\r\n", 4))
      end = i + 4;
  }
  if (!end)
    return len >= ECS_METRICS_MAX_REQUEST ? ECS_HTTP_BAD : ECS_HTTP_MORE;
  if (end > ECS_METRICS_MAX_REQUEST)
    return ECS_HTTP_BAD;
  /* Request line: METHOD SP PATH SP HTTP/1.x */
  const char *eol = memchr(buf, '\n', end);
  size_t ll = (size_t)(eol - buf);
  if (ll && buf[ll - 1] == '\r')
    ll--;
  const char *sp1 = memchr(buf, ' ', ll);
  if (!sp1 || sp1 == buf)
    return ECS_HTTP_BAD;
  const char *path = sp1 + 1;
  const char *sp2 = memchr(path, ' ', ll - (size_t)(path - buf));
  if (!sp2 || sp2 == path)
    return ECS_HTTP_BAD;
  size_t vl = ll - (size_t)(sp2 + 1 - buf);
  if (vl != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 || (sp2[8] != '0' && sp2[8] != '1'))
    return ECS_HTTP_BAD;
  size_t ml = (size_t)(sp1 - buf), pl = (size_t)(sp2 - path);
  int get = ml == 3 && !memcmp(buf, "GET", 3);
  int hd = ml == 4 && !memcmp(buf, "HEAD", 4);
  if (!get && !hd)
    return ECS_HTTP_METHOD;
  const char *q = memchr(path, '?', pl);
  if (q)
    pl = (size_t)(q - path);
  if (pl != 8 || memcmp(path, "/metrics", 8) != 0)
    return ECS_HTTP_NOTFOUND;
  return get ? ECS_HTTP_METRICS : ECS_HTTP_HEAD;
}

/* ---- the endpoint ------------------------------------------------------ */

typedef struct mconn {
  int fd;                            /* -1: free slot */
  uint64_t t0_ms;                    /* accepted at */
  size_t got;                        /* request bytes read */
  char req[ECS_METRICS_MAX_REQUEST]; /* the request head */
  ecs_mbuf_t out;                    /* the whole response, once known */
  size_t sent;                       /* response bytes written */
} mconn_t;

struct ecs_metrics_srv {
  int lfd;                              /* listening socket */
  int epfd;                             /* the server's epoll (not owned) */
  int port;                             /* bound port */
  ecs_metrics_render_fn render;         /* fills a scrape's body */
  void *ctx;                            /* for render */
  mconn_t conns[ECS_METRICS_MAX_CONNS]; /* scrapers being served */
};

int ecs_metrics_open(const char *host, int port, int epfd, ecs_metrics_render_fn render, void *ctx,
                     ecs_metrics_srv_t **out, char *errbuf, size_t errlen) {
  *out = NULL;
  ecs_metrics_srv_t *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(errbuf, errlen, "out of memory");
    return ECS_ENOMEM;
  }
  for (int i = 0; i < ECS_METRICS_MAX_CONNS; i++)
    m->conns[i].fd = -1;
  m->epfd = epfd;
  m->render = render;
  m->ctx = ctx;
  int rc = ecs_net_listen(host, port, 64, &m->lfd);
  if (rc) {
    int e = errno;
    snprintf(errbuf, errlen, "cannot listen on %s:%d for metrics: %s", host, port, strerror(e));
    free(m);
    return rc;
  }
  m->port = ecs_net_local_port(m->lfd);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = m};
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, m->lfd, &ev) != 0) {
    snprintf(errbuf, errlen, "metrics: epoll_ctl: %s", strerror(errno));
    close(m->lfd);
    free(m);
    return ECS_EIO;
  }
  *out = m;
  return ECS_OK;
}

int ecs_metrics_owns(const ecs_metrics_srv_t *m, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr, b = (uintptr_t)m;
  return m && p >= b && p < b + sizeof *m;
}

int ecs_metrics_fd(const ecs_metrics_srv_t *m) {
  return m ? m->lfd : -1;
}

int ecs_metrics_port(const ecs_metrics_srv_t *m) {
  return m ? m->port : -1;
}

static void mconn_close(ecs_metrics_srv_t *m, mconn_t *c) {
  epoll_ctl(m->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  c->fd = -1;
  ecs_mbuf_free(&c->out);
}

static void accept_all(ecs_metrics_srv_t *m) {
  for (;;) {
    int fd = accept4(m->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      return;
    }
    mconn_t *c = NULL, *oldest = NULL;
    for (int i = 0; i < ECS_METRICS_MAX_CONNS && !c; i++) {
      mconn_t *k = &m->conns[i];
      if (k->fd < 0)
        c = k;
      else if (!k->out.len && (!oldest || k->t0_ms < oldest->t0_ms))
        oldest = k; /* still sending its head */
    }
    if (!c && oldest) {
      ECS_LOG_D("metrics: all %d slots taken; closing the oldest scrape still sending its request",
                ECS_METRICS_MAX_CONNS);
      mconn_close(m, oldest);
      c = oldest;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (!c || epoll_ctl(m->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd); /* busy: a scraper retries at its next interval */
      continue;
    }
    c->fd = fd;
    c->t0_ms = ecs_now_ms();
    c->got = 0;
    c->sent = 0;
  }
}

/* Builds the whole response for what the request asked. */
static void respond(ecs_metrics_srv_t *m, mconn_t *c, ecs_http_req_t what) {
  ecs_mbuf_t body = {0};
  const char *status = "200 OK";
  switch (what) {
  case ECS_HTTP_METRICS:
  case ECS_HTTP_HEAD: m->render(m->ctx, &body); break;
  case ECS_HTTP_NOTFOUND:
    status = "404 Not Found";
    ecs_mbuf_printf(&body, "only /metrics is served here\n");
    break;
  case ECS_HTTP_METHOD:
    status = "405 Method Not Allowed";
    ecs_mbuf_printf(&body, "GET /metrics\n");
    break;
  default:
    status = c->got >= ECS_METRICS_MAX_REQUEST ? "431 Request Header Fields Too Large" : "400 Bad Request";
    ecs_mbuf_printf(&body, "expected: GET /metrics HTTP/1.0\n");
    break;
  }
  if (body.err) {
    status = "500 Internal Server Error";
    ecs_mbuf_free(&body);
  }
  ecs_mbuf_printf(&c->out,
                  "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                  "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                  status, body.len);
  if (what != ECS_HTTP_HEAD && body.len)
    ecs_mbuf_printf(&c->out, "%s", body.p);
  ecs_mbuf_free(&body);
}

/* Writes what the socket takes; closes when all is out or on error. */
static void mconn_write(ecs_metrics_srv_t *m, mconn_t *c) {
  while (c->sent < c->out.len) {
    ssize_t w = send(c->fd, c->out.p + c->sent, c->out.len - c->sent, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (w <= 0)
      break;
    c->sent += (size_t)w;
  }
  mconn_close(m, c);
}

static void mconn_read(ecs_metrics_srv_t *m, mconn_t *c) {
  for (;;) {
    /* never more than the bound: a longer head is refused, not buffered */
    ssize_t r = recv(c->fd, c->req + c->got, sizeof c->req - c->got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (r <= 0) {
      mconn_close(m, c);
      return;
    }
    c->got += (size_t)r;
    ecs_http_req_t what = ecs_metrics_http_parse(c->req, c->got);
    if (what == ECS_HTTP_MORE)
      continue;
    respond(m, c, what);
    if (c->out.err) {
      mconn_close(m, c);
      return;
    }
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(m->epfd, EPOLL_CTL_MOD, c->fd, &ev) != 0) {
      mconn_close(m, c);
      return;
    }
    mconn_write(m, c);
    return;
  }
}

void ecs_metrics_event(ecs_metrics_srv_t *m, void *ptr, uint32_t events) {
  if (ptr == m) {
    accept_all(m);
    return;
  }
  mconn_t *c = ptr;
  if (c->fd < 0)
    return;
  if (c->out.len)
    mconn_write(m, c);
  else if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
    mconn_read(m, c);
}

void ecs_metrics_tick(ecs_metrics_srv_t *m, uint64_t now_ms) {
  if (!m)
    return;
  for (int i = 0; i < ECS_METRICS_MAX_CONNS; i++) {
    mconn_t *c = &m->conns[i];
    if (c->fd >= 0 && now_ms - c->t0_ms > ECS_METRICS_TIMEOUT_MS) {
      ECS_LOG_D("metrics: closing a scrape stalled for %d ms", ECS_METRICS_TIMEOUT_MS);
      mconn_close(m, c);
    } else if (c->fd >= 0 && !c->out.len && now_ms - c->t0_ms > ECS_METRICS_HEAD_MS) {
      ECS_LOG_D("metrics: closing a scrape that sent no whole request within %d ms", ECS_METRICS_HEAD_MS);
      mconn_close(m, c);
    }
  }
}

void ecs_metrics_close(ecs_metrics_srv_t *m) {
  if (!m)
    return;
  for (int i = 0; i < ECS_METRICS_MAX_CONNS; i++)
    if (m->conns[i].fd >= 0)
      mconn_close(m, &m->conns[i]);
  epoll_ctl(m->epfd, EPOLL_CTL_DEL, m->lfd, NULL);
  close(m->lfd);
  free(m);
}
