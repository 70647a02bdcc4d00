/*
 * The server's per-connection state machine: accepting, reading a request,
 * writing its reply, closing.  Sockets are non-blocking; the loop (server.c)
 * calls back in on readiness, so a connection never waits.  The states:
 *
 *   HDR  -> read exactly 32 header bytes; decode and bound every length
 *   META -> read exactly meta_len bytes of item records; parse them
 *   DATA -> (PUT only) readv the payload straight into the reserved pool
 *           blocks, or into a scratch buffer for items that were refused
 *   WRITE-> sendmsg the reply header, records and (GET) pool blocks
 *
 * Exactly the bytes of one request are read before its reply is written,
 * so a payload byte is never read into an intermediate buffer.
 *
 * Pipelining: a request whose reply waits for Redis (a PUT, COMMIT or
 * REMOVE whose records are in flight) does not hold the connection.  It is
 * parked in a small reply queue (rq[], at most RQ_MAX) and the connection
 * reads and runs its next requests meanwhile, so a client that sends
 * several requests overlaps their Redis round trips with its own sending
 * and the server's receiving.  Replies leave strictly in request order:
 * parked replies as they are answered, oldest first; a reply built while
 * older ones are still parked (a GET behind a PUT) waits in WRITE, and the
 * connection reads nothing more until it is out.  A full queue also stops
 * the reading.  So a connection holds at most RQ_MAX parked replies and
 * one built reply; and it starts at most CONN_BUDGET requests per
 * readiness event, so that it cannot hold its loop.  References
 * taken for a GET are held until the last byte of the reply left, so
 * eviction can never free a block under a reader.  A connection that dies
 * mid-PUT aborts its reservations: no block leaks.
 */
#include "store/server/server_internal.h"

#include <errno.h>
#include <limits.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/log.h"
#include "store/core/net.h"

/* ------------------------------------------------------------------ */
/* connections                                                         */

static void conn_release_refs(ecs_server_t *s, conn_t *c) {
  for (size_t i = 0; i < c->nheld; i++)
    ecs_objstore_release(s->os, c->held[i]);
  c->nheld = 0;
}

static void conn_abort_slots(ecs_server_t *s, conn_t *c) {
  for (size_t i = 0; i < c->nslots; i++) {
    if (c->slots[i].obj) {
      ecs_objstore_abort(s->os, c->slots[i].obj);
      c->slots[i].obj = NULL;
    }
  }
  c->nslots = 0;
}

void ecs__conn_close(ecs_server_t *s, conn_t *c) {
  if (c->doomed)
    s->ndoomed--; /* counted out of npreauth when it was doomed */
  else if (!c->authed)
    s->npreauth--;
  for (unsigned i = 0; i < RQ_MAX; i++) { /* its records are answered to nobody */
    ecs__pub_abandon(c->rq[i].w);
    ecs_wbuf_free(&c->rq[i].body);
  }
  conn_release_refs(s, c);
  conn_abort_slots(s, c);
  ecs__pins_expire(s, c, UINT64_MAX); /* a client that goes away leaves nothing pinned */
  ecs_rdma_ep_destroy(c->ep);
  if (c->send_fd >= 0)
    close(c->send_fd);
  epoll_ctl(c->loop->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  for (size_t i = 0; i < s->nconns; i++) {
    if (s->conns[i] == c) {
      s->conns[i] = s->conns[--s->nconns];
      break;
    }
  }
  ECS_LOG_D("conn %llu closed", (unsigned long long)c->id);
  free(c->meta);
  free(c->slots);
  ecs_sum_free(c->sum);
  free(c->wiov);
  free(c->held);
  free(c->pins);
  ecs_wbuf_free(&c->out);
  free(c);
}

/* Arms the socket for ev; a no-op (no syscall) when it already is. */
static int conn_set_events(ecs_server_t *s, conn_t *c, uint32_t ev) {
  (void)s; /* c's own loop's epoll (any thread may arm it, under the lock) */
  if (c->events == ev)
    return 0;
  struct epoll_event e = {.events = ev, .data.ptr = c};
  if (epoll_ctl(c->loop->epfd, EPOLL_CTL_MOD, c->fd, &e) != 0)
    return -1;
  c->events = ev;
  return 0;
}

parked_t *ecs__conn_park(ecs_server_t *s, conn_t *c) {
  (void)s;
  parked_t *pk = &c->rq[(c->rq_head + c->rq_n++) % RQ_MAX];
  pk->ready = 0;
  pk->opcode = c->hdr.opcode;
  pk->req_id = c->hdr.req_id;
  pk->t0_ns = c->req_t0_ns;
  c->req_t0_ns = 0;
  c->st = C_HDR; /* on to the next request */
  return pk;
}

void ecs__conn_unpark(ecs_server_t *s, conn_t *c) {
  /* Called from a Redis reply, perhaps on another loop and in the middle
   * of an event batch: only arm the socket; the owner's next pass writes
   * (closing c here could free a conn_t still named further down the
   * batch).  A failure to arm is seen by the owner's next pass. */
  (void)conn_set_events(s, c, c->events | EPOLLOUT);
}

void ecs__conn_authed(ecs_server_t *s, conn_t *c) {
  if (!c->authed && !c->doomed) /* a doomed one was counted out already */
    s->npreauth--;
  c->authed = 1;
}

int ecs__conn_hold(conn_t *c, ecs_obj_t *obj) {
  if (c->nheld == c->held_cap) {
    size_t ncap = c->held_cap ? c->held_cap * 2 : 16;
    ecs_obj_t **n = realloc(c->held, ncap * sizeof *n);
    if (!n)
      return ECS_ENOMEM;
    c->held = n;
    c->held_cap = ncap;
  }
  c->held[c->nheld++] = obj;
  return ECS_OK;
}

int ecs__conn_wiov_add(conn_t *c, void *p, size_t n) {
  if (c->wcnt == c->wcap) {
    int ncap = c->wcap ? c->wcap * 2 : 16;
    struct iovec *v = realloc(c->wiov, (size_t)ncap * sizeof *v);
    if (!v)
      return ECS_ENOMEM;
    c->wiov = v;
    c->wcap = ncap;
  }
  c->wiov[c->wcnt].iov_base = p;
  c->wiov[c->wcnt].iov_len = n;
  c->wcnt++;
  return ECS_OK;
}

/* Starts a reply: header with status, the records in c->out, and the
 * payload iovecs the handler already appended after slot 2. */
void ecs__reply_begin(conn_t *c) {
  ecs_wbuf_reset(&c->out);
  c->wcnt = 0;
  c->wpos = 0;
  /* slots 0 and 1 are the header and records; filled by reply_finish */
  ecs__conn_wiov_add(c, c->out_hdr, ECS_PROTO_HDR_SIZE);
  ecs__conn_wiov_add(c, NULL, 0);
}

void ecs__reply_finish(ecs_server_t *s, conn_t *c, int status, uint32_t count, uint64_t data_len) {
  if (c->out.err) { /* out of memory building records: fail the whole request */
    conn_release_refs(s, c);
    ecs_wbuf_reset(&c->out);
    status = ECS_ENOMEM;
    count = 0;
    data_len = 0;
    c->wcnt = 2;
  }
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = c->hdr.opcode,
                 .flags = ECS_FLAG_REPLY,
                 .req_id = c->hdr.req_id,
                 .status = status,
                 .count = count,
                 .meta_len = (uint32_t)c->out.len,
                 .data_len = data_len};
  ecs_proto_hdr_encode(&h, c->out_hdr);
  c->wiov[1].iov_base = c->out.p;
  c->wiov[1].iov_len = c->out.len;
  c->st = C_WRITE;
  if (c->req_t0_ns && c->hdr.opcode < sizeof s->latency / sizeof s->latency[0])
    ecs_hist_observe(&s->latency[c->hdr.opcode], ecs__now_ns() - c->req_t0_ns);
  c->req_t0_ns = 0;
}

/* A reply carrying only a status, for whole-request failures. */
void ecs__reply_error(ecs_server_t *s, conn_t *c, int status, int close_after) {
  conn_release_refs(s, c);
  ecs__reply_begin(c);
  ecs__reply_finish(s, c, status, 0, 0);
  c->close_after_write |= close_after;
}

/* ------------------------------------------------------------------ */
/* reading                                                             */

/* Reads into [p, p+n).  Returns bytes read, 0 on EAGAIN, -1 on EOF/error.
 * The read(2) runs without the server lock: p is the connection's own
 * header or records buffer, and no other thread touches those (a
 * connection in HDR or META is only ever doomed from another loop). */
static ssize_t read_some(ecs_server_t *s, int fd, void *p, size_t n) {
  for (;;) {
    ecs__unlock(s);
    ssize_t r = read(fd, p, n);
    int e = errno;
    ecs__lock(s);
    errno = e;
    if (r > 0)
      return r;
    if (r == 0)
      return -1;
    if (errno == EINTR)
      continue;
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  }
}

/* Hashes the r bytes a readv of iov[0..cnt) just landed, while they are
 * still in cache: a stored item's piece goes into its checksum (at[q] is
 * where in item it[q] piece q starts).  An item read in one piece is
 * hashed at once; one that spans reads runs through c->sum, which serves
 * one item at a time since items arrive in order.  Without memory for the
 * state the item stays unsummed and put_end hashes it whole. */
static void sum_landed(conn_t *c, const struct iovec *iov, const size_t *it, const uint64_t *at, int cnt,
                       size_t r) {
  for (int q = 0; q < cnt && r > 0; q++) {
    size_t got = iov[q].iov_len < r ? iov[q].iov_len : r;
    r -= got;
    put_slot_t *sl = &c->slots[it[q]];
    if (!sl->obj)
      continue; /* discarded bytes */
    int first = at[q] == 0, last = at[q] + got == sl->item.nbytes;
    if (first && last) {
      sl->sum = ecs_checksum(iov[q].iov_base, got);
      sl->summed = 1;
      continue;
    }
    if (first && !c->sum)
      c->sum = ecs_sum_new(); /* kept until the connection closes */
    if (!c->sum)
      continue; /* NULL since this item's first piece: put_end hashes it */
    if (first)
      ecs_sum_reset(c->sum);
    ecs_sum_update(c->sum, iov[q].iov_base, got);
    if (last) {
      sl->sum = ecs_sum_digest(c->sum);
      sl->summed = 1;
    }
  }
}

/* DATA: builds iovecs from the current item onward and readv's them: at
 * most ECS_SUM_SLICE bytes bound for stored items per call, so that
 * sum_landed reads them back from cache rather than from memory. */
static ssize_t read_data(ecs_server_t *s, conn_t *c) {
  struct iovec iov[IOV_BATCH];
  size_t it[IOV_BATCH];   /* the item of each iovec */
  uint64_t at[IOV_BATCH]; /* and where in it the iovec starts */
  int cnt = 0;
  size_t item = c->data_item;
  uint64_t off = c->data_off;
  size_t budget = ECS_SUM_SLICE; /* stored bytes left for this readv */
  while (cnt < IOV_BATCH && item < c->nslots && budget > 0) {
    put_slot_t *sl = &c->slots[item];
    uint64_t left = sl->item.nbytes - off;
    if (left == 0) {
      item++;
      off = 0;
      continue;
    }
    if (sl->obj) {
      iov[cnt].iov_base = (uint8_t *)ecs_objstore_data(s->os, sl->obj) + off;
      iov[cnt].iov_len = left > budget ? budget : (size_t)left;
      budget -= iov[cnt].iov_len;
    } else { /* refused item: its bytes go to the scratch buffer */
      iov[cnt].iov_base = c->loop->scratch;
      iov[cnt].iov_len = left > SCRATCH_SIZE ? SCRATCH_SIZE : (size_t)left;
    }
    it[cnt] = item;
    at[cnt] = off;
    off += iov[cnt].iov_len;
    cnt++;
  }
  if (cnt == 0)
    return 0;
  /* The payload moves, and is hashed, without the server lock: the
   * reserved objects are PENDING with our reference, which only this
   * connection can drop, and the scratch buffer is this loop's. */
  ssize_t r;
  ecs__unlock(s);
  do {
    r = readv(c->fd, iov, cnt);
  } while (r < 0 && errno == EINTR);
  int e = errno;
  if (r > 0)
    sum_landed(c, iov, it, at, cnt, (size_t)r);
  ecs__lock(s);
  errno = e;
  if (r == 0)
    return -1;
  if (r < 0)
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  /* advance the (item, offset) cursor by r bytes */
  uint64_t adv = (uint64_t)r;
  while (adv > 0) {
    uint64_t left = c->slots[c->data_item].item.nbytes - c->data_off;
    if (adv >= left) {
      adv -= left;
      c->data_item++;
      c->data_off = 0;
    } else {
      c->data_off += adv;
      adv = 0;
    }
  }
  return r;
}

static int data_done(conn_t *c) {
  while (c->data_item < c->nslots && c->slots[c->data_item].item.nbytes == c->data_off) {
    c->data_item++;
    c->data_off = 0;
  }
  return c->data_item >= c->nslots;
}

/* Runs the read side as far as the socket allows, starting at most
 * *budget more requests (counted down).  Returns -1 to close, 0 when it
 * stopped reading (the socket is empty, the queue full or the budget
 * spent), 1 when a reply was built (WRITE). */
static int conn_on_readable(ecs_server_t *s, conn_t *c, unsigned *budget) {
  for (;;) {
    ssize_t r;
    if (c->st == C_HDR && c->rq_n >= RQ_MAX)
      return 0; /* the queue is full: read on once the oldest is answered */
    if (c->st == C_HDR && c->hdr_got == 0) {
      if (*budget == 0)
        return 0; /* this event's share is spent; epoll reports c again */
      --*budget;
    }
    if (c->st == C_HDR) {
      r = read_some(s, c->fd, c->hdrbuf + c->hdr_got, ECS_PROTO_HDR_SIZE - c->hdr_got);
      if (r <= 0)
        return (int)r;
      c->last_ms = ecs_now_ms();
      c->hdr_got += (size_t)r;
      if (c->hdr_got < ECS_PROTO_HDR_SIZE)
        continue;
      c->hdr_got = 0;
      /* Before HELLO a peer may send a HELLO and nothing else, so what it
       * can make the server buffer is bounded by PREAUTH_MAX_META, not by
       * --max-request: refuse anything else before allocating for it. */
      int rc = ecs_proto_hdr_decode(c->hdrbuf, s->o.max_request, &c->hdr);
      uint8_t first = c->local ? ECS_OP_UPGRADE : ECS_OP_HELLO; /* the socket's only pre-auth opcode */
      if (rc == ECS_OK && !c->authed &&
          (c->hdr.opcode != first || c->hdr.meta_len > PREAUTH_MAX_META || c->hdr.data_len)) {
        ECS_LOG_D("conn %llu: request before %s refused", (unsigned long long)c->id,
                  c->local ? "UPGRADE" : "HELLO");
        ecs__reply_error(s, c, c->hdr.opcode != first ? ECS_EAUTH : ECS_EPROTO, 1);
        return 1;
      }
      if (rc != ECS_OK || (c->hdr.flags & ECS_FLAG_REPLY)) {
        ECS_LOG_W("conn %llu: bad header (%s); closing", (unsigned long long)c->id,
                  ecs_strerror(rc ? rc : ECS_EPROTO));
        /* echo what we can; the framing is lost, so close after the reply */
        ecs__reply_error(s, c, rc ? rc : ECS_EPROTO, 1);
        return 1;
      }
      if (c->hdr.meta_len > c->meta_cap) {
        uint8_t *m = realloc(c->meta, c->hdr.meta_len);
        if (!m) {
          ecs__reply_error(s, c, ECS_ENOMEM, 1);
          return 1;
        }
        c->meta = m;
        c->meta_cap = c->hdr.meta_len;
      }
      c->meta_got = 0;
      c->st = C_META;
    }
    if (c->st == C_META) {
      if (c->meta_got < c->hdr.meta_len) {
        r = read_some(s, c->fd, c->meta + c->meta_got, c->hdr.meta_len - c->meta_got);
        if (r <= 0)
          return (int)r;
        c->last_ms = ecs_now_ms();
        c->meta_got += (size_t)r;
        if (c->meta_got < c->hdr.meta_len)
          continue;
      }
      ecs__server_dispatch(s, c);
      if (c->st == C_WRITE)
        return 1;
      if (c->st == C_HDR)
        continue; /* parked: read the next request */
    }
    if (c->st == C_DATA) {
      if (!data_done(c)) {
        r = read_data(s, c);
        if (r <= 0)
          return (int)r;
        c->last_ms = ecs_now_ms();
        if (!data_done(c))
          continue;
      }
      ecs__server_put_end(s, c);
      if (c->st == C_WRITE)
        return 1;
      continue; /* parked: read the next request */
    }
    if (c->st == C_WRITE)
      return 1;
  }
}

/* ------------------------------------------------------------------ */
/* writing                                                             */

/* Sends as much of the reply as the socket takes.  1: done, 0: blocked,
 * -1: error. */
static int conn_flush_unlocked(conn_t *c) {
  while (c->wpos < c->wcnt) {
    struct iovec *iov = c->wiov + c->wpos;
    int cnt = c->wcnt - c->wpos;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)(cnt > IOV_MAX ? IOV_MAX : cnt);
    /* ATTACH: the fd rides with the reply's first bytes */
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    if (c->send_fd >= 0) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = sizeof ctl.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &c->send_fd, sizeof(int));
    }
    ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    if (c->send_fd >= 0) { /* delivered with these bytes; our copy goes */
      close(c->send_fd);
      c->send_fd = -1;
    }
    int before = cnt;
    ecs_iov_advance(&iov, &cnt, (size_t)n);
    c->wpos += before - cnt;
  }
  return 1;
}

/* The whole write, until done or EAGAIN, without the server lock: the
 * blocks named by wiov are held by references (c->held) that only this
 * connection releases, and no other thread touches a connection in
 * C_WRITE.  One acquisition per writable event, not per partial send. */
static int conn_flush(ecs_server_t *s, conn_t *c) {
  ecs__unlock(s);
  int r = conn_flush_unlocked(c);
  ecs__lock(s);
  return r;
}

/* Sends, in request order, the parked replies that are answered, and
 * once none is parked any more the built reply (WRITE).  1: all that may
 * leave now has left; 0: the socket is full; -1: error.  The bytes of an
 * answered parked reply are not touched again by anyone until it has
 * left, so they are sent without the lock, like the reply's. */
static int conn_send_ready(ecs_server_t *s, conn_t *c) {
  while (c->rq_n > 0 && c->rq[c->rq_head].ready) {
    struct iovec iov[2 * RQ_MAX], *v = iov;
    int cnt = 0;
    unsigned k = 0;
    for (; k < c->rq_n; k++) {
      parked_t *pk = &c->rq[(c->rq_head + k) % RQ_MAX];
      if (!pk->ready)
        break;
      iov[cnt++] = (struct iovec){pk->hdr, ECS_PROTO_HDR_SIZE};
      iov[cnt++] = (struct iovec){pk->body.p, pk->body.len};
    }
    ecs_iov_advance(&v, &cnt, c->rq_sent);
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = v;
    mh.msg_iovlen = (size_t)cnt;
    ecs__unlock(s);
    ssize_t n;
    do {
      n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    int e = errno;
    ecs__lock(s);
    if (n < 0)
      return (e == EAGAIN || e == EWOULDBLOCK) ? 0 : -1;
    c->last_ms = ecs_now_ms();
    size_t left = c->rq_sent + (size_t)n;
    c->rq_sent = 0;
    for (unsigned i = 0; i < k; i++) {
      parked_t *pk = &c->rq[c->rq_head];
      size_t sz = ECS_PROTO_HDR_SIZE + pk->body.len;
      if (left < sz) {
        c->rq_sent = left;
        break;
      }
      left -= sz;
      pk->ready = 0;
      c->rq_head = (c->rq_head + 1) % RQ_MAX;
      c->rq_n--;
    }
  }
  if (c->rq_n > 0 || c->st != C_WRITE)
    return 1; /* nothing more may leave before the oldest parked one */
  return conn_flush(s, c);
}

/* Requests one connection may start per readiness event.  A peer whose
 * socket always holds its next request (pipelining) would otherwise be
 * served without end in one event, and its loop's other connections (on
 * loop 0 also the Redis link and the timers) would wait until it paused.
 * Past the budget the loop serves the others first; epoll is
 * level-triggered, so the rest of c's requests are reported again. */
#define CONN_BUDGET 16

/*
 * Runs c as far as its socket, its queue and its budget allow: sends what
 * may leave, reads and runs requests while nothing blocks the reading, and
 * arms epoll for what it waits for.  Returns -1 to close the connection.
 */
static int conn_run(ecs_server_t *s, conn_t *c) {
  unsigned budget = CONN_BUDGET;
  for (;;) {
    int w = conn_send_ready(s, c);
    if (w < 0)
      return -1;
    if (w == 1 && c->st == C_WRITE && c->rq_n == 0) { /* the built reply has left */
      conn_release_refs(s, c);
      if (c->close_after_write)
        return -1;
      c->st = C_HDR;
      c->last_ms = ecs_now_ms();
    }
    if (c->st == C_WRITE || (c->st == C_HDR && c->rq_n >= RQ_MAX))
      break; /* a reply waits (for older ones, or the socket): read nothing more */
    int r = conn_on_readable(s, c, &budget);
    if (r < 0)
      return -1;
    if (r == 0)
      break; /* read all there was (or the queue is full, or the budget spent) */
  }
  /* Answered replies that may leave: write as soon as the socket takes
   * them (such a reply may have been answered while we read unlocked). */
  int out = (c->rq_n > 0 && c->rq[c->rq_head].ready) || (c->rq_n == 0 && c->st == C_WRITE);
  int in = c->st != C_WRITE && !(c->st == C_HDR && c->rq_n >= RQ_MAX);
  return conn_set_events(s, c, (in ? EPOLLIN : 0) | (out ? EPOLLOUT : 0)) == 0 ? 0 : -1;
}

void ecs__conn_event(ecs_server_t *s, conn_t *c, uint32_t ev) {
  if (c->doomed) { /* evicted by loop 0 at an accept */
    ecs__conn_close(s, c);
    return;
  }
  /* an error, or a hang-up with nothing left to read: nobody to answer */
  if ((ev & EPOLLERR) || ((ev & EPOLLHUP) && !(ev & EPOLLIN))) {
    ecs__conn_close(s, c);
    return;
  }
  if (conn_run(s, c) < 0)
    ecs__conn_close(s, c);
}

static int uid_listed(unsigned uid, const unsigned *list, int n) {
  for (int i = 0; i < n; i++)
    if (list[i] == uid)
      return 1;
  return 0;
}

/* What a Unix-socket peer may do with the pool, by its uid (SO_PEERCRED):
 * root and the server's own user everything; --shm-write-uid map it
 * writable; --shm-allow-uid map it read-only (a reader sees every
 * object in the pool, whatever its namespace); anyone else nothing: its
 * data goes by copy over this socket, like over TCP.  Every peer still
 * authenticates (UPGRADE) before any request.  -1 when the credentials
 * cannot be read (the connection is refused). */
static int peer_rights(const ecs_server_t *s, int fd, unsigned *uid) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
    return -1;
  *uid = (unsigned)cr.uid;
  if (cr.uid == 0 || cr.uid == geteuid() || uid_listed(cr.uid, s->o.shm_write_uids, s->o.n_shm_write_uids))
    return SHM_MAP | SHM_WRITE;
  if (uid_listed(cr.uid, s->o.shm_allow_uids, s->o.n_shm_allow_uids))
    return SHM_MAP;
  ECS_LOG_D("shm: pid %d uid %u may not map the pool (not in --shm-allow-uid); copies only", (int)cr.pid,
            (unsigned)cr.uid);
  return 0;
}

/* Closes the connection waiting longest for its HELLO; 0 when there is
 * none.  Connection slots go to clients that authenticate: a peer that
 * opens sockets and stays silent only ever displaces other silent peers. */
static int evict_oldest_preauth(ecs_server_t *s) {
  conn_t *old = NULL;
  for (size_t i = 0; i < s->nconns; i++)
    if (!s->conns[i]->authed && !s->conns[i]->doomed && (!old || s->conns[i]->id < old->id))
      old = s->conns[i];
  if (!old)
    return 0;
  ECS_LOG_D("conn %llu: closed unauthenticated to admit a new connection", (unsigned long long)old->id);
  if (old->loop == &s->loops[0]) { /* ours (accepting runs on loop 0) */
    ecs__conn_close(s, old);
    return 1;
  }
  /* Another loop's: only its own thread may free it (it may be mid-write
   * without the lock, or named in its event batch).  It stops counting
   * now; the shutdown wakes its loop, which closes it. */
  old->doomed = 1;
  s->npreauth--;
  s->ndoomed++;
  shutdown(old->fd, SHUT_RDWR);
  return 1;
}

/* The peer's network folded into 64 bits, the key of the failed-auth
 * throttle: an IPv4 /24 (an IPv4-mapped IPv6 address too), an IPv6 /64,
 * since one host commonly holds a whole /64 and a guesser may rotate its
 * last bytes; the port is left out. */
static uint64_t peer_source(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
    return 0;
  if (ss.ss_family == AF_INET)
    return 1ull << 32 | (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 8);
  if (ss.ss_family == AF_INET6) {
    const uint8_t *a = ((struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a, mapped, sizeof mapped) == 0)
      return 1ull << 32 | ((uint64_t)a[12] << 16 | (uint64_t)a[13] << 8 | a[14]);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the /64 */
    for (int i = 0; i < 8; i++)
      h = (h ^ a[i]) * 1099511628211ull;
    return h | 1; /* never 0, the Unix socket's */
  }
  return 0;
}

/* Out of file descriptors (or kernel memory): the pending connection
 * stays queued, and the level-triggered listener would wake the loop at
 * once, again and again (before: ~190,000 "accept:" lines in 3 s).  Both
 * listeners leave epoll for ACCEPT_PAUSE_MS (ecs__conn_accept_resume puts
 * them back), and the condition is logged once per ACCEPT_LOG_MS with a
 * count of the pauses since. */
static void accept_pause(ecs_server_t *s, int e) {
  uint64_t now = ecs_now_ms();
  epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->lfd, NULL);
  if (s->ufd >= 0)
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->ufd, NULL);
  s->accept_resume_ms = now + ACCEPT_PAUSE_MS;
  if (s->accept_log_ms && now - s->accept_log_ms < ACCEPT_LOG_MS) {
    s->accept_unlogged++;
    return;
  }
  ECS_LOG_W("accept: %s; not accepting for %d ms at a time (%llu more such pauses since the last line). "
            "Raise the open-file limit (ulimit -n, systemd LimitNOFILE=) or lower --max-conns",
            strerror(e), ACCEPT_PAUSE_MS, (unsigned long long)s->accept_unlogged);
  s->accept_log_ms = now;
  s->accept_unlogged = 0;
}

void ecs__conn_accept_resume(ecs_server_t *s, uint64_t now) {
  if (!s->accept_resume_ms || now < s->accept_resume_ms)
    return;
  s->accept_resume_ms = 0;
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &e) != 0)
    ECS_LOG_E("accept: cannot watch the listener again: %s", strerror(errno));
  if (s->ufd >= 0) {
    e.data.ptr = &s->ufd;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->ufd, &e) != 0)
      ECS_LOG_E("accept: cannot watch the shm listener again: %s", strerror(errno));
  }
}

void ecs__conn_accept_all(ecs_server_t *s, int lfd, int local) {
  if (s->accept_resume_ms)
    return; /* paused: both listeners are out of epoll */
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_pause(s, errno);
      else if (errno != EAGAIN && errno != EWOULDBLOCK)
        ECS_LOG_W("accept: %s", strerror(errno));
      return;
    }
    if (s->npreauth >= (size_t)s->o.max_preauth_conns)
      evict_oldest_preauth(s);
    if (s->nconns - s->ndoomed >= (size_t)s->o.max_conns && !evict_oldest_preauth(s)) {
      ECS_LOG_W("connection limit (%d) reached; refusing", s->o.max_conns);
      close(fd);
      continue;
    }
    unsigned uid = 0;
    int rights = local ? peer_rights(s, fd, &uid) : 0;
    if (rights < 0) {
      ECS_LOG_W("shm: cannot read a peer's credentials: %s; refusing it", strerror(errno));
      close(fd);
      continue;
    }
    conn_t *c = calloc(1, sizeof *c);
    conn_t **nc = realloc(s->conns, (s->nconns + 1) * sizeof *nc);
    if (!c || !nc) {
      free(c);
      if (nc)
        s->conns = nc;
      close(fd);
      continue;
    }
    s->conns = nc;
    c->fd = fd;
    c->loop = &s->loops[s->next_loop++ % s->nloops]; /* round robin */
    c->local = local;
    c->peer_uid = uid;
    c->shm_rights = (unsigned)rights;
    c->send_fd = -1;
    c->pin_free = PIN_NONE;
    c->id = ++s->next_conn_id;
    c->st = C_HDR;
    c->last_ms = c->accept_ms = ecs_now_ms();
    c->src = local ? 0 : peer_source(fd);
    ecs_wbuf_init(&c->out);
    for (unsigned i = 0; i < RQ_MAX; i++)
      ecs_wbuf_init(&c->rq[i].body);
    if (!local) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ecs_net_tune_local(fd); /* a client on this host: no pacing (net.h) */
    }
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
    c->events = EPOLLIN;
    s->conns[s->nconns++] = c; /* listed first: its loop may see an event at once (it waits for the lock) */
    s->npreauth++;
    if (epoll_ctl(c->loop->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
      s->nconns--;
      s->npreauth--;
      ecs_wbuf_free(&c->out);
      free(c);
      close(fd);
      continue;
    }
    ECS_LOG_D("conn %llu accepted%s", (unsigned long long)c->id, local ? " (local)" : "");
  }
}
