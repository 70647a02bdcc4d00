/*
 * The Redis link (see rds.h): the reply wait is bounded by setting the
 * socket timeout to what is left of the deadline before each blocking
 * read, and every failure goes through one mapping (rds_io_fail).
 */
#include "store/rds.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "ecstore/error.h"
#include "store/net.h"

#define RDS_DEFAULT_PORT 6379

void ecs__rds_seterr(ecs__rds_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
}

int ecs__rds_parse_u64(const char *s, size_t len, uint64_t *out) {
  if (len == 0 || len > 20)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    uint64_t d = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

int ecs__rds_parse_url(const char *url, char *host, size_t hostcap, int *port, int *db) {
  if (url == NULL)
    return ECS_EINVAL;
  if (strncmp(url, "redis://", 8) == 0)
    url += 8;
  else if (strstr(url, "://") != NULL)
    return ECS_EINVAL;
  const char *slash = strchr(url, '/');
  size_t hp_len = slash ? (size_t)(slash - url) : strlen(url);
  *db = 0;
  if (slash != NULL && slash[1] != '\0') {
    uint64_t v;
    if (ecs__rds_parse_u64(slash + 1, strlen(slash + 1), &v) != 0 || v > 1000000)
      return ECS_EINVAL;
    *db = (int)v;
  }
  const char *h = url, *colon;
  size_t hlen;
  if (hp_len > 0 && url[0] == '[') {
    const char *rb = memchr(url, ']', hp_len);
    if (rb == NULL)
      return ECS_EINVAL;
    h = url + 1;
    hlen = (size_t)(rb - h);
    colon = rb + 1 < url + hp_len ? rb + 1 : NULL;
    if (colon != NULL && *colon != ':')
      return ECS_EINVAL;
  } else {
    colon = memchr(url, ':', hp_len);
    hlen = colon ? (size_t)(colon - url) : hp_len;
  }
  if (hlen == 0 || hlen >= hostcap)
    return ECS_EINVAL;
  for (size_t i = 0; i < hlen; i++)
    if (h[i] <= ' ' || h[i] == '@' || h[i] == '/' || h[i] == '[' || h[i] == ']' || h[i] == 0x7f)
      return ECS_EINVAL;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  *port = RDS_DEFAULT_PORT;
  if (colon != NULL) {
    uint64_t v;
    size_t plen = (size_t)(url + hp_len - (colon + 1));
    if (ecs__rds_parse_u64(colon + 1, plen, &v) != 0 || v == 0 || v > 65535)
      return ECS_EINVAL;
    *port = (int)v;
  }
  return ECS_OK;
}

int ecs__rds_init(ecs__rds_t *r, const char *url, int connect_timeout_ms, int timeout_ms) {
  memset(r, 0, sizeof *r);
  r->connect_timeout_ms = connect_timeout_ms;
  r->timeout_ms = timeout_ms;
  if (url == NULL || url[0] == '\0') {
    ecs__rds_seterr(r, "no redis_url configured");
    return ECS_EINVAL;
  }
  if (ecs__rds_parse_url(url, r->host, sizeof r->host, &r->port, &r->db) != ECS_OK) {
    ecs__rds_seterr(r, "bad redis_url \"%.200s\"", url);
    return ECS_EINVAL;
  }
  return ECS_OK;
}

void ecs__rds_close(ecs__rds_t *r) {
  if (r->c != NULL)
    redisFree(r->c);
  r->c = NULL;
  r->used = 0;
}

int ecs__rds_up(const ecs__rds_t *r) {
  return r->c != NULL;
}

const char *ecs__rds_errmsg(const ecs__rds_t *r) {
  return r->err;
}

uint64_t ecs__rds_deadline(const ecs__rds_t *r) {
  return ecs_now_ms() + (uint64_t)r->timeout_ms;
}

static void set_tv(struct timeval *tv, uint64_t ms) {
  tv->tv_sec = (time_t)(ms / 1000);
  tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
}

/* A failed context call: the code, the message, and the link dropped. */
static int rds_io_fail(ecs__rds_t *r, int saved_errno, const char *what) {
  const char *es = r->c ? r->c->errstr : "no link";
  int rc = ECS_ECONN;
  if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT ||
      strstr(es, "temporarily unavailable") != NULL || strstr(es, "timed out") != NULL)
    rc = ECS_ETIMEDOUT;
  ecs__rds_seterr(r, "redis %s:%d: %s: %s", r->host, r->port, what, rc == ECS_ETIMEDOUT ? "timed out" : es);
  ecs__rds_close(r);
  return rc;
}

int ecs__rds_connect(ecs__rds_t *r) {
  if (r->c != NULL)
    return ECS_OK;
  if (r->host[0] == '\0') {
    ecs__rds_seterr(r, "no redis_url configured");
    return ECS_EINVAL;
  }
  struct timeval tv;
  set_tv(&tv, (uint64_t)r->connect_timeout_ms);
  errno = 0;
  redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
  if (c == NULL) {
    ecs__rds_seterr(r, "redis connect: out of memory");
    return ECS_ENOMEM;
  }
  if (c->err != 0) {
    int rc = (errno == ETIMEDOUT || strstr(c->errstr, "timed out") != NULL) ? ECS_ETIMEDOUT : ECS_ECONN;
    ecs__rds_seterr(r, "redis connect %s:%d: %s", r->host, r->port, c->errstr);
    redisFree(c);
    return rc;
  }
  r->c = c;
  if (r->db != 0) {
    char db[16];
    snprintf(db, sizeof db, "%d", r->db);
    const char *argv[] = {"SELECT", db};
    redisReply *rep;
    int rc = ecs__rds_cmd(r, &rep, 2, argv, NULL);
    if (rc != ECS_OK) {
      ecs__rds_close(r);
      return rc;
    }
    freeReplyObject(rep);
  }
  r->used = 0; /* only a caller's reply makes the link "used" */
  return ECS_OK;
}

int ecs__rds_append(ecs__rds_t *r, int argc, const char **argv, const size_t *lens) {
  int rc = ecs__rds_connect(r);
  if (rc != ECS_OK)
    return rc;
  size_t tmp[16];
  if (lens == NULL) {
    if (argc > 16)
      return ECS_EINVAL;
    for (int i = 0; i < argc; i++)
      tmp[i] = strlen(argv[i]);
    lens = tmp;
  }
  if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) {
    ecs__rds_seterr(r, "redis: out of memory");
    ecs__rds_close(r);
    return ECS_ENOMEM;
  }
  return ECS_OK;
}

int ecs__rds_reply_any(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out) {
  void *rep = NULL;
  *out = NULL;
  if (r->c == NULL) {
    ecs__rds_seterr(r, "redis %s:%d: link down", r->host, r->port);
    return ECS_ECONN;
  }
  if (redisReaderGetReply(r->c->reader, &rep) != REDIS_OK) {
    ecs__rds_seterr(r, "redis %s:%d: protocol error: %s", r->host, r->port, r->c->reader->errstr);
    ecs__rds_close(r);
    return ECS_EREDIS;
  }
  if (rep == NULL) {
    uint64_t now = ecs_now_ms();
    if (now >= deadline_ms)
      return rds_io_fail(r, ETIMEDOUT, "reply");
    struct timeval tv;
    set_tv(&tv, deadline_ms - now);
    if (redisSetTimeout(r->c, tv) != REDIS_OK)
      return rds_io_fail(r, errno, "setsockopt");
    errno = 0;
    if (redisGetReply(r->c, &rep) != REDIS_OK)
      return rds_io_fail(r, errno, "reply");
  }
  r->used = 1;
  *out = rep;
  return ECS_OK;
}

int ecs__rds_reply(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out) {
  redisReply *reply;
  int rc = ecs__rds_reply_any(r, deadline_ms, &reply);
  *out = NULL;
  if (rc != ECS_OK)
    return rc;
  if (reply->type == REDIS_REPLY_ERROR) {
    ecs__rds_seterr(r, "redis: %.*s", (int)(reply->len < 200 ? reply->len : 200), reply->str);
    freeReplyObject(reply);
    return ECS_EREDIS;
  }
  *out = reply;
  return ECS_OK;
}

int ecs__rds_cmd(ecs__rds_t *r, redisReply **out, int argc, const char **argv, const size_t *lens) {
  *out = NULL;
  int rc = ecs__rds_append(r, argc, argv, lens);
  if (rc != ECS_OK)
    return rc;
  return ecs__rds_reply(r, ecs__rds_deadline(r), out);
}
