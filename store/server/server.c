/*
 * The ecstore server's loop and life cycle: options, create (pool, index,
 * Redis, sockets), the epoll loops (--threads; server_internal.h says what
 * they share and under which lock), the timer work (Redis heartbeat and
 * re-sync, background eviction, stalled connections, expired pins), stop
 * and destroy.  See server.h for the contract, server_internal.h for how
 * the server is split into files, and docs/protocol.md for the wire format.
 */
#include "store/server/server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/log.h"
#include "store/core/net.h"
#include "store/redis/rds.h"

/* ------------------------------------------------------------------ */
/* options                                                             */

void ecs_server_opts_init(ecs_server_opts_t *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->listen_host, sizeof o->listen_host, "127.0.0.1");
  o->listen_port = 7700;
  o->pool_size = 1ull << 30;
  o->min_block = 4096;
  o->lock_pool = 1;
  snprintf(o->redis_url, sizeof o->redis_url, "127.0.0.1:6379");
  snprintf(o->ns, sizeof o->ns, "default");
  o->io_timeout_ms = 30000;
  o->redis_timeout_ms = 500;
  o->registry_ttl_ms = 10000;
  o->high_watermark = 0.95;
  o->low_watermark = 0.85;
  o->max_request = 4ull << 30;
  o->max_conns = 1024;
  o->threads = 0; /* the cores available */
  o->lease_timeout_ms = 30000;
  o->hello_timeout_ms = 5000;
  o->max_preauth_conns = 64;
  o->auth_fail_delay_ms = 1000;
  o->max_pins = 4096;
  o->soft_pin_ttl_ms = 1800000;
  o->pull_timeout_ms = 5000;
  o->pull_threads = 4;
  snprintf(o->rdma, sizeof o->rdma, "auto");
}

/* ------------------------------------------------------------------ */
/* the server lock                                                     */

/* Timed (three vDSO clock reads per acquisition): how long the lock is
 * held and waited for is what decides whether more threads help
 * (ecstore_lock_* in /metrics, docs/architecture.md "Threads"). */
void ecs__lock(ecs_server_t *s) {
  uint64_t t0 = ecs__now_ns();
  pthread_mutex_lock(&s->mu);
  s->lock_t0_ns = ecs__now_ns();
  s->lock_wait_ns += s->lock_t0_ns - t0;
  s->lock_n++;
}

void ecs__unlock(ecs_server_t *s) {
  s->lock_held_ns += ecs__now_ns() - s->lock_t0_ns;
  pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ */
/* Redis glue                                                          */

void ecs__server_rec(const ecs_server_t *s, const ecs_obj_t *obj, ecs_meta_rec_t *rec) {
  memset(rec, 0, sizeof *rec);
  rec->key = obj->key;
  rec->key_len = obj->key_len;
  snprintf(rec->node_id, sizeof rec->node_id, "%s", s->o.node_id);
  rec->epoch = s->epoch;
  rec->off = obj->off;
  rec->nbytes = obj->nbytes;
  rec->raw_nbytes = obj->raw_nbytes;
  rec->checksum = obj->checksum;
  rec->codec = obj->codec;
  rec->desc = obj->desc;
  rec->t_ms = obj->commit_ms;
}

static void on_drop(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why) {
  ecs_server_t *s = ctx;
  ECS_LOG_D("%s object (%llu bytes)",
            why == ECS_DROP_EVICTED    ? "evicted"
            : why == ECS_DROP_REPLACED ? "replaced"
                                       : "removed",
            (unsigned long long)obj->nbytes);
  /* A replaced object's record is overwritten by its successor's, queued
   * right after this commit: deleting it would only open a gap. */
  if (s->meta && why == ECS_DROP_REMOVED && s->pub_cur != NULL) {
    pub_wait_t *w = s->pub_cur;
    if (ecs_meta_del_async(s->meta, obj->key, obj->key_len, ecs__pub_done, &w->items[s->pub_cur_idx]) ==
        ECS_OK)
      w->pending++;
    else
      w->status[s->pub_cur_idx] = ECS_EREDIS;
    return;
  }
  /* Eviction's deletes are sent, never awaited. */
  if (s->meta && why != ECS_DROP_REPLACED)
    ecs_meta_queue_del(s->meta, obj->key, obj->key_len);
}

static void publish_one(void *ctx, const ecs_obj_t *obj) {
  ecs_server_t *s = ctx;
  ecs_meta_rec_t rec;
  ecs__server_rec(s, obj, &rec);
  ecs_meta_queue_put(s->meta, &rec);
}

static void resync_publish_all(void *ctx, ecs_meta_t *m) {
  (void)m;
  ecs_server_t *s = ctx;
  ecs_objstore_foreach(s->os, publish_one, s);
}

static int resync_has_key(void *ctx, const void *key, uint16_t key_len) {
  ecs_server_t *s = ctx;
  ecs_obj_t *o = ecs_objstore_find(s->os, key, key_len);
  return o && o->state == ECS_OBJ_COMMITTED;
}

void ecs__server_meta_flush(ecs_server_t *s) {
  if (s->meta && ecs_meta_flush(s->meta) != ECS_OK && ecs_meta_is_up(s->meta) == 0)
    ECS_LOG_D("redis down; records will be re-synced when it returns");
}

/* ------------------------------------------------------------------ */
/* timers                                                              */

/* One line when the Redis link goes down and one when it is back: an
 * operator sees the outage, and that the server served on through it. */
static void redis_log_change(ecs_server_t *s) {
  int up = ecs_meta_is_up(s->meta);
  if (up == s->redis_was_up)
    return;
  if (!up && ecs_meta_errstr(s->meta)[0] == '\0')
    return; /* not down: the asynchronous link is still connecting */
  s->redis_was_up = up;
  ecs_objstore_stats_t st;
  ecs_objstore_stats(s->os, &st);
  if (up)
    ECS_LOG_I("redis: connection to %s regained; re-publishing %llu objects", s->o.redis_url,
              (unsigned long long)st.objects);
  else
    ECS_LOG_W("redis: connection to %s lost (%s); serving on, records re-published when it returns",
              s->o.redis_url, ecs_meta_errstr(s->meta));
}

static void tick_shared(ecs_server_t *s, uint64_t now);

/* Whether c waits on its peer: a request read in part, or reply bytes
 * that may leave now and have not (the peer does not read).  A connection
 * whose oldest reply waits for Redis (perhaps with a reply built behind
 * it) waits on the server, not on its peer: that is no stall, and the
 * Redis timeout bounds it.  The clock of a stall (last_ms) restarts
 * whenever bytes move, and when the oldest parked reply is answered. */
static int conn_waits_on_peer(const conn_t *c) {
  if (c->st == C_META || c->st == C_DATA || c->hdr_got > 0)
    return 1;
  if (c->rq_n > 0)
    return c->rq[c->rq_head].ready;
  return c->st == C_WRITE;
}

/* Timer work of loop l, under the lock: loop 0 runs the server-wide part
 * (Redis, background eviction, metrics); every loop its own connections. */
static void tick(ecs_server_t *s, ecs_loop_t *l) {
  uint64_t now = ecs_now_ms();
  if (now - l->last_tick_ms < TICK_MS)
    return;
  l->last_tick_ms = now;
  if (l->idx == 0)
    tick_shared(s, now);
  /* Drop connections stalled in the middle of a request or a reply. */
  for (size_t i = 0; i < s->nconns;) {
    conn_t *c = s->conns[i];
    if (c->loop != l) {
      i++;
      continue;
    }
    if (c->doomed) {
      ecs__conn_close(s, c); /* swaps the last connection into slot i */
      continue;
    }
    if (c->live_pins)
      ecs__pins_expire(s, c, now);
    if (!c->authed && now - c->accept_ms > (uint64_t)s->o.hello_timeout_ms) {
      ECS_LOG_D("conn %llu: no HELLO within %d ms; closing", (unsigned long long)c->id,
                s->o.hello_timeout_ms);
      ecs__conn_close(s, c); /* swaps the last connection into slot i */
      continue;
    }
    if (conn_waits_on_peer(c) && now - c->last_ms > (uint64_t)s->o.io_timeout_ms) {
      ECS_LOG_W("conn %llu: stalled for %d ms mid-request; closing", (unsigned long long)c->id,
                s->o.io_timeout_ms);
      ecs__conn_close(s, c); /* swaps the last connection into slot i */
      continue;
    }
    i++;
  }
}

static void tick_shared(ecs_server_t *s, uint64_t now) {
  ecs__conn_accept_resume(s, now);
  if (s->meta) {
    ecs_meta_resync_t rs = {.publish_all = resync_publish_all, .has_key = resync_has_key, .ctx = s};
    ecs_pool_stats_t ps;
    ecs_pool_stats(s->pool, &ps);
    ecs_meta_set_free(s->meta, ps.bytes_free);
    ecs_meta_tick(s->meta, now, &rs);
    redis_log_change(s);
  }
  if (ecs_objstore_evict_background(s->os, 256) > 0)
    ecs__server_meta_flush(s);
  ecs_metrics_tick(s->metrics, now);
}

/* ------------------------------------------------------------------ */
/* life cycle                                                          */

/* Opens the RDMA device.  The pool is not registered for remote access:
 * each client connection gets an isolated endpoint, and each lease or
 * reservation a window over its one block (server_lease.c).  Without a
 * device: one line, and tcp/shm only (or a failed start when --rdma on
 * asked for it). */
static int rdma_setup(ecs_server_t *s) {
  if (!strcmp(s->o.rdma, "off"))
    return ECS_OK;
  ecs_rdma_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.device = s->o.rdma_device[0] ? s->o.rdma_device : NULL;
  ro.port = s->o.rdma_port;
  ro.gid_index = s->o.rdma_gid_index;
  char err[256] = "";
  int rc = ecs_rdma_ctx_open(&ro, ecs__rdma_ops_override(), &s->rdma, err, sizeof err);
  if (rc == ECS_OK) {
    ECS_LOG_I("rdma: %s ready (a window per lease and reservation)", ecs_rdma_ctx_device(s->rdma));
    return ECS_OK;
  }
  ecs_rdma_ctx_close(s->rdma);
  s->rdma = NULL;
  if (!strcmp(s->o.rdma, "on")) {
    ECS_LOG_E("cannot start: %s", err[0] ? err : "rdma: cannot register the pool");
    return rc;
  }
  ECS_LOG_I("%s; serving tcp and shm only", err[0] ? err : "rdma: unavailable");
  return ECS_OK;
}

/* Whether dir may hold our socket: a real directory (not a symlink), owned
 * by us or root, that neither group nor others may write.  In a directory
 * others can write, anyone could take the path first (the server could not
 * start) or swap it between our bind and a client's connect.  0, or -1
 * after logging why. */
static int shm_dir_ok(const char *dir, const char *how) {
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (how)
      ECS_LOG_E("cannot start: shm socket directory %s: %s", dir, strerror(errno));
    return -1;
  }
  const char *why = !S_ISDIR(st.st_mode)                         ? "is not a directory (a symlink?)"
                    : (st.st_uid != geteuid() && st.st_uid != 0) ? "is owned by another user"
                    : (st.st_mode & (S_IWGRP | S_IWOTH)) != 0    ? "is writable by group or others"
                                                                 : NULL;
  if (!why)
    return 0;
  if (!how) { /* the caller has another way; say why it takes it */
    ECS_LOG_W("shm socket directory %s %s (uid %u, mode %03o): not using it", dir, why, (unsigned)st.st_uid,
              (unsigned)(st.st_mode & 0777));
    return -1;
  }
  ECS_LOG_E("cannot start: shm socket directory %s %s (uid %u, mode %03o); anyone who can write there "
            "could take the socket's path. %s",
            dir, why, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), how);
  return -1;
}

/* The default socket directory, one the server owns: /run/ecstore as root
 * (where there is a /run), else $XDG_RUNTIME_DIR/ecstore, else
 * /tmp/ecstore-UID; made 0755 when missing.  Another user may make
 * /tmp/ecstore-UID first (before: the server could not start): then a
 * fresh one, /tmp/ecstore-UID-XXXXXX (mkdtemp, removed at exit); clients
 * learn the path from HELLO.  0, or -1 after logging why. */
static int shm_default_dir(ecs_server_t *s, char *dir, size_t cap) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  struct stat st;
  if (geteuid() == 0 && stat("/run", &st) == 0) /* a container may have no /run */
    n = snprintf(dir, cap, "/run/ecstore");
  else if (xdg && xdg[0] == '/')
    n = snprintf(dir, cap, "%s/ecstore", xdg);
  else
    n = snprintf(dir, cap, "/tmp/ecstore-%u", (unsigned)geteuid());
  if (n < 0 || (size_t)n >= cap) {
    ECS_LOG_E("cannot start: shm socket directory path too long (XDG_RUNTIME_DIR?)");
    return -1;
  }
  int in_tmp = !strncmp(dir, "/tmp/", 5);
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    ECS_LOG_E("cannot start: cannot make the shm socket directory %s: %s (or give --shm-socket PATH)", dir,
              strerror(errno));
    return -1;
  }
  if (!in_tmp || shm_dir_ok(dir, NULL) == 0)
    return shm_dir_ok(dir, "Remove it, or give --shm-socket PATH in a directory of yours.");
  n = snprintf(dir, cap, "/tmp/ecstore-%u-XXXXXX", (unsigned)geteuid());
  if (n < 0 || (size_t)n >= cap || !mkdtemp(dir) || chmod(dir, 0755) != 0) {
    ECS_LOG_E("cannot start: cannot make a shm socket directory in /tmp: %s (give --shm-socket PATH in a "
              "directory of yours)",
              strerror(errno));
    return -1;
  }
  snprintf(s->shm_tmpdir, sizeof s->shm_tmpdir, "%s", dir);
  ECS_LOG_W("shm socket directory: using %s instead (clients find it through HELLO)", dir);
  return shm_dir_ok(dir, "Give --shm-socket PATH in a directory of yours.");
}

/* The Unix socket local clients use for shm (and any request), in a
 * directory nobody else can write. */
static int shm_listen(ecs_server_t *s) {
  char dir[sizeof s->shm_path];
  if (s->o.shm_socket[0]) {
    snprintf(s->shm_path, sizeof s->shm_path, "%s", s->o.shm_socket);
    snprintf(dir, sizeof dir, "%s", s->o.shm_socket);
    char *slash = strrchr(dir, '/');
    if (!slash)
      snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
      dir[1] = '\0';
    else
      *slash = '\0';
    if (shm_dir_ok(dir, "Give --shm-socket a path in a directory only the server's user can write.") != 0)
      return ECS_EINVAL;
  } else {
    if (shm_default_dir(s, dir, sizeof dir) != 0)
      return ECS_EINVAL;
    if (snprintf(s->shm_path, sizeof s->shm_path, "%s/ecstore-%d.sock", dir, s->port) >=
        (int)sizeof s->shm_path) {
      ECS_LOG_E("cannot start: shm socket path too long in %s (give --shm-socket PATH)", dir);
      s->shm_path[0] = '\0';
      return ECS_EINVAL;
    }
  }
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(s->shm_path) >= sizeof a.sun_path) {
    ECS_LOG_E("cannot start: shm socket path too long: %s", s->shm_path);
    return ECS_EINVAL;
  }
  memcpy(a.sun_path, s->shm_path, strlen(s->shm_path) + 1);
  /* A socket file left by a crashed server is replaced; anything else is not. */
  struct stat st;
  if (lstat(s->shm_path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      ECS_LOG_E("cannot start: shm socket path %s exists and is not a socket", s->shm_path);
      s->shm_path[0] = '\0';
      return ECS_EINVAL;
    }
    unlink(s->shm_path);
  }
  s->ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->ufd < 0 || bind(s->ufd, (struct sockaddr *)&a, sizeof a) != 0 || listen(s->ufd, 512) != 0) {
    ECS_LOG_E("cannot start: cannot listen on %s: %s", s->shm_path, strerror(errno));
    s->shm_path[0] = '\0';
    return ECS_EIO;
  }
  /* Access is decided by SO_PEERCRED against the allowed uids, not by mode. */
  chmod(s->shm_path, 0666);
  return ECS_OK;
}

/* Population of a large pool takes seconds; a line a second, once it has
 * taken one, so that a silent server is never mistaken for a hung one. */
static void on_populate(void *ctx, size_t done, size_t total) {
  ecs_server_t *s = ctx;
  uint64_t now = ecs_now_ms();
  if (now - s->pop_log_ms < 1000 && !(done == total && now - s->pop_t0_ms >= 1000))
    return;
  s->pop_log_ms = now;
  if (done < total)
    ECS_LOG_I("pool: populating %zu of %zu MiB (%.0f%%)", done >> 20, total >> 20,
              100.0 * (double)done / (double)total);
  else
    ECS_LOG_I("pool: %zu MiB populated in %.1f s", total >> 20, (double)(now - s->pop_t0_ms) / 1000.0);
}

/* Why the pool could not be made.  With huge pages required, the usual
 * cause is that none are reserved: say so, not "out of memory". */
static void pool_fail_log(const ecs_server_opts_t *o, int rc) {
  unsigned long long mib = (unsigned long long)(o->pool_size >> 20);
  if (o->hugepages == 2 && rc == ECS_ENOMEM) {
    unsigned long long kb = ecs__meminfo("Hugepagesize"), nfree = ecs__meminfo("HugePages_Free");
    if (nfree * kb * 1024 < o->pool_size) {
      ECS_LOG_E(
          "cannot start: --hugepages require: a %llu MiB pool needs %llu huge pages of %llu kB, %llu are "
          "free (reserve them with: sysctl vm.nr_hugepages=N, or use --hugepages try)",
          mib, kb ? (unsigned long long)((o->pool_size + kb * 1024 - 1) / (kb * 1024)) : 0ULL, kb, nfree);
      return;
    }
  }
  ECS_LOG_E("cannot start: cannot create a pool of %llu MiB: %s", mib, ecs_strerror(rc));
}

/* Protected mode: whether the listening socket is reachable only from this
 * host (127.0.0.0/8, ::1, or ::ffff:127.x).  Asked of the bound socket, not
 * of the name given, so "localhost" and "0.0.0.0" are judged by what they
 * became. */
static int bound_to_loopback(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
    return 0;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

/* The cores this process may run on (sched_getaffinity), at least 1. */
static unsigned cores_available(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? (unsigned)n : 1;
}

/* The loops' epolls, eventfds and discard buffers (threads start in run).
 * s->epfd and s->evfd name loop 0's. */
static int loops_create(ecs_server_t *s) {
  int want = s->o.threads;
  if (want < 0 || want > ECS_SERVER_MAX_THREADS) {
    ECS_LOG_E("cannot start: --threads %d: expected 1..%d (0: the cores available)", want,
              ECS_SERVER_MAX_THREADS);
    return ECS_EINVAL;
  }
  unsigned n = want ? (unsigned)want : cores_available();
  if (n > ECS_SERVER_MAX_THREADS)
    n = ECS_SERVER_MAX_THREADS;
  s->loops = calloc(n, sizeof *s->loops);
  if (!s->loops) {
    ECS_LOG_E("cannot start: %s", ecs_strerror(ECS_ENOMEM));
    return ECS_ENOMEM;
  }
  for (unsigned i = 0; i < n; i++) {
    ecs_loop_t *l = &s->loops[i];
    l->s = s;
    l->idx = i;
    l->epfd = l->evfd = -1;
  }
  s->nloops = n;
  for (unsigned i = 0; i < n; i++) {
    ecs_loop_t *l = &s->loops[i];
    l->scratch = malloc(SCRATCH_SIZE);
    if (!l->scratch) {
      ECS_LOG_E("cannot start: %s", ecs_strerror(ECS_ENOMEM));
      return ECS_ENOMEM;
    }
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &l->evfd};
    if (l->epfd < 0 || l->evfd < 0 || epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->evfd, &e) != 0) {
      ECS_LOG_E("cannot start: %s", strerror(errno));
      return ECS_EIO;
    }
  }
  s->epfd = s->loops[0].epfd;
  s->evfd = s->loops[0].evfd;
  return ECS_OK;
}

static void loops_destroy(ecs_server_t *s) {
  for (unsigned i = 0; s->loops && i < s->nloops; i++) {
    ecs_loop_t *l = &s->loops[i];
    if (l->epfd >= 0)
      close(l->epfd);
    if (l->evfd >= 0)
      close(l->evfd);
    free(l->scratch);
  }
  free(s->loops);
  s->loops = NULL;
  s->nloops = 0;
}

int ecs_server_create(const ecs_server_opts_t *o, ecs_server_t **out) {
  *out = NULL;
  ecs_server_t *s = calloc(1, sizeof *s);
  if (!s)
    return ECS_ENOMEM;
  s->o = *o;
  if (!s->o.max_pinned_bytes) /* default: 3/4 of the pool per connection: a big batch fits, others keep room
                               */
    s->o.max_pinned_bytes = o->pool_size / 4 * 3;
  if (!s->o.max_pins)
    s->o.max_pins = 4096;
  s->lfd = s->ufd = s->epfd = s->evfd = -1;
  s->epoch = ecs_wall_us();
  int rc = ECS_ENOMEM;
  if (pthread_mutex_init(&s->mu, NULL) != 0) {
    free(s);
    return ECS_ENOMEM;
  }
  s->mu_init = 1;
  rc = loops_create(s);
  if (rc)
    goto fail;
  /* Bound now (so the port is known for the node id) but listening only at
   * the end: a client that can connect finds the node registered. */
  rc = ecs_net_listen(o->listen_host, o->listen_port, -1, &s->lfd);
  if (rc) {
    int e = errno;
    ECS_LOG_E("cannot start: cannot listen on %s:%d: %s%s", o->listen_host, o->listen_port, strerror(e),
              e == EADDRINUSE ? " (another server on this port? pick one with --listen)" : "");
    goto fail;
  }
  s->port = ecs_net_local_port(s->lfd);
  if (!o->auth_token[0] && !o->acl && !o->unprotected && !bound_to_loopback(s->lfd)) {
    ECS_LOG_E("cannot start: listening on %s without an auth token lets anyone on the network read and "
              "write the store; give clients a token with --auth-token-file FILE, or pass --unprotected "
              "to run open anyway",
              o->listen_host);
    rc = ECS_EINVAL;
    goto fail;
  }
  if (!s->o.node_id[0])
    snprintf(s->o.node_id, sizeof s->o.node_id, "%.50s:%d", o->listen_host, s->port);
  if (!s->o.advertise[0])
    snprintf(s->o.advertise, sizeof s->o.advertise, "%s:%d", o->listen_host, s->port);
  ecs_pool_opts_t po;
  ecs_pool_opts_init(&po);
  po.size = (size_t)o->pool_size;
  po.min_block = (size_t)o->min_block;
  po.huge = (ecs_pool_huge_t)o->hugepages;
  po.lock = o->lock_pool;
  po.cuda_register = o->cuda_register;
  po.on_populate = on_populate;
  po.populate_ctx = s;
  rc = ecs__server_pool_fits(o); /* before populating: the OOM killer says nothing */
  if (rc)
    goto fail;
  s->pop_t0_ms = s->pop_log_ms = ecs_now_ms();
  if (o->pool_size >= (1ull << 30)) /* about a second per GiB or two: say so before it starts */
    ECS_LOG_I("pool: populating%s %llu MiB", o->lock_pool ? " and pinning" : "",
              (unsigned long long)(o->pool_size >> 20));
  rc = ecs_pool_create(&po, &s->pool);
  if (rc) {
    pool_fail_log(o, rc);
    goto fail;
  }
  ecs_objstore_opts_t oo;
  ecs_objstore_opts_init(&oo);
  oo.high_watermark = o->high_watermark;
  oo.low_watermark = o->low_watermark;
  oo.max_objects = o->max_objects;
  oo.scrub_freed = o->scrub_freed;
  oo.on_drop = on_drop;
  oo.cb_ctx = s;
  rc = ecs_objstore_create(s->pool, &oo, &s->os);
  if (rc) {
    ECS_LOG_E("cannot start: object index: %s", ecs_strerror(rc));
    goto fail;
  }
  rc = ecs__auth_init(s); /* the tokens' keys in the namespace served, their quotas */
  if (rc)
    goto fail;

  if (o->redis_url[0] && strcmp(o->redis_url, "none") != 0) {
    ecs_meta_opts_t mo;
    ecs_meta_opts_init(&mo);
    mo.redis_url = s->o.redis_url;
    mo.ns = s->o.ns;
    mo.node_id = s->o.node_id;
    mo.addr = s->o.advertise;
    mo.pool_size = ecs_pool_size(s->pool);
    mo.epoch = s->epoch;
    mo.timeout_ms = o->redis_timeout_ms;
    mo.heartbeat_ttl_ms = o->registry_ttl_ms;
    rc = ecs_meta_open(&mo, &s->meta);
    if (rc) { /* say why (before: "invalid argument"), never the password */
      char why[512], shown[256];
      ecs__rds_url_t u;
      if (ecs__rds_url_resolve(s->o.redis_url, &u, why, sizeof why) == ECS_OK)
        snprintf(why, sizeof why, "%s", ecs_strerror(rc));
      memset(&u, 0, sizeof u);
      ECS_LOG_E("cannot start: --redis '%s': %s", ecs__rds_url_redact(s->o.redis_url, shown, sizeof shown),
                why);
      goto fail;
    }
    s->redis_was_up = ecs_meta_is_up(s->meta);
  } else {
    ECS_LOG_W("running without Redis: exists checks through Redis will see nothing");
  }

  rc = ECS_EIO;
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &e) != 0)
    goto fail_sys;
  rc = rdma_setup(s);
  if (rc)
    goto fail;
  if (strcmp(o->shm_socket, "off") != 0) {
    rc = shm_listen(s);
    if (rc)
      goto fail;
    e.data.ptr = &s->ufd;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->ufd, &e) != 0)
      goto fail_sys;
  }
  if (o->metrics_listen[0]) {
    char mh[128], merr[256];
    int mp;
    rc = ECS_EINVAL;
    if (ecs_net_parse_hostport(o->metrics_listen, mh, sizeof mh, &mp)) {
      ECS_LOG_E("cannot start: --metrics-listen '%s': expected HOST:PORT", o->metrics_listen);
      goto fail;
    }
    rc = ecs_metrics_open(mh, mp, s->epfd, ecs__server_render_metrics, s, &s->metrics, merr, sizeof merr);
    if (rc) {
      ECS_LOG_E("cannot start: %s", merr);
      goto fail;
    }
    if (!o->auth_token[0] && !o->acl && !o->unprotected && !bound_to_loopback(ecs_metrics_fd(s->metrics))) {
      /* protected mode covers /metrics too: it tells anyone the node id,
       * the pool's size and fill, and the request counters */
      ECS_LOG_E("cannot start: --metrics-listen %s is beyond loopback and the server has no auth token: "
                "anyone on the network could read the node id and counters. Listen on 127.0.0.1, give "
                "clients a token (--auth-token-file FILE or --acl-file FILE), or pass --unprotected",
                o->metrics_listen);
      rc = ECS_EINVAL;
      goto fail;
    }
    ECS_LOG_I("metrics: http://%s:%d/metrics", mh, ecs_metrics_port(s->metrics));
  }
  /* Registered once nothing else can fail: a server that cannot start
   * must not stay listed in the namespace's node set for clients to place
   * puts on until its entry expires (issue 24).  And before listen(): the
   * kernel accepts connections from then on, and a client must not find
   * this node's port answering while the registry still holds the epoch
   * of the process before it (its records would read as present). */
  int registered = 0;
  if (s->meta) {
    registered = ecs_meta_is_up(s->meta) && ecs_meta_register(s->meta) == ECS_OK;
    if (registered)
      ECS_LOG_I("registered with Redis at %s as node '%s'", o->redis_url, s->o.node_id);
    else
      ECS_LOG_W("Redis at %s is unreachable (%s); serving anyway, will retry", o->redis_url,
                ecs_meta_errstr(s->meta));
  }
  rc = ECS_EIO;
  if (listen(s->lfd, 512) != 0) {
    int saved = errno;
    if (registered)
      ecs_meta_unregister(s->meta, 1000);
    errno = saved;
    goto fail_sys;
  }
  *out = s;
  return ECS_OK;
fail_sys:
  ECS_LOG_E("cannot start: %s", strerror(errno));
fail:
  ecs_server_destroy(s);
  return rc;
}

int ecs_server_port(const ecs_server_t *s) {
  return s->port;
}

/* Async-signal-safe: an atomic store and write(2)s. */
void ecs_server_stop(ecs_server_t *s) {
  s->stopping = 1;
  uint64_t one = 1;
  for (unsigned i = 0; i < s->nloops; i++) {
    ssize_t r = write(s->loops[i].evfd, &one, sizeof one);
    (void)r;
  }
}

/* One pass of loop l's event batch, under the lock.  Loop 0 accepts after
 * the batch's other events: admitting a connection may close an
 * unauthenticated one of loop 0, whose pointer could otherwise still be
 * waiting further down evs (a connection of another loop is only doomed,
 * and closed by its own loop). */
static void loop_batch(ecs_server_t *s, ecs_loop_t *l, struct epoll_event *evs, int n) {
  int accept_tcp = 0, accept_unix = 0;
  for (int i = 0; i < n; i++) {
    void *p = evs[i].data.ptr;
    if (p == &l->evfd)
      s->stopping = 1;
    else if (l->idx == 0 && p == NULL)
      accept_tcp = 1;
    else if (l->idx == 0 && p == &s->ufd)
      accept_unix = 1;
    else if (l->idx == 0 && ecs_meta_owns(s->meta, p))
      ecs_meta_event(s->meta, evs[i].events);
    else if (l->idx == 0 && ecs_metrics_owns(s->metrics, p))
      ecs_metrics_event(s->metrics, p, evs[i].events);
    else
      ecs__conn_event(s, p, evs[i].events);
  }
  if (accept_tcp)
    ecs__conn_accept_all(s, s->lfd, 0);
  if (accept_unix)
    ecs__conn_accept_all(s, s->ufd, 1);
  tick(s, l);
  ecs_meta_kick(s->meta); /* this batch's Redis commands leave now, from this thread */
}

/* The body of one loop; the lock is held except in epoll_wait and around
 * the payload syscalls (server_conn.c). */
static int loop_run(ecs_loop_t *l) {
  ecs_server_t *s = l->s;
  struct epoll_event evs[64];
  while (!s->stopping) {
    int wait = TICK_MS;
    if (l->idx == 0) {
      /* Wake for the next Redis deadline too, so that a put waiting on a
       * stopped Redis is answered when the Redis timeout passes. */
      ecs__lock(s);
      int due = ecs_meta_poll(s->meta, ecs_now_ms());
      ecs_meta_kick(s->meta);
      ecs__unlock(s);
      if (due >= 0 && due < TICK_MS)
        wait = due + 1;
    }
    int n = epoll_wait(l->epfd, evs, 64, wait);
    if (n < 0 && errno != EINTR) {
      ECS_LOG_E("epoll_wait (loop %u): %s", l->idx, strerror(errno));
      ecs_server_stop(s);
      return ECS_EIO;
    }
    ecs__lock(s);
    loop_batch(s, l, evs, n < 0 ? 0 : n);
    ecs__unlock(s);
  }
  return ECS_OK;
}

static void *loop_thread(void *arg) {
  loop_run(arg);
  return NULL;
}

/* How long a stop may spend on Redis (the registry entry and the sweep of
 * this node's records): SIGTERM must end the server within 2 s even when
 * Redis is frozen or busy with a backlog (issue 24); what is left is
 * stale without the registry entry and swept by the next start. */
#define STOP_REDIS_MS 1000

int ecs_server_run(ecs_server_t *s) {
  ecs_pool_stats_t ps;
  ecs_pool_stats(s->pool, &ps);
  ECS_LOG_I("ready: listening on %s:%d%s%s; namespace '%s', pool %llu MiB (%s%s), epoch %llu, %u thread%s",
            s->o.listen_host, s->port, s->shm_path[0] ? " and shm " : "", s->shm_path, s->o.ns,
            (unsigned long long)(ps.size >> 20), ps.locked ? "pinned" : "NOT pinned",
            ps.cuda_registered   ? ", CUDA-registered"
            : s->o.cuda_register ? ", NOT CUDA-registered"
                                 : "",
            (unsigned long long)s->epoch, s->nloops, s->nloops == 1 ? "" : "s");
  /* From here on no loop waits for Redis: records, deletes, the
   * heartbeat and the re-sync go over the asynchronous link, on loop 0.
   * Attached here, not in create, so that its connect deadline starts
   * when the loop that answers it does. */
  if (s->meta && ecs_meta_attach_loop(s->meta, s->epfd) != ECS_OK)
    ECS_LOG_W("redis: cannot attach the asynchronous link; records are re-published when it connects");
  ecs__pull_start(s);
  for (unsigned i = 1; i < s->nloops; i++) {
    int e = pthread_create(&s->loops[i].th, NULL, loop_thread, &s->loops[i]);
    if (e != 0) {
      ECS_LOG_E("cannot start loop thread %u: %s", i, strerror(e));
      ecs_server_stop(s);
      break;
    }
    s->loops[i].started = 1;
  }
  int rc = loop_run(&s->loops[0]);
  ecs_server_stop(s); /* loop 0 may have left on an error: the others follow */
  for (unsigned i = 1; i < s->nloops; i++)
    if (s->loops[i].started) {
      pthread_join(s->loops[i].th, NULL);
      s->loops[i].started = 0;
    }
  ecs__pull_stop(s); /* before the connections its requests park on */
  ECS_LOG_I("stopping: closing %zu connections", s->nconns);
  ecs__lock(s);
  while (s->nconns)
    ecs__conn_close(s, s->conns[0]);
  if (s->meta && ecs_meta_is_up(s->meta)) {
    int urc = ecs_meta_unregister(s->meta, STOP_REDIS_MS);
    if (urc)
      ECS_LOG_W("could not remove records from Redis within %d ms: %s (they are stale without this node's "
                "registry entry; the next start sweeps them)",
                STOP_REDIS_MS, ecs_strerror(urc));
    else
      ECS_LOG_I("records and registry entry removed from Redis");
  }
  ecs__unlock(s);
  return rc;
}

void ecs_server_destroy(ecs_server_t *s) {
  if (!s)
    return;
  ecs__pull_stop(s);
  while (s->nconns)
    ecs__conn_close(s, s->conns[0]);
  free(s->conns);
  ecs__auth_free(s);
  ecs_metrics_close(s->metrics);
  ecs_meta_close(s->meta);
  ecs_objstore_abandon(s->os); /* the pool goes next: no block back one by one */
  ecs_rdma_ctx_close(s->rdma);
  ecs_pool_destroy(s->pool);
  if (s->lfd >= 0)
    close(s->lfd);
  if (s->ufd >= 0) {
    close(s->ufd);
    unlink(s->shm_path);
  }
  if (s->shm_tmpdir[0])
    rmdir(s->shm_tmpdir); /* the mkdtemp one: ours alone */
  loops_destroy(s);
  if (s->mu_init)
    pthread_mutex_destroy(&s->mu);
  free(s);
}
