/*
 * The server's Prometheus endpoint: latency histograms, the text
 * exposition format, and a tiny HTTP/1.0 server for GET /metrics that runs
 * inside the server's epoll loop.
 *
 * The HTTP side is deliberately small: one request per connection, a
 * request of at most ECS_METRICS_MAX_REQUEST bytes (anything longer is
 * answered 431 and closed), at most ECS_METRICS_MAX_CONNS connections at a
 * time, each closed after ECS_METRICS_TIMEOUT_MS whatever its state, or
 * after ECS_METRICS_HEAD_MS without a whole request head.  When all are
 * taken a new connection closes the oldest one still sending its head
 * (a slow or silent scraper never keeps a real one out); when every one
 * is being answered, the new one is closed.  Sockets are non-blocking, so
 * a slow or stalled scraper never holds the loop.  The parser,
 * ecs_metrics_http_parse(), does no I/O and is tested on its own.
 *
 * Thread safety: none; everything runs on the server's loop thread.
 */
#ifndef ECS_METRICS_H
#define ECS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define ECS_METRICS_MAX_REQUEST 2048 /* bytes of request line + headers */
#define ECS_METRICS_MAX_CONNS 8      /* scrapers served at once */
#define ECS_METRICS_TIMEOUT_MS 5000  /* a scrape's whole life */
#define ECS_METRICS_HEAD_MS 1000     /* ...of which this long to send the request head */
#define ECS_HIST_NBOUNDS 16          /* finite bucket bounds; +Inf is one more */

/* Upper bounds of the latency buckets, in seconds, ascending. */
extern const double ecs_hist_bounds_s[ECS_HIST_NBOUNDS];

/* A latency histogram.  bucket[i] counts observations in (bound[i-1],
 * bound[i]] (not cumulative; the renderer sums); bucket[NBOUNDS] counts
 * those above the last bound. */
typedef struct ecs_hist {
  uint64_t bucket[ECS_HIST_NBOUNDS + 1]; /* per-bucket counts */
  uint64_t count;                        /* observations */
  uint64_t sum_ns;                       /* their total, in ns */
} ecs_hist_t;

void ecs_hist_observe(ecs_hist_t *h, uint64_t ns);

/* A growing text buffer; err sticks at the first allocation failure. */
typedef struct ecs_mbuf {
  char *p;    /* text, NUL-terminated while !err */
  size_t len; /* bytes used, without the NUL */
  size_t cap; /* bytes allocated */
  int err;    /* 1 once an allocation failed */
} ecs_mbuf_t;

void ecs_mbuf_printf(ecs_mbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ecs_mbuf_free(ecs_mbuf_t *b);

/* Exposition helpers: "# HELP", "# TYPE" and the sample lines.  Label
 * values are escaped as the format requires (backslash, quote, newline). */
void ecs_metrics_gauge(ecs_mbuf_t *b, const char *name, const char *help, double v);
void ecs_metrics_counter(ecs_mbuf_t *b, const char *name, const char *help, uint64_t v);
/* One histogram family with a label per series: hists[i] is labelled
 * label="values[i]"; series with no observations are still written. */
void ecs_metrics_histograms(ecs_mbuf_t *b, const char *name, const char *help, const char *label,
                            const char *const values[], const ecs_hist_t *const hists[], size_t n);
/* An info-style gauge of value 1 with two labels. */
void ecs_metrics_info(ecs_mbuf_t *b, const char *name, const char *help, const char *k1, const char *v1,
                      const char *k2, const char *v2);

/* What a request buffer holds so far. */
typedef enum ecs_http_req {
  ECS_HTTP_MORE = 0,     /* not yet a whole request head; read more */
  ECS_HTTP_METRICS = 1,  /* GET /metrics (or HEAD): answer 200 */
  ECS_HTTP_NOTFOUND = 2, /* GET of another path: 404 */
  ECS_HTTP_METHOD = 3,   /* a method other than GET or HEAD: 405 */
  ECS_HTTP_BAD = 4,      /* not HTTP, or too long: 400 / 431 */
  ECS_HTTP_HEAD = 5      /* HEAD /metrics: 200 without a body */
} ecs_http_req_t;

/* Parses the first len bytes a scraper sent (no I/O).  A request head is
 * whole at its first blank line; its first line must be "METHOD PATH
 * HTTP/1.x".  A query string on /metrics is ignored.  len over
 * ECS_METRICS_MAX_REQUEST without a whole head is ECS_HTTP_BAD. */
ecs_http_req_t ecs_metrics_http_parse(const char *buf, size_t len);

/* The endpoint.  render fills the body of each scrape. */
typedef void (*ecs_metrics_render_fn)(void *ctx, ecs_mbuf_t *body);
typedef struct ecs_metrics_srv ecs_metrics_srv_t;

/* Listens on host:port (port 0 picks one) and adds the socket to epfd.
 * ECS_OK, or an error code with errbuf saying why. */
int ecs_metrics_open(const char *host, int port, int epfd, ecs_metrics_render_fn render, void *ctx,
                     ecs_metrics_srv_t **out, char *errbuf, size_t errlen);
/* 1 when an epoll event's data.ptr belongs to m (its socket or one of its
 * connections); then ecs_metrics_event() handles it.  m may be NULL. */
int ecs_metrics_owns(const ecs_metrics_srv_t *m, const void *ptr);
void ecs_metrics_event(ecs_metrics_srv_t *m, void *ptr, uint32_t events);
/* The listening socket (for the server's loopback check). */
int ecs_metrics_fd(const ecs_metrics_srv_t *m);

/* Closes connections past ECS_METRICS_TIMEOUT_MS, and those without a
 * whole request head past ECS_METRICS_HEAD_MS. */
void ecs_metrics_tick(ecs_metrics_srv_t *m, uint64_t now_ms);
int ecs_metrics_port(const ecs_metrics_srv_t *m);
/* Closes everything; accepts NULL. */
void ecs_metrics_close(ecs_metrics_srv_t *m);

#endif
