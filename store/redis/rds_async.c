/*
 * The asynchronous Redis link (see rds.h): hiredis's async API driven by
 * the server's epoll loop through a small adapter, and deadlines enforced
 * here, because hiredis 0.14 has neither an epoll adapter nor an async
 * timeout.
 *
 * Every command carries a small record (ecs__rdsa_cmd_t) on a FIFO in the
 * order it was sent; Redis answers in that order, so the FIFO's head is
 * always the oldest command without a reply, and its age is all the
 * deadline check needs.  When the link drops (an I/O error, EOF, bytes
 * that are not RESP, or a deadline), hiredis calls every pending callback
 * with a NULL reply; the trampoline turns that into the code of the drop
 * (r->fail_rc), so callers see the same mapping as the blocking link.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "ecstore/error.h"
#include "store/core/net.h"
#include "store/redis/rds.h"

struct ecs__rdsa_cmd {
  ecs__rdsa_t *r;             /* the link */
  ecs__rdsa_fn fn;            /* the caller's callback, or NULL */
  void *ctx;                  /* its argument */
  uint64_t t_ms;              /* when sent (monotonic) */
  struct ecs__rdsa_cmd *next; /* the next newer command */
};

static void rdsa_seterr(ecs__rdsa_t *r, const char *what, const char *why) {
  snprintf(r->err, sizeof r->err, "redis %.100s:%d: %s: %.100s", r->host, r->port, what, why);
}

/* host's address (IPv4 first, as a Redis bound to 127.0.0.1 is reached as
 * "localhost") into addr (64 bytes); host itself when it does not
 * resolve.  A blocking lookup. */
static void rdsa_resolve(const char *host, char addr[64]) {
  snprintf(addr, 64, "%.63s", host);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, NULL, &hints, &res) == 0 && res != NULL) {
    const struct addrinfo *pick = res;
    for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
      if (ai->ai_family == AF_INET) {
        pick = ai;
        break;
      }
    const void *a = pick->ai_family == AF_INET6
                        ? (const void *)&((const struct sockaddr_in6 *)pick->ai_addr)->sin6_addr
                        : (const void *)&((const struct sockaddr_in *)pick->ai_addr)->sin_addr;
    if (inet_ntop(pick->ai_family, a, addr, 64) == NULL)
      snprintf(addr, 64, "%.63s", host);
  }
  if (res != NULL)
    freeaddrinfo(res);
}

int ecs__rdsa_init(ecs__rdsa_t *r, const char *url, int timeout_ms, int epfd, void (*on_up)(void *ctx),
                   void (*on_down)(void *ctx, int rc), void *cb_ctx) {
  memset(r, 0, sizeof *r);
  r->fd = -1;
  r->epfd = epfd;
  r->timeout_ms = timeout_ms > 0 ? timeout_ms : 500;
  r->on_up = on_up;
  r->on_down = on_down;
  r->cb_ctx = cb_ctx;
  r->fail_rc = ECS_ECONN;
  ecs__rds_url_t u;
  if (ecs__rds_url_resolve(url, &u, r->err, sizeof r->err) != ECS_OK)
    return ECS_EINVAL;
  snprintf(r->host, sizeof r->host, "%s", u.host);
  r->port = u.port;
  r->db = u.db;
  memcpy(r->user, u.user, sizeof r->user);
  memcpy(r->pass, u.pass, sizeof r->pass);
  memcpy(r->sentinels, u.sentinels, sizeof r->sentinels);
  memcpy(r->master, u.master, sizeof r->master);
  memcpy(r->suser, u.suser, sizeof r->suser);
  memcpy(r->spass, u.spass, sizeof r->spass);
  r->cluster = u.cluster;
  /* hiredis's redisAsyncConnect resolves names with a blocking
   * getaddrinfo(): resolve once now, connect by address later. */
  rdsa_resolve(r->host, r->addr);
  /* a redis-cluster:// seed list: each seed resolved now too */
  for (const char *p = u.seeds; *p && r->nseeds < ECS_RDS_MAX_SEEDS;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char one[300];
    ecs__rds_url_t su;
    snprintf(one, sizeof one, "%.*s", (int)(len < 299 ? len : 299), p);
    p = comma ? comma + 1 : p + len;
    if (ecs__rds_url_parse(one, &su) != ECS_OK) /* checked by the parse: cannot fail */
      continue;
    rdsa_resolve(su.host, r->seeds[r->nseeds]);
    r->seed_port[r->nseeds++] = su.port;
  }
  memset(&u, 0, sizeof u);
  return ECS_OK;
}

int ecs__rdsa_up(const ecs__rdsa_t *r) {
  return r->state == ECS_RDSA_UP;
}

const char *ecs__rdsa_errmsg(const ecs__rdsa_t *r) {
  return r->err;
}

int ecs__rdsa_owns(const ecs__rdsa_t *r, const void *p) {
  return r != NULL && p == (const void *)r;
}

/* The link is lost: from now on every callback failed by the drop gets
 * rc.  Runs once per connect (state is DOWN afterwards). */
/* A redis-cluster:// seed list: the next connect goes to the next seed
 * (the one that just failed skipped); at once, until every seed has
 * failed in a row, after which the caller's reconnect interval applies. */
static void rdsa_next_seed(ecs__rdsa_t *r) {
  int i = r->seed_next % r->nseeds;
  if (r->nseeds > 1 && r->seed_port[i] == r->port && strcmp(r->seeds[i], r->addr) == 0)
    i = (i + 1) % r->nseeds;
  memcpy(r->addr, r->seeds[i], sizeof r->addr);
  snprintf(r->host, sizeof r->host, "%s", r->seeds[i]);
  r->port = r->seed_port[i];
  r->seed_next = (i + 1) % r->nseeds;
  if (++r->seed_tries < r->nseeds)
    r->redirected = 1;
  else
    r->seed_tries = 0;
}

static void rdsa_lost(ecs__rdsa_t *r, int rc) {
  if (r->state == ECS_RDSA_DOWN)
    return;
  /* a node that never answered (the first connect, or a reconnect after
   * the node in use went away): the next seed */
  if (r->state == ECS_RDSA_CONNECTING && r->nseeds > 0 && !r->redirected &&
      (rc == ECS_ECONN || rc == ECS_ETIMEDOUT))
    rdsa_next_seed(r);
  r->state = ECS_RDSA_DOWN;
  r->fail_rc = rc;
  if (r->on_down != NULL)
    r->on_down(r->cb_ctx, rc);
}

/* ---- the epoll adapter (hiredis's ev hooks) ---------------------------- */

static void rdsa_arm(ecs__rdsa_t *r, uint32_t events) {
  if (r->fd < 0 || events == r->events)
    return;
  struct epoll_event e = {.events = events, .data.ptr = r};
  int op = r->events == 0 ? EPOLL_CTL_ADD : events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
  if (epoll_ctl(r->epfd, op, r->fd, &e) == 0 || (op == EPOLL_CTL_DEL))
    r->events = events;
}

static void ev_add_read(void *p) {
  ecs__rdsa_t *r = p;
  /* hiredis calls this after each read, before it parses what it read:
   * the moment to refuse a reply over the bounds (rds.h) by its header */
  if (r->ac != NULL)
    ecs__rds_reader_guard(r->ac->c.reader);
  rdsa_arm(r, r->events | EPOLLIN);
}
static void ev_del_read(void *p) {
  ecs__rdsa_t *r = p;
  rdsa_arm(r, r->events & ~(uint32_t)EPOLLIN);
}
/* While connecting, hiredis learns that the connect finished from the
 * socket turning writable: watch it.  Once connected, queued commands
 * wait for ecs__rdsa_kick, so that a batch's commands leave in one write
 * from the thread that queued them. */
static void ev_add_write(void *p) {
  ecs__rdsa_t *r = p;
  if (r->ac != NULL && (r->ac->c.flags & REDIS_CONNECTED)) {
    r->want_write = 1;
    return;
  }
  rdsa_arm(r, r->events | EPOLLOUT);
}
static void ev_del_write(void *p) {
  ecs__rdsa_t *r = p;
  r->want_write = 0;
  rdsa_arm(r, r->events & ~(uint32_t)EPOLLOUT);
}

void ecs__rdsa_kick(ecs__rdsa_t *r) {
  if (r->ac == NULL || !r->want_write)
    return;
  r->want_write = 0;
  redisAsyncHandleWrite(r->ac); /* done: del_write; the rest would block: add_write */
  if (r->ac != NULL && r->want_write)
    rdsa_arm(r, r->events | EPOLLOUT);
}

/* hiredis is freeing the context (after failing the pending callbacks):
 * the socket leaves epoll before hiredis closes it. */
static void ev_cleanup(void *p) {
  ecs__rdsa_t *r = p;
  rdsa_arm(r, 0);
  r->fd = -1;
  r->events = 0;
  r->want_write = 0;
  r->ac = NULL;
  rdsa_lost(r, ECS_ECONN);
}

void ecs__rdsa_event(ecs__rdsa_t *r, uint32_t events) {
  if (r->ac == NULL)
    return; /* a stale event of a link dropped earlier in this batch */
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
    redisAsyncHandleRead(r->ac);
  if (r->ac != NULL && (events & (EPOLLOUT | EPOLLERR)))
    redisAsyncHandleWrite(r->ac);
}

/* ---- commands ---------------------------------------------------------- */

static void rdsa_unlink_head(ecs__rdsa_t *r, ecs__rdsa_cmd_t *c) {
  /* Replies come in order, so c is the head; a mismatch would mean a
   * reply matched to the wrong command: drop the link. */
  if (r->head != c) {
    ecs__rdsa_cmd_t **pp = &r->head, *prev = NULL;
    while (*pp != NULL && *pp != c) {
      prev = *pp;
      pp = &(*pp)->next;
    }
    if (*pp == c) {
      *pp = c->next;
      if (r->tail == c)
        r->tail = prev;
    }
  } else {
    r->head = c->next;
    if (r->tail == c)
      r->tail = NULL;
  }
  r->npending--;
}

/* A MOVED reply: the link's address becomes the node it names (an
 * address, as cluster nodes announce; reconnects never wait on DNS). */
static int rdsa_moved(ecs__rdsa_t *r, const redisReply *rep) {
  char h[64];
  int port = 0;
  memcpy(h, r->addr, sizeof h);
  if (ecs__rds_redirect(rep->str, rep->len, h, sizeof h, &port) != 1)
    return 0;
  char why[160];
  snprintf(why, sizeof why, "MOVED to %s:%d: reconnecting there", h, port);
  rdsa_seterr(r, "cluster", why);
  memcpy(r->addr, h, sizeof r->addr);
  snprintf(r->host, sizeof r->host, "%s", h);
  r->port = port;
  r->redirected = 1;
  r->cluster = 1;
  return 1;
}

void ecs__rdsa_set_route(ecs__rdsa_t *r, const char *key) {
  snprintf(r->route, sizeof r->route, "%s", key ? key : "");
}

/* Every reply (or failure) of a command: map it and call the caller. */
static void rdsa_trampoline(redisAsyncContext *ac, void *reply, void *priv) {
  ecs__rdsa_cmd_t *c = priv;
  ecs__rdsa_t *r = c->r;
  redisReply *rep = reply;
  int rc;
  rdsa_unlink_head(r, c);
  if (rep == NULL) {
    if (r->state != ECS_RDSA_DOWN) { /* hiredis dropped the link */
      const char *es = ecs__rds_reader_errstr(ac->err, ac->errstr);
      int proto = ac->err == REDIS_ERR_PROTOCOL || ac->err == REDIS_ERR_OTHER || es != ac->errstr;
      rdsa_seterr(r, proto ? "protocol error" : "link lost", es[0] ? es : "closed");
      rdsa_lost(r, proto ? ECS_EREDIS : ECS_ECONN);
    }
    rc = r->fail_rc;
  } else if (rep->type == REDIS_REPLY_ERROR) {
    rdsa_seterr(r, "error reply", rep->str);
    rc = ECS_EREDIS;
  } else {
    rc = ECS_OK;
  }
  /* Redis Cluster: the slot lives elsewhere; the next connect goes there */
  int moved = rep != NULL && rep->type == REDIS_REPLY_ERROR && !r->master[0] && rdsa_moved(r, rep);
  if (c->fn != NULL)
    c->fn(c->ctx, rc, rep);
  free(c);
  if (moved && r->state != ECS_RDSA_DOWN) {
    rdsa_lost(r, ECS_ECONN);
    if (r->ac != NULL)
      redisAsyncFree(r->ac);
    return;
  }
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR && r->master[0] && rep->len >= 8 &&
      memcmp(rep->str, "READONLY", 8) == 0 && r->state != ECS_RDSA_DOWN) {
    /* a master demoted under us: drop the link; the next connect asks
     * the sentinels again (hiredis frees the context when this returns) */
    rdsa_seterr(r, "demoted master", "READONLY reply: asking the sentinels again");
    rdsa_lost(r, ECS_ECONN);
    if (r->ac != NULL)
      redisAsyncFree(r->ac);
  }
}

/* Sends a command in any state but DOWN (the handshake sends while
 * connecting). */
static int rdsa_send(ecs__rdsa_t *r, ecs__rdsa_fn fn, void *ctx, int argc, const char **argv,
                     const size_t *lens) {
  if (r->ac == NULL || r->state == ECS_RDSA_DOWN)
    return ECS_ENOTCONN;
  size_t tmp[ECS_RDS_MAX_ARGS];
  if ((lens = ecs__rds_arglens(argc, argv, lens, tmp)) == NULL)
    return ECS_EINVAL;
  ecs__rdsa_cmd_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return ECS_ENOMEM;
  c->r = r;
  c->fn = fn;
  c->ctx = ctx;
  c->t_ms = ecs_now_ms();
  if (redisAsyncCommandArgv(r->ac, rdsa_trampoline, c, argc, argv, lens) != REDIS_OK) {
    free(c);
    return ECS_ENOMEM; /* out of memory, or the context is being freed */
  }
  if (r->tail != NULL)
    r->tail->next = c;
  else
    r->head = c;
  r->tail = c;
  r->npending++;
  return ECS_OK;
}

int ecs__rdsa_command(ecs__rdsa_t *r, ecs__rdsa_fn fn, void *ctx, int argc, const char **argv,
                      const size_t *lens) {
  return rdsa_send(r, fn, ctx, argc, argv, lens);
}

/* ---- connect and handshake --------------------------------------------- */

static void rdsa_on_connect(const redisAsyncContext *ac, int status) {
  ecs__rdsa_t *r = ac->data;
  if (status != REDIS_OK) { /* hiredis frees the context next (ev_cleanup) */
    rdsa_seterr(r, "connect", ac->errstr[0] ? ac->errstr : "failed");
    rdsa_lost(r, ECS_ECONN);
  }
}

static void rdsa_on_disconnect(const redisAsyncContext *ac, int status) {
  ecs__rdsa_t *r = ac->data;
  (void)status;
  rdsa_lost(r, ECS_ECONN);
}

/* A failed handshake step: the link is dropped with rc. */
static void rdsa_hello_fail(ecs__rdsa_t *r, int rc) {
  rdsa_lost(r, rc);
  if (r->ac != NULL)
    redisAsyncFree(r->ac); /* inside a callback: hiredis frees it on return */
}

/* AUTH's reply: a refusal is ECS_EAUTH, the password never in a message. */
static void rdsa_auth_done(void *ctx, int rc, redisReply *reply) {
  ecs__rdsa_t *r = ctx;
  if (r->state != ECS_RDSA_CONNECTING || rc == ECS_OK)
    return;
  if (rc == ECS_EREDIS && reply != NULL) {
    char why[400];
    snprintf(why, sizeof why, "%s%s: %.120s", r->user[0] ? "as user " : "", r->user, reply->str);
    rdsa_seterr(r, "authentication failed", why);
    rc = ECS_EAUTH;
  }
  rdsa_hello_fail(r, rc);
}

/* A middle step's reply (SELECT before ROLE). */
static void rdsa_step_done(void *ctx, int rc, redisReply *reply) {
  ecs__rdsa_t *r = ctx;
  (void)reply;
  if (r->state == ECS_RDSA_CONNECTING && rc != ECS_OK)
    rdsa_hello_fail(r, rc);
}

/* The handshake's last reply: the link is up, or dropped. */
static void rdsa_hello_done(void *ctx, int rc, redisReply *reply) {
  ecs__rdsa_t *r = ctx;
  if (r->state != ECS_RDSA_CONNECTING)
    return; /* dropped meanwhile: on_down has been called */
  if (rc == ECS_OK && r->master[0] && !ecs__rds_role_is_master(reply)) {
    char why[200];
    snprintf(why, sizeof why, "named by the sentinels as master '%.100s' but is not a master (yet)",
             r->master);
    rdsa_seterr(r, "handshake", why);
    rc = ECS_ECONN;
  }
  if (rc != ECS_OK) {
    rdsa_hello_fail(r, rc);
    return;
  }
  r->state = ECS_RDSA_UP;
  r->seed_tries = 0;
  r->err[0] = '\0';
  if (r->on_up != NULL)
    r->on_up(r->cb_ctx);
}

void ecs__rdsa_set_auth(ecs__rdsa_t *r, const char *user, const char *pass) {
  snprintf(r->user, sizeof r->user, "%s", user ? user : "");
  snprintf(r->pass, sizeof r->pass, "%s", pass ? pass : "");
}

int ecs__rdsa_connect(ecs__rdsa_t *r) {
  if (r->state != ECS_RDSA_DOWN || r->ac != NULL)
    return ECS_OK;
  r->redirected = 0;
  if (r->master[0]) { /* bounded and documented in rds.h */
    ecs__rds_url_t su;
    memset(&su, 0, sizeof su);
    memcpy(su.sentinels, r->sentinels, sizeof su.sentinels);
    memcpy(su.master, r->master, sizeof su.master);
    memcpy(su.suser, r->suser, sizeof su.suser);
    memcpy(su.spass, r->spass, sizeof su.spass);
    char why[sizeof r->err];
    int rc = ecs__rds_sentinel_resolve(&su, r->timeout_ms < 200 ? r->timeout_ms : 200, r->addr,
                                       sizeof r->addr, &r->port, why, sizeof why);
    memset(&su, 0, sizeof su);
    if (rc != ECS_OK) {
      snprintf(r->err, sizeof r->err, "%s", why);
      return rc;
    }
    snprintf(r->host, sizeof r->host, "%s", r->addr);
  }
  redisAsyncContext *ac = NULL;
  /* a connect refused at once: with a seed list, the next seeds now */
  for (int tries = 0; ac == NULL; tries++) {
    ac = redisAsyncConnect(r->addr, r->port);
    if (ac == NULL) {
      rdsa_seterr(r, "connect", "out of memory");
      return ECS_ENOMEM;
    }
    if (ac->err != 0) {
      rdsa_seterr(r, "connect", ac->errstr);
      redisAsyncFree(ac);
      ac = NULL;
      if (r->nseeds == 0 || tries + 1 >= r->nseeds)
        return ECS_ECONN;
      r->seed_tries = 0;
      rdsa_next_seed(r);
      r->redirected = 0;
    }
  }
  ecs__rds_bound_reader(ac->c.reader, 1);
  ac->data = r;
  ac->ev.data = r;
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
  redisAsyncSetConnectCallback(ac, rdsa_on_connect);
  redisAsyncSetDisconnectCallback(ac, rdsa_on_disconnect);
  r->ac = ac;
  r->fd = ac->c.fd;
  r->events = 0;
  r->want_write = 0;
  r->state = ECS_RDSA_CONNECTING;
  r->fail_rc = ECS_ECONN;
  r->connect_t0_ms = ecs_now_ms();
  /* The handshake: what every new link says before any command of its
   * owner: AUTH, SELECT, and ROLE through Sentinel.  Sending it arms the
   * write event, which is also how hiredis learns that the connect
   * completed. */
  ecs__rds_url_t au;
  memset(&au, 0, sizeof au);
  memcpy(au.user, r->user, sizeof au.user);
  memcpy(au.pass, r->pass, sizeof au.pass);
  const char *aargv[3];
  size_t alens[3];
  int aargc = ecs__rds_auth_argv(&au, aargv, alens);
  int rc = aargc > 0 ? rdsa_send(r, rdsa_auth_done, r, aargc, aargv, alens) : ECS_OK;
  memset(&au, 0, sizeof au);
  char db[16];
  snprintf(db, sizeof db, "%d", r->db);
  const char *argv[] = {"SELECT", db};
  const char *role[] = {"ROLE"};
  const char *probe[] = {"EXISTS", r->route};
  int cluster = !r->master[0] && r->route[0] && r->cluster;
  if (rc == ECS_OK)
    rc = rdsa_send(r, r->master[0] || cluster ? rdsa_step_done : rdsa_hello_done, r, 2, argv, NULL);
  if (rc == ECS_OK && r->master[0])
    rc = rdsa_send(r, rdsa_hello_done, r, 1, role, NULL);
  if (rc == ECS_OK && cluster) /* a MOVED reply drops the link in the trampoline */
    rc = rdsa_send(r, rdsa_hello_done, r, 2, probe, NULL);
  if (rc != ECS_OK) {
    r->state = ECS_RDSA_DOWN;
    redisAsyncFree(ac); /* no pending command: cleanup only */
    r->ac = NULL;
    r->fd = -1;
    rdsa_seterr(r, "connect", "out of memory");
    return rc;
  }
  return ECS_OK;
}

/* ---- deadlines and teardown -------------------------------------------- */

void ecs__rdsa_close(ecs__rdsa_t *r, int rc) {
  if (r->state != ECS_RDSA_DOWN)
    rdsa_lost(r, rc);
  else
    r->fail_rc = rc;
  if (r->ac != NULL)
    redisAsyncFree(r->ac); /* fails the pending callbacks with r->fail_rc */
  r->ac = NULL;
  r->fd = -1;
  r->events = 0;
  r->want_write = 0;
}

int ecs__rdsa_poll(ecs__rdsa_t *r, uint64_t now_ms) {
  uint64_t t0;
  if (r->state == ECS_RDSA_DOWN || r->ac == NULL)
    return -1;
  if (r->state == ECS_RDSA_CONNECTING)
    t0 = r->connect_t0_ms;
  else if (r->head != NULL)
    t0 = r->head->t_ms;
  else
    return -1;
  uint64_t due = t0 + (uint64_t)r->timeout_ms;
  if (now_ms < due)
    return (int)(due - now_ms);
  char why[64];
  snprintf(why, sizeof why, "no reply within %d ms", r->timeout_ms);
  rdsa_seterr(r, r->state == ECS_RDSA_CONNECTING ? "connect" : "reply", why);
  ecs__rdsa_close(r, ECS_ETIMEDOUT);
  return -1;
}
