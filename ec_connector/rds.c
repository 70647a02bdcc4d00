/*
 * The connector's Redis link (see rds.h).  Modelled on store/meta.c: the
 * reply wait is bounded by setting the socket timeout to what is left of
 * the deadline before each blocking read.
 */
#include "ec_connector/rds.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "ecstore/error.h"
#include "store/meta.h"
#include "store/net.h"

__attribute__((format(printf, 2, 3))) static void rds_seterr(ecs__rds_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
}

int ecs__rds_init(ecs__rds_t *r, const char *url, int connect_timeout_ms, int timeout_ms) {
  memset(r, 0, sizeof *r);
  r->connect_timeout_ms = connect_timeout_ms;
  r->timeout_ms = timeout_ms;
  if (url == NULL || url[0] == '\0') {
    rds_seterr(r, "no redis_url configured");
    return ECS_EINVAL;
  }
  if (ecs__meta_parse_url(url, r->host, sizeof r->host, &r->port, &r->db) != ECS_OK) {
    rds_seterr(r, "bad redis_url \"%.200s\"", url);
    return ECS_EINVAL;
  }
  return ECS_OK;
}

void ecs__rds_close(ecs__rds_t *r) {
  if (r->c != NULL)
    redisFree(r->c);
  r->c = NULL;
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
  rds_seterr(r, "redis %s:%d: %s: %s", r->host, r->port, what, rc == ECS_ETIMEDOUT ? "timed out" : es);
  ecs__rds_close(r);
  return rc;
}

int ecs__rds_connect(ecs__rds_t *r) {
  if (r->c != NULL)
    return ECS_OK;
  if (r->host[0] == '\0') {
    rds_seterr(r, "no redis_url configured");
    return ECS_EINVAL;
  }
  struct timeval tv;
  set_tv(&tv, (uint64_t)r->connect_timeout_ms);
  errno = 0;
  redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
  if (c == NULL) {
    rds_seterr(r, "redis connect: out of memory");
    return ECS_ENOMEM;
  }
  if (c->err != 0) {
    int rc = (errno == ETIMEDOUT || strstr(c->errstr, "timed out") != NULL) ? ECS_ETIMEDOUT : ECS_ECONN;
    rds_seterr(r, "redis connect %s:%d: %s", r->host, r->port, c->errstr);
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
    rds_seterr(r, "redis: out of memory");
    ecs__rds_close(r);
    return ECS_ENOMEM;
  }
  return ECS_OK;
}

int ecs__rds_reply(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out) {
  void *rep = NULL;
  *out = NULL;
  if (r->c == NULL) {
    rds_seterr(r, "redis %s:%d: link down", r->host, r->port);
    return ECS_ECONN;
  }
  if (redisReaderGetReply(r->c->reader, &rep) != REDIS_OK) {
    rds_seterr(r, "redis protocol error: %s", r->c->reader->errstr);
    ecs__rds_close(r);
    return ECS_EPROTO;
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
  redisReply *reply = rep;
  if (reply->type == REDIS_REPLY_ERROR) {
    rds_seterr(r, "redis: %.*s", (int)(reply->len < 200 ? reply->len : 200), reply->str);
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
