/*
 * The Redis link (see rds.h): the reply wait is bounded by setting the
 * socket timeout to what is left of the deadline before each blocking
 * read, and every failure goes through one mapping (rds_io_fail).  URLs
 * and secrets are rds_url.c's.
 */
#include "store/redis/rds.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/net.h"

static int rds_get_reply(ecs__rds_t *r, void **rep);

void ecs__rds_seterr(ecs__rds_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
}

/* The socket timeout of a sentinel's next reply: per_ms, within until.
 * 0, or -1 (why set) when nothing is left or setsockopt failed. */
static int rds_sentinel_retime(redisContext *c, uint64_t until, int per_ms, char *why, size_t cap) {
  if (until == 0)
    return 0;
  uint64_t now = ecs_now_ms();
  if (now >= until) {
    snprintf(why, cap, "out of time");
    return -1;
  }
  uint64_t ms = until - now < (uint64_t)per_ms ? until - now : (uint64_t)per_ms;
  struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  if (redisSetTimeout(c, tv) != REDIS_OK) {
    snprintf(why, cap, "%s", c->errstr[0] ? c->errstr : "setsockopt failed");
    return -1;
  }
  return 0;
}

/* AUTH to a sentinel on c when u has a sentinel password.  0, or -1 with
 * the reason in why (*auth_failed set when the sentinel refused it). */
static int sentinel_auth(redisContext *c, const ecs__rds_url_t *u, char *why, size_t cap, int *auth_failed) {
  if (u->spass[0] == '\0')
    return 0;
  const char *argv[3] = {"AUTH"};
  size_t lens[3] = {4};
  int n = 1;
  if (u->suser[0])
    argv[n] = u->suser, lens[n] = strlen(u->suser), n++;
  argv[n] = u->spass, lens[n] = strlen(u->spass), n++;
  redisReply *rep = redisCommandArgv(c, n, argv, lens);
  int rc = 0;
  if (rep == NULL) {
    snprintf(why, cap, "%s", c->errstr[0] ? c->errstr : "no reply to AUTH");
    rc = -1;
  } else if (rep->type == REDIS_REPLY_ERROR) {
    /* the sentinel's words (WRONGPASS ..., "AUTH ... without any password
     * configured") hold no secret */
    snprintf(why, cap, "authentication failed%s%.60s: %.100s", u->suser[0] ? " as user " : "", u->suser,
             rep->str);
    *auth_failed = 1;
    rc = -1;
  }
  if (rep != NULL)
    freeReplyObject(rep);
  return rc;
}

/* ms until the monotonic until, at most ms (until 0: ms); 0 once past. */
static int rds_left(uint64_t until, int ms) {
  if (until == 0)
    return ms;
  uint64_t now = ecs_now_ms();
  if (now >= until)
    return 0;
  return until - now < (uint64_t)ms ? (int)(until - now) : ms;
}

int ecs__rds_sentinel_resolve(const ecs__rds_url_t *u, int per_ms, char *host, size_t hostcap, int *port,
                              char *err, size_t errlen) {
  return ecs__rds_sentinel_resolve_by(u, per_ms, 0, host, hostcap, port, err, errlen);
}

int ecs__rds_sentinel_resolve_by(const ecs__rds_url_t *u, int per_ms, uint64_t until, char *host,
                                 size_t hostcap, int *port, char *err, size_t errlen) {
  size_t k = 0;
  int auth_failed = 0, out_of_time = 0;
  err[0] = '\0';
  k += (size_t)snprintf(err, errlen, "redis-sentinel: no sentinel knows master '%s':", u->master);
  size_t head = k; /* rewritten below when a sentinel refused our AUTH */
  for (const char *p = u->sentinels; *p;) {
    /* each sentinel gets per_ms for its connect and each reply, within
     * what is left until `until` (C1: they were chained in full) */
    int ms = rds_left(until, per_ms);
    if (ms <= 0) {
      out_of_time = 1;
      if (k < errlen)
        k += (size_t)snprintf(err + k, errlen - k, " out of time before the next sentinel;");
      break;
    }
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char sh[256], why[320];
    int sp;
    const char *entry = p;
    p = comma ? comma + 1 : p + len;
    if (ecs__rds_hostport(entry, len, sh, sizeof sh, &sp) != 0)
      continue; /* checked by the parse */
    redisContext *c = redisConnectWithTimeout(sh, sp, tv);
    redisReply *rep = NULL;
    if (c != NULL)
      ecs__rds_bound_reader(c->reader, 1); /* a sentinel's reply is small: bounded as any */
    if (c == NULL || c->err != 0) {
      snprintf(why, sizeof why, "%s", c ? c->errstr : "out of memory");
    } else if (redisSetTimeout(c, tv) != REDIS_OK) {
      snprintf(why, sizeof why, "%s", c->errstr[0] ? c->errstr : "setsockopt failed");
    } else if (sentinel_auth(c, u, why, sizeof why, &auth_failed) != 0) {
      /* why says it */
    } else if (rds_sentinel_retime(c, until, per_ms, why, sizeof why) != 0) {
      /* out of time after the AUTH */
    } else if ((rep = redisCommand(c, "SENTINEL get-master-addr-by-name %s", u->master)) == NULL) {
      snprintf(why, sizeof why, "%s", c->errstr[0] ? c->errstr : "no reply");
    } else if (rep->type == REDIS_REPLY_ERROR) {
      int noauth = rep->len >= 6 && memcmp(rep->str, "NOAUTH", 6) == 0;
      auth_failed |= noauth;
      snprintf(why, sizeof why, "%.100s%s", rep->str,
               noauth ? " (this sentinel requires a password: --sentinel-password-file, "
                        "ECSTORE_SENTINEL_PASSWORD or sentinel_password_file)"
                      : "");
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
               rep->element[0]->type != REDIS_REPLY_STRING || rep->element[1]->type != REDIS_REPLY_STRING) {
      snprintf(why, sizeof why, "%s", rep->type == REDIS_REPLY_NIL ? "unknown master" : "unexpected reply");
    } else {
      uint64_t v;
      const redisReply *h = rep->element[0], *pr = rep->element[1];
      if (h->len == 0 || h->len >= hostcap || memchr(h->str, '\0', h->len) != NULL ||
          ecs__rds_parse_u64(pr->str, pr->len, &v) != 0 || v == 0 || v > 65535) {
        snprintf(why, sizeof why, "a malformed address");
      } else {
        memcpy(host, h->str, h->len);
        host[h->len] = '\0';
        *port = (int)v;
        freeReplyObject(rep);
        redisFree(c);
        err[0] = '\0';
        return ECS_OK;
      }
    }
    if (rep != NULL)
      freeReplyObject(rep);
    if (c != NULL)
      redisFree(c);
    if (k < errlen)
      k += (size_t)snprintf(err + k, errlen - k, " sentinel %s:%d: %s;", sh, sp, why);
  }
  if (out_of_time && !auth_failed)
    return ECS_ETIMEDOUT;
  if (auth_failed && head < errlen) {
    char list[1024];
    snprintf(list, sizeof list, "%s", err + head);
    snprintf(err, errlen, "redis-sentinel: authentication to the sentinels failed (master '%s'):%s",
             u->master, list);
    return ECS_EAUTH;
  }
  return ECS_ECONN;
}

void ecs__rds_set_route(ecs__rds_t *r, const char *key) {
  snprintf(r->route, sizeof r->route, "%s", key ? key : "");
}

int ecs__rds_role_is_master(const redisReply *rep) {
  return rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
         rep->element[0]->type == REDIS_REPLY_STRING && rep->element[0]->len == 6 &&
         memcmp(rep->element[0]->str, "master", 6) == 0;
}

int ecs__rds_init(ecs__rds_t *r, const char *url, int connect_timeout_ms, int timeout_ms) {
  memset(r, 0, sizeof *r);
  r->connect_timeout_ms = connect_timeout_ms;
  r->timeout_ms = timeout_ms;
  ecs__rds_url_t u;
  int rc = ecs__rds_url_resolve(url, &u, r->err, sizeof r->err);
  if (rc != ECS_OK)
    return rc;
  snprintf(r->host, sizeof r->host, "%s", u.host);
  r->port = u.port;
  r->db = u.db;
  snprintf(r->user, sizeof r->user, "%s", u.user);
  snprintf(r->sentinels, sizeof r->sentinels, "%s", u.sentinels);
  snprintf(r->master, sizeof r->master, "%s", u.master);
  memcpy(r->suser, u.suser, sizeof r->suser);
  memcpy(r->spass, u.spass, sizeof r->spass);
  memcpy(r->seeds, u.seeds, sizeof r->seeds);
  r->cluster = u.cluster;
  if (strlen(url) < sizeof r->url)
    snprintf(r->url, sizeof r->url, "%s", url);
  rc = ecs__rds_set_password(r, u.pass);
  memset(&u, 0, sizeof u);
  return rc;
}

int ecs__rds_set_password(ecs__rds_t *r, const char *pass) {
  if (strlen(pass) >= sizeof r->pass) {
    ecs__rds_seterr(r, "redis password longer than %zu bytes", sizeof r->pass - 1);
    return ECS_EINVAL;
  }
  memset(r->pass, 0, sizeof r->pass);
  snprintf(r->pass, sizeof r->pass, "%s", pass);
  return ECS_OK;
}

void ecs__rds_close(ecs__rds_t *r) {
  if (r->c != NULL)
    redisFree(r->c);
  r->c = NULL;
  r->used = 0;
  r->discard = 0; /* their replies went with the connection */
}

int ecs__rds_up(const ecs__rds_t *r) {
  return r->c != NULL;
}

const char *ecs__rds_errmsg(const ecs__rds_t *r) {
  return r->err;
}

uint64_t ecs__rds_deadline(const ecs__rds_t *r) {
  uint64_t d = ecs_now_ms() + (uint64_t)r->timeout_ms;
  return r->until != 0 && r->until < d ? r->until : d;
}

void ecs__rds_set_until(ecs__rds_t *r, uint64_t until_ms) {
  r->until = until_ms;
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

static int rds_connect_once(ecs__rds_t *r) {
  if (r->host[0] == '\0') {
    ecs__rds_seterr(r, "no redis_url configured");
    return ECS_EINVAL;
  }
  r->readonly = 0;
  r->discard = 0; /* a fresh connection owes no fire-and-forget reply */
  if (r->master[0]) {
    ecs__rds_url_t su;
    memset(&su, 0, sizeof su);
    snprintf(su.sentinels, sizeof su.sentinels, "%s", r->sentinels);
    snprintf(su.master, sizeof su.master, "%s", r->master);
    memcpy(su.suser, r->suser, sizeof su.suser);
    memcpy(su.spass, r->spass, sizeof su.spass);
    char why[sizeof r->err];
    int rc = ecs__rds_sentinel_resolve_by(&su, r->connect_timeout_ms, r->until, r->host, sizeof r->host,
                                          &r->port, why, sizeof why);
    memset(&su, 0, sizeof su);
    if (rc != ECS_OK) {
      ecs__rds_seterr(r, "%s", why);
      return rc;
    }
  }
  int cms = rds_left(r->until, r->connect_timeout_ms);
  if (cms <= 0) {
    ecs__rds_seterr(r, "redis connect %s:%d: timed out (the call's deadline passed)", r->host, r->port);
    return ECS_ETIMEDOUT;
  }
  struct timeval tv;
  set_tv(&tv, (uint64_t)cms);
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
  ecs__rds_bound_reader(c->reader, 0);
  ecs__rds_url_t u;
  memset(&u, 0, sizeof u);
  memcpy(u.user, r->user, sizeof u.user);
  memcpy(u.pass, r->pass, sizeof u.pass);
  const char *aargv[3];
  size_t alens[3];
  int aargc = ecs__rds_auth_argv(&u, aargv, alens);
  if (aargc > 0) {
    redisReply *rep;
    int rc = ecs__rds_append(r, aargc, aargv, alens);
    if (rc == ECS_OK)
      rc = ecs__rds_reply_any(r, ecs__rds_deadline(r), &rep);
    memset(&u, 0, sizeof u);
    if (rc != ECS_OK) {
      ecs__rds_close(r);
      return rc;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
      /* Redis's own words (WRONGPASS ..., or "AUTH <password> called
       * without any password configured") hold no secret */
      ecs__rds_seterr(r, "redis %s:%d: authentication failed%s%s: %.*s", r->host, r->port,
                      r->user[0] ? " as user " : "", r->user, (int)(rep->len < 150 ? rep->len : 150),
                      rep->str);
      freeReplyObject(rep);
      ecs__rds_close(r);
      return ECS_EAUTH;
    }
    freeReplyObject(rep);
  }
  memset(&u, 0, sizeof u);
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
  if (r->master[0]) { /* Sentinel's client rule: verify what the sentinels said */
    const char *argv[] = {"ROLE"};
    redisReply *rep;
    int rc = ecs__rds_cmd(r, &rep, 1, argv, NULL);
    if (rc != ECS_OK) {
      ecs__rds_close(r);
      return rc;
    }
    int master = ecs__rds_role_is_master(rep);
    freeReplyObject(rep);
    if (!master) {
      ecs__rds_seterr(r, "redis %s:%d: named by the sentinels as master '%s' but is not a master (yet)",
                      r->host, r->port, r->master);
      ecs__rds_close(r);
      return ECS_ECONN;
    }
  }
  r->used = 0; /* only a caller's reply makes the link "used" */
  return ECS_OK;
}

/* A MOVED reply was seen: the link goes to the node it named. */
static void rds_take_move(ecs__rds_t *r) {
  if (!r->moved)
    return;
  r->moved = 0;
  ecs__rds_close(r);
  snprintf(r->host, sizeof r->host, "%s", r->mhost);
  r->port = r->mport;
}

/* rds_connect_once, and with a redis-cluster:// seed list, when the node
 * in use does not answer (refused, unreachable, timed out), the seeds in
 * the order listed until one does (the route probe then follows MOVED
 * from there).  Only connection failures move on: a refused AUTH is the
 * same on every node. */
static int rds_connect_seeds(ecs__rds_t *r) {
  int rc = rds_connect_once(r);
  if (!r->seeds[0] || (rc != ECS_ECONN && rc != ECS_ETIMEDOUT))
    return rc;
  char tried[256], why[sizeof r->err];
  int tport = r->port;
  snprintf(tried, sizeof tried, "%s", r->host);
  size_t k = (size_t)snprintf(why, sizeof why, "redis-cluster: no seed node answered: %s;", r->err);
  for (const char *p = r->seeds; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char h[256];
    int port;
    int ok = ecs__rds_hostport(p, len, h, sizeof h, &port) == 0; /* checked by the parse */
    p = comma ? comma + 1 : p + len;
    if (!ok || (port == tport && strcmp(h, tried) == 0))
      continue;
    snprintf(r->host, sizeof r->host, "%s", h);
    r->port = port;
    rc = rds_connect_once(r);
    if (rc != ECS_ECONN && rc != ECS_ETIMEDOUT)
      return rc;
    if (k < sizeof why)
      k += (size_t)snprintf(why + k, sizeof why - k, " %s;", r->err);
  }
  ecs__rds_seterr(r, "%s", why);
  return rc;
}

int ecs__rds_connect(ecs__rds_t *r) {
  if (r->c != NULL)
    return ECS_OK;
  rds_take_move(r);
  /* Redis Cluster: up to 3 redirections to the route key's master */
  for (int hop = 0; hop < 3; hop++) {
    int rc = hop == 0 ? rds_connect_seeds(r) : rds_connect_once(r);
    if (rc != ECS_OK || r->route[0] == '\0' || r->master[0] || !r->cluster)
      return rc;
    const char *argv[] = {"EXISTS", r->route};
    redisReply *rep;
    rc = ecs__rds_append(r, 2, argv, NULL);
    if (rc == ECS_OK)
      rc = ecs__rds_reply_any(r, ecs__rds_deadline(r), &rep);
    if (rc != ECS_OK)
      return rc;
    int err = rep->type == REDIS_REPLY_ERROR;
    if (err && !r->moved)
      ecs__rds_seterr(r, "redis %s:%d: %.*s", r->host, r->port, (int)(rep->len < 200 ? rep->len : 200),
                      rep->str);
    freeReplyObject(rep);
    r->used = 0;
    if (!err)
      return ECS_OK;
    if (!r->moved) {
      ecs__rds_close(r);
      return ECS_EREDIS;
    }
    rds_take_move(r);
  }
  ecs__rds_seterr(r, "redis %s:%d: more than 3 cluster redirections for one slot", r->host, r->port);
  ecs__rds_close(r);
  return ECS_EREDIS;
}

const size_t *ecs__rds_arglens(int argc, const char **argv, const size_t *lens,
                               size_t tmp[ECS_RDS_MAX_ARGS]) {
  if (lens != NULL)
    return lens;
  if (argc < 0 || argc > ECS_RDS_MAX_ARGS)
    return NULL;
  for (int i = 0; i < argc; i++)
    tmp[i] = strlen(argv[i]);
  return tmp;
}

int ecs__rds_append(ecs__rds_t *r, int argc, const char **argv, const size_t *lens) {
  if (r->readonly && r->c != NULL)
    ecs__rds_close(r); /* a demoted master: ask the sentinels again */
  if (r->moved)
    rds_take_move(r); /* a slot moved: to its new node */
  int rc = ecs__rds_connect(r);
  if (rc != ECS_OK)
    return rc;
  size_t tmp[ECS_RDS_MAX_ARGS];
  if ((lens = ecs__rds_arglens(argc, argv, lens, tmp)) == NULL)
    return ECS_EINVAL;
  if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) {
    ecs__rds_seterr(r, "redis: out of memory");
    ecs__rds_close(r);
    return ECS_ENOMEM;
  }
  return ECS_OK;
}

int ecs__rds_send_noreply(ecs__rds_t *r, int argc, const char **argv, const size_t *lens) {
  if (r->c == NULL || r->readonly || r->moved)
    return ECS_ENOTCONN; /* down, or about to reconnect: a reconnect could wait */
  size_t tmp[ECS_RDS_MAX_ARGS];
  if ((lens = ecs__rds_arglens(argc, argv, lens, tmp)) == NULL)
    return ECS_EINVAL;
  if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) {
    ecs__rds_seterr(r, "redis: out of memory");
    ecs__rds_close(r);
    return ECS_ENOMEM;
  }
  r->discard++;
  int done = 0; /* one write; what it left goes with the next command */
  if (redisBufferWrite(r->c, &done) != REDIS_OK)
    return rds_io_fail(r, errno, "write");
  return ECS_OK;
}

static int rds_reply_one(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out);

int ecs__rds_reply_any(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out) {
  *out = NULL;
  while (r->discard > 0 && r->c != NULL) { /* fire-and-forget replies first */
    redisReply *rep;
    int rc = rds_reply_one(r, deadline_ms, &rep);
    if (rc != ECS_OK)
      return rc;
    freeReplyObject(rep);
    if (r->discard > 0)
      r->discard--;
  }
  return rds_reply_one(r, deadline_ms, out);
}

static int rds_reply_one(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out) {
  void *rep = NULL;
  *out = NULL;
  if (r->c == NULL) {
    ecs__rds_seterr(r, "redis %s:%d: link down", r->host, r->port);
    return ECS_ECONN;
  }
  if (redisReaderGetReply(r->c->reader, &rep) != REDIS_OK) {
    ecs__rds_seterr(r, "redis %s:%d: protocol error: %s", r->host, r->port,
                    ecs__rds_reader_errstr(r->c->reader->err, r->c->reader->errstr));
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
    int rc = rds_get_reply(r, &rep);
    if (rc != ECS_OK)
      return rc;
  }
  r->used = 1;
  const redisReply *e = rep;
  if (r->master[0] && e->type == REDIS_REPLY_ERROR && e->len >= 8 && memcmp(e->str, "READONLY", 8) == 0)
    r->readonly = 1;
  if (!r->master[0] && e->type == REDIS_REPLY_ERROR) {
    char h[64];
    int port = 0;
    size_t hl = strnlen(r->host, sizeof h);
    hl = hl < sizeof h ? hl : 0; /* an empty HOST in the reply: this one */
    memcpy(h, r->host, hl);
    h[hl] = '\0';
    int kind = ecs__rds_redirect(e->str, e->len, h, sizeof h, &port);
    if (kind == 1) {
      r->moved = 1;
      r->cluster = 1;
      memcpy(r->mhost, h, sizeof h);
      r->mport = port;
    } else if (kind == 2) {
      r->ask = 1;
      memcpy(r->ahost, h, sizeof h);
      r->aport = port;
    }
  }
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

/* ASK: the command once more at the node named, after ASKING, on a
 * one-off link with the same credentials. */
static int rds_ask(ecs__rds_t *r, redisReply **out, int argc, const char **argv, const size_t *lens) {
  ecs__rds_t *t = malloc(sizeof *t);
  if (t == NULL)
    return ECS_ENOMEM;
  memcpy(t, r, sizeof *t);
  t->c = NULL;
  t->route[0] = '\0';
  t->seeds[0] = '\0'; /* the node ASK named, or nothing */
  t->moved = t->ask = t->readonly = 0;
  t->discard = 0; /* its own connection owes no reply */
  snprintf(t->host, sizeof t->host, "%s", r->ahost);
  t->port = r->aport;
  r->ask = 0;
  const char *asking[] = {"ASKING"};
  redisReply *rep;
  int rc = ecs__rds_cmd(t, &rep, 1, asking, NULL);
  if (rc == ECS_OK) {
    freeReplyObject(rep);
    rc = ecs__rds_append(t, argc, argv, lens);
    if (rc == ECS_OK)
      rc = ecs__rds_reply(t, ecs__rds_deadline(t), out);
  }
  if (rc != ECS_OK)
    ecs__rds_seterr(r, "%s (after ASK)", t->err);
  ecs__rds_close(t);
  memset(t, 0, sizeof *t);
  free(t);
  return rc;
}

int ecs__rds_cmd(ecs__rds_t *r, redisReply **out, int argc, const char **argv, const size_t *lens) {
  *out = NULL;
  int rc = ECS_EREDIS;
  /* a MOVED (the slot's node) may be followed by an ASK (its migration) */
  for (int hop = 0; hop < 3; hop++) {
    r->ask = 0;
    rc = ecs__rds_append(r, argc, argv, lens);
    if (rc != ECS_OK)
      return rc;
    rc = ecs__rds_reply(r, ecs__rds_deadline(r), out);
    if (rc == ECS_EREDIS && r->ask)
      return rds_ask(r, out, argc, argv, lens);
    if (rc != ECS_EREDIS || !r->moved)
      return rc;
  }
  return rc;
}

/* ---- bounded replies (rds.h, "Bounds") ---------------------------------- */

/* A reader's bounds; which applies is told by the table its fn points to. */
typedef struct rds_bounds {
  redisReplyObjectFunctions fn; /* hiredis's functions, wrapped */
  uint64_t max_string;          /* one string's bytes */
  uint64_t max_reply;           /* one reply's bytes in memory */
} rds_bounds_t;

static redisReplyObjectFunctions rds_default_fn; /* hiredis's own, copied once */
static rds_bounds_t rds_bounds_big, rds_bounds_small;
static pthread_once_t rds_bounds_once = PTHREAD_ONCE_INIT;

/* The refusal a reply function made on this thread, read back (and
 * cleared) by ecs__rds_reader_errstr once hiredis has turned it into its
 * "Out of memory". */
static _Thread_local char rds_refusal[128];

/* The reply's root task: hiredis resets its privdata (to the reader's,
 * NULL here) at the start of every reply and never reads it, so it holds
 * this reply's running byte count. */
static redisReadTask *rds_root(const redisReadTask *t) {
  while (t->parent != NULL)
    t = t->parent;
  return (redisReadTask *)t;
}

/* Charges n bytes to the reply of t; 0, or -1 (refusal recorded) past the
 * bound b. */
static int rds_charge(const redisReadTask *t, const rds_bounds_t *b, uint64_t n) {
  redisReadTask *root = rds_root(t);
  uint64_t used = (uint64_t)(uintptr_t)root->privdata;
  if (n > b->max_reply || used > b->max_reply - n) {
    snprintf(rds_refusal, sizeof rds_refusal, "reply too large (more than %llu bytes, limit %llu)",
             (unsigned long long)(used + (n < b->max_reply ? n : b->max_reply)),
             (unsigned long long)b->max_reply);
    return -1;
  }
  root->privdata = (void *)(uintptr_t)(used + n);
  return 0;
}

static void *rds_string(const redisReadTask *t, char *s, size_t len, const rds_bounds_t *b) {
  if ((uint64_t)len > b->max_string) {
    snprintf(rds_refusal, sizeof rds_refusal, "reply too large (%zu-byte string, limit %llu)", len,
             (unsigned long long)b->max_string);
    return NULL;
  }
  if (rds_charge(t, b, (uint64_t)len + sizeof(redisReply)) != 0)
    return NULL;
  return rds_default_fn.createString(t, s, len);
}

static void *rds_array(const redisReadTask *t, int n, const rds_bounds_t *b) {
  /* before hiredis's createArray callocs the vector of n pointers */
  if (n < 0 || n > ECS_RDS_MAX_ELEMENTS) {
    snprintf(rds_refusal, sizeof rds_refusal, "reply too large (%d elements, limit %d)", n,
             ECS_RDS_MAX_ELEMENTS);
    return NULL;
  }
  if (rds_charge(t, b, (uint64_t)n * sizeof(redisReply *) + sizeof(redisReply)) != 0)
    return NULL;
  return rds_default_fn.createArray(t, n);
}

static void *rds_integer(const redisReadTask *t, long long v, const rds_bounds_t *b) {
  return rds_charge(t, b, sizeof(redisReply)) == 0 ? rds_default_fn.createInteger(t, v) : NULL;
}

static void *rds_nil(const redisReadTask *t, const rds_bounds_t *b) {
  return rds_charge(t, b, sizeof(redisReply)) == 0 ? rds_default_fn.createNil(t) : NULL;
}

static void *big_string(const redisReadTask *t, char *s, size_t len) {
  return rds_string(t, s, len, &rds_bounds_big);
}
static void *big_array(const redisReadTask *t, int n) {
  return rds_array(t, n, &rds_bounds_big);
}
static void *big_integer(const redisReadTask *t, long long v) {
  return rds_integer(t, v, &rds_bounds_big);
}
static void *big_nil(const redisReadTask *t) {
  return rds_nil(t, &rds_bounds_big);
}
static void *small_string(const redisReadTask *t, char *s, size_t len) {
  return rds_string(t, s, len, &rds_bounds_small);
}
static void *small_array(const redisReadTask *t, int n) {
  return rds_array(t, n, &rds_bounds_small);
}
static void *small_integer(const redisReadTask *t, long long v) {
  return rds_integer(t, v, &rds_bounds_small);
}
static void *small_nil(const redisReadTask *t) {
  return rds_nil(t, &rds_bounds_small);
}

static void rds_bounds_init(void) {
  redisReader *d = redisReaderCreate();
  if (d == NULL)
    return; /* rds_default_fn stays empty: ecs__rds_bound_reader leaves readers alone */
  rds_default_fn = *d->fn;
  redisReaderFree(d);
  rds_bounds_big = (rds_bounds_t){{big_string, big_array, big_integer, big_nil, rds_default_fn.freeObject},
                                  ECS_RDS_MAX_STRING,
                                  ECS_RDS_MAX_REPLY};
  rds_bounds_small =
      (rds_bounds_t){{small_string, small_array, small_integer, small_nil, rds_default_fn.freeObject},
                     ECS_RDS_MAX_STRING_SMALL,
                     ECS_RDS_MAX_REPLY_SMALL};
}

void ecs__rds_bound_reader(redisReader *rd, int small) {
  pthread_once(&rds_bounds_once, rds_bounds_init);
  if (rd == NULL || rds_default_fn.createArray == NULL)
    return;
  rd->fn = small ? &rds_bounds_small.fn : &rds_bounds_big.fn;
}

const char *ecs__rds_reader_errstr(int err, const char *errstr) {
  static _Thread_local char shown[128];
  if (err != REDIS_ERR_OOM || rds_refusal[0] == '\0')
    return errstr;
  memcpy(shown, rds_refusal, sizeof shown);
  rds_refusal[0] = '\0';
  return shown;
}

/* A header's number: digits with an optional '-', at most 19 of them. */
static int rds_header_num(const char *p, const char *end, long long *out) {
  int neg = p < end && *p == '-';
  p += neg;
  uint64_t v;
  if (end - p > 19 || ecs__rds_parse_u64(p, (size_t)(end - p), &v) != 0)
    return -1;
  *out = neg ? -(long long)v : (long long)v;
  return 0;
}

__attribute__((format(printf, 2, 3))) static void rds_guard_fail(redisReader *rd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rd->err = REDIS_ERR_PROTOCOL;
  vsnprintf(rd->errstr, sizeof rd->errstr, fmt, ap);
  va_end(ap);
}

void ecs__rds_reader_guard(redisReader *rd) {
  const rds_bounds_t *b = rd == NULL                       ? NULL
                          : rd->fn == &rds_bounds_big.fn   ? &rds_bounds_big
                          : rd->fn == &rds_bounds_small.fn ? &rds_bounds_small
                                                           : NULL;
  if (b == NULL || rd->err != 0 || rd->buf == NULL || rd->pos >= rd->len)
    return;
  const char *p = rd->buf + rd->pos, *end = rd->buf + rd->len;
  int type = -1;
#if HIREDIS_MAJOR == 0
  /* 0.14 consumes an item's type byte before its header line: the item
   * under way (type known) has its header at pos */
  if (rd->ridx >= 0 && rd->ridx < 9 && rd->rstack[rd->ridx].type >= 0)
    type = rd->rstack[rd->ridx].type;
#else
  if (rd->ridx >= 0 && rd->task != NULL && rd->task[rd->ridx]->type >= 0)
    type = rd->task[rd->ridx]->type;
#endif
  while (p < end) {
    if (type < 0) {
      switch (*p++) {
      case '$': type = REDIS_REPLY_STRING; break;
      case '*': type = REDIS_REPLY_ARRAY; break;
      case '+':
      case '-':
      case ':':
        type = REDIS_REPLY_STATUS; /* a line: its length is what counts */
        break;
      default: return; /* not RESP: the reader says so itself */
      }
    }
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t line = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);
    if (type == REDIS_REPLY_STATUS || type == REDIS_REPLY_ERROR || type == REDIS_REPLY_INTEGER) {
      if (line > ECS_RDS_MAX_LINE) {
        rds_guard_fail(rd, "reply too large (a line of more than %zu bytes, limit %d)", line,
                       ECS_RDS_MAX_LINE);
        return;
      }
      if (nl == NULL)
        return;
      p = nl + 1;
      type = -1;
      continue;
    }
    if (nl == NULL) {
      if (line > 24) /* a header is a number and "\r" */
        rds_guard_fail(rd, "protocol error: a header line of more than %zu bytes", line);
      return;
    }
    long long n;
    const char *numend = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
    if (rds_header_num(p, numend, &n) != 0)
      return; /* not a number: the reader says so itself */
    if (type == REDIS_REPLY_ARRAY) {
      if (n > ECS_RDS_MAX_ELEMENTS) {
        rds_guard_fail(rd, "reply too large (%lld elements, limit %d)", n, ECS_RDS_MAX_ELEMENTS);
        return;
      }
      p = nl + 1;
    } else {
      if (n > 0 && (uint64_t)n > b->max_string) {
        rds_guard_fail(rd, "reply too large (%lld-byte string, limit %llu)", n,
                       (unsigned long long)b->max_string);
        return;
      }
      if (n > 0 && (uint64_t)(end - (nl + 1)) < (uint64_t)n + 2)
        return; /* its bytes are still coming */
      p = nl + 1 + (n > 0 ? n + 2 : 0);
    }
    type = -1;
  }
}

/* redisGetReply for the blocking link, with the guard between each read
 * and the parse of what it read.  ECS_OK with *rep, or a code with the
 * link dropped. */
static int rds_get_reply(ecs__rds_t *r, void **rep) {
  redisContext *c = r->c;
  int done = 0;
  *rep = NULL;
  do {
    if (redisBufferWrite(c, &done) != REDIS_OK)
      return rds_io_fail(r, errno, "write");
  } while (!done);
  do {
    errno = 0;
    if (redisBufferRead(c) != REDIS_OK)
      return rds_io_fail(r, errno, "reply");
    ecs__rds_reader_guard(c->reader);
    if (redisReaderGetReply(c->reader, rep) != REDIS_OK) {
      ecs__rds_seterr(r, "redis %s:%d: %s", r->host, r->port,
                      ecs__rds_reader_errstr(c->reader->err, c->reader->errstr));
      ecs__rds_close(r);
      return ECS_EREDIS;
    }
  } while (*rep == NULL);
  return ECS_OK;
}
