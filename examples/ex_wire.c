/*
 * The examples' wire protocol (see ex_wire.h): payload encoders and
 * bounded decoders (no I/O), then frame I/O with deadlines.
 */
#include "examples/ex_wire.h"

#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/net.h"

_Static_assert(EX_HDR_LEN == 12, "frame header is 12 bytes");

void ex_buf_free(ex_buf_t *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static int ex_buf_reserve(ex_buf_t *b, size_t more) {
  if (b->oom)
    return -1;
  if (b->len + more <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more)
    cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (p == NULL) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

static void put_bytes(ex_buf_t *b, const void *p, size_t n) {
  if (ex_buf_reserve(b, n) != 0)
    return;
  memcpy(b->p + b->len, p, n);
  b->len += n;
}

static void put_u32(ex_buf_t *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put_bytes(b, x, 4);
}

static void put_u64(ex_buf_t *b, uint64_t v) {
  put_u32(b, (uint32_t)v);
  put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(ex_buf_t *b, const char *s) {
  size_t n = strlen(s);
  put_u32(b, (uint32_t)n);
  put_bytes(b, s, n);
}

/* A bounded reader over one payload. */
typedef struct ex_rd {
  const uint8_t *p; /* payload */
  size_t len;       /* its length */
  size_t off;       /* read so far */
  int err;          /* a read ran past len or a bound */
} ex_rd_t;

static uint32_t get_u32(ex_rd_t *r) {
  if (r->err || r->len - r->off < 4) {
    r->err = 1;
    return 0;
  }
  const uint8_t *x = r->p + r->off;
  r->off += 4;
  return (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
}

static uint64_t get_u64(ex_rd_t *r) {
  uint64_t lo = get_u32(r);
  return lo | (uint64_t)get_u32(r) << 32;
}

/* A string into out[cap] (NUL-terminated); longer than cap-1 is an error. */
static void get_str(ex_rd_t *r, char *out, size_t cap) {
  uint32_t n = get_u32(r);
  if (r->err || n >= cap || r->len - r->off < n) {
    r->err = 1;
    out[0] = '\0';
    return;
  }
  memcpy(out, r->p + r->off, n);
  out[n] = '\0';
  r->off += n;
}

/* A count, bounded by max. */
static uint32_t get_count(ex_rd_t *r, uint32_t max) {
  uint32_t n = get_u32(r);
  if (n > max)
    r->err = 1;
  return r->err ? 0 : n;
}

void ex_job_encode(ex_buf_t *b, const ex_job_t *j) {
  put_str(b, j->req_id);
  put_u32(b, j->flags);
  put_u32(b, j->width);
  put_u32(b, j->height);
  put_u32(b, j->n_images);
  for (uint32_t i = 0; i < j->n_images; i++) {
    put_u64(b, j->seeds[i]);
    put_str(b, j->hashes[i]);
    put_u32(b, j->cached[i]);
  }
  put_u32(b, j->n_prompt);
  for (uint32_t i = 0; i < j->n_prompt; i++)
    put_u32(b, j->prompt[i]);
  put_u32(b, j->n_output);
  put_u32(b, j->kv_timeout_ms);
  put_str(b, j->prefill_instance);
}

int ex_job_decode(const uint8_t *p, size_t len, ex_job_t *j) {
  ex_rd_t r = {p, len, 0, 0};
  get_str(&r, j->req_id, sizeof j->req_id);
  j->flags = get_u32(&r);
  j->width = get_u32(&r);
  j->height = get_u32(&r);
  if (j->width == 0 || j->width > EX_MAX_SIDE || j->height == 0 || j->height > EX_MAX_SIDE)
    r.err = 1;
  j->n_images = get_count(&r, EX_MAX_IMAGES);
  for (uint32_t i = 0; i < j->n_images && !r.err; i++) {
    j->seeds[i] = get_u64(&r);
    get_str(&r, j->hashes[i], sizeof j->hashes[i]);
    j->cached[i] = get_u32(&r);
  }
  j->n_prompt = get_count(&r, EX_MAX_PROMPT);
  for (uint32_t i = 0; i < j->n_prompt && !r.err; i++) {
    j->prompt[i] = get_u32(&r);
    if (j->prompt[i] >= EX_VOCAB)
      r.err = 1;
  }
  j->n_output = get_count(&r, EX_MAX_OUTPUT);
  j->kv_timeout_ms = get_u32(&r);
  get_str(&r, j->prefill_instance, sizeof j->prefill_instance);
  return r.err || r.off != len ? ECS_EPROTO : ECS_OK;
}

void ex_done_encode(ex_buf_t *b, const ex_done_t *d) {
  put_u32(b, (uint32_t)d->status);
  put_str(b, d->reason);
  put_str(b, d->path);
  const uint64_t *f = (const uint64_t *)&d->st;
  put_u32(b, (uint32_t)EX_STATS_FIELDS);
  for (size_t i = 0; i < EX_STATS_FIELDS; i++)
    put_u64(b, f[i]);
}

int ex_done_decode(const uint8_t *p, size_t len, ex_done_t *d) {
  ex_rd_t r = {p, len, 0, 0};
  memset(d, 0, sizeof *d);
  d->status = (int32_t)get_u32(&r);
  get_str(&r, d->reason, sizeof d->reason);
  get_str(&r, d->path, sizeof d->path);
  uint32_t n = get_count(&r, 1024);
  uint64_t *f = (uint64_t *)&d->st;
  for (uint32_t i = 0; i < n && !r.err; i++) {
    uint64_t v = get_u64(&r);
    if (i < EX_STATS_FIELDS) /* a newer peer's extra counters are skipped */
      f[i] = v;
  }
  return r.err || r.off != len ? ECS_EPROTO : ECS_OK;
}

void ex_token_encode(ex_buf_t *b, uint32_t index, uint32_t token) {
  put_u32(b, index);
  put_u32(b, token);
}

int ex_token_decode(const uint8_t *p, size_t len, uint32_t *index, uint32_t *token) {
  ex_rd_t r = {p, len, 0, 0};
  *index = get_u32(&r);
  *token = get_u32(&r);
  return r.err || r.off != len || *token >= EX_VOCAB ? ECS_EPROTO : ECS_OK;
}

void ex_stats_add(ex_stats_t *a, const ex_stats_t *b) {
  uint64_t *x = (uint64_t *)a;
  const uint64_t *y = (const uint64_t *)b;
  for (size_t i = 0; i < EX_STATS_FIELDS; i++)
    x[i] += y[i];
}

int ex_send(int fd, uint16_t type, const void *payload, size_t len, uint64_t deadline_ms) {
  uint8_t h[EX_HDR_LEN];
  uint32_t m = EX_MAGIC, l = (uint32_t)len;
  for (int i = 0; i < 4; i++) {
    h[i] = (uint8_t)(m >> (8 * i));
    h[8 + i] = (uint8_t)(l >> (8 * i));
  }
  h[4] = (uint8_t)type;
  h[5] = (uint8_t)(type >> 8);
  h[6] = h[7] = 0;
  struct iovec iov[2] = {{h, EX_HDR_LEN}, {(void *)payload, len}};
  return ecs_net_writev_all(fd, iov, len ? 2 : 1, deadline_ms);
}

int ex_send_buf(int fd, uint16_t type, ex_buf_t *b, uint64_t deadline_ms) {
  if (b->oom)
    return ECS_ENOMEM;
  return ex_send(fd, type, b->p, b->len, deadline_ms);
}

int ex_recv(int fd, uint16_t *type, ex_buf_t *buf, size_t *len, uint64_t deadline_ms) {
  uint8_t h[EX_HDR_LEN];
  int rc = ecs_net_read_all(fd, h, sizeof h, deadline_ms);
  if (rc != ECS_OK)
    return rc;
  uint32_t m = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
  uint32_t l = (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
  if (m != EX_MAGIC || h[6] != 0 || h[7] != 0 || l > EX_MAX_FRAME)
    return ECS_EPROTO;
  *type = (uint16_t)(h[4] | h[5] << 8);
  buf->len = 0;
  if (ex_buf_reserve(buf, l + 1) != 0)
    return ECS_ENOMEM;
  if (l > 0 && (rc = ecs_net_read_all(fd, buf->p, l, deadline_ms)) != ECS_OK)
    return rc;
  buf->len = l;
  *len = l;
  return ECS_OK;
}

int ex_send_done(int fd, const ex_done_t *d, uint64_t deadline_ms) {
  ex_buf_t b = {0};
  ex_done_encode(&b, d);
  int rc = ex_send_buf(fd, EX_MSG_DONE, &b, deadline_ms);
  ex_buf_free(&b);
  return rc;
}

int ex_connect(const char *hostport, int timeout_ms, int *fd) {
  char host[128];
  int port;
  int rc = ecs_net_parse_hostport(hostport, host, sizeof host, &port);
  if (rc != ECS_OK)
    return rc;
  return ecs_net_connect(host, port, timeout_ms, fd);
}
