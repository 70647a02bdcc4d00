/*
 * PULL: objects fetched from the other servers of the namespace into this
 * server's pool, so that every process on this host (every TP rank, every
 * engine instance) reads one local copy, and the bytes cross the network
 * once, into their pool block, with no process in between.
 *
 * A client names each key and the holder Redis lists for it (its registry
 * address).  The handler (on its loop, under the server lock) checks every
 * item: the connection's rights (read and write: a pull both learns
 * whether a key exists and stores it), the key, and that the address is
 * the registry address of a live server of this namespace other than this
 * one: a copy of the registry read by a thread of its own, so nothing on
 * the request's path waits for Redis, and the server never connects to an
 * address a client made up (no SSRF).  Items already here are answered at
 * once; the others become one fetch per holder, queued for the pull
 * threads, and the request parks (server_pub.c) until they settle.
 *
 * A pull thread speaks the protocol to the holder as a client would (HELLO,
 * with this server's pull token proved, never sent; then GET), with one
 * deadline for the whole fetch: a holder that is dead, stopped or slow
 * costs its own items ECS_ETIMEDOUT or ECS_ECONN and nothing else.  The
 * reply's sizes are checked before anything is reserved; each object gets
 * a PENDING block (reserved under the lock, as a PUT does, on behalf of
 * the requesting token's account), its bytes are received straight into
 * it without the lock and hashed slice by slice as they land, and it is
 * committed only when its checksum matches the holder's record.  Its Redis
 * record names this server as a holder too (sent, not awaited).
 */
#include "store/server/server_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/auth.h"
#include "store/core/checksum.h"
#include "store/core/codec.h"
#include "store/core/log.h"
#include "store/core/net.h"

#define PULL_REGISTRY_MS 1000 /* the registry copy is read again this often... */
#define PULL_POKE_MS 100      /* ...and at most this often when asked for an address it lacks */
#define PULL_READ_MS 500      /* one read's budget, (re)connect included: a stop waits no longer for it */
#define PULL_MAX_NODES 1024   /* registry entries kept */
#define PULL_MAX_JOBS 4096    /* fetches queued at once; past it, items are ECS_EBUSY */

/* One key of a fetch. */
typedef struct pull_key {
  uint32_t idx;             /* the item in the request */
  uint16_t len;             /* key bytes */
  uint8_t key[ECS_MAX_KEY]; /* the key */
  int status;               /* its outcome so far */
  ecs_obj_t *obj;           /* its PENDING block while the bytes come, or NULL */
  uint8_t *dst;             /* where they go (the block's bytes) */
  ecs_get_reply_t rp;       /* what the holder said of it */
} pull_key_t;

/* One holder's share of one PULL request. */
typedef struct pull_job {
  struct pull_job *next;            /* queue link */
  pub_wait_t *w;                    /* the parked request */
  char host[128];                   /* the holder's host... */
  int port;                         /* ...and port */
  char addr[ECS_PULL_MAX_ADDR + 1]; /* its registry address */
  char node_id[64];                 /* its registry node id */
  uint64_t deadline_ms;             /* the whole fetch ends by then */
  uint16_t owner;                   /* the requesting token's account (0: none) */
  uint32_t n, cap;                  /* keys, and room for them */
  pull_key_t *keys;                 /* the keys */
} pull_job_t;

typedef struct pull_worker {
  ecs_server_t *s; /* the server */
  pthread_t th;    /* its thread */
  int started;     /* th runs */
  int fd;          /* the holder socket in use (under qmu), -1: none; stop shuts it down */
} pull_worker_t;

struct ecs__pull {
  pthread_mutex_t qmu;     /* the queue, stop and the workers' fds (after s->mu when both) */
  pthread_cond_t qcv;      /* a job queued, or stop */
  pthread_cond_t regcv;    /* the registry reader: read again now (poke), or stop */
  int poke;                /* an address was not in the copy: read the registry soon */
  pull_job_t *head, *tail; /* queued jobs, oldest first */
  size_t njobs;            /* how many */
  int stop;                /* the threads leave */
  pull_worker_t *wk;       /* the pull threads */
  unsigned nwk;            /* how many */
  pthread_t reg_th;        /* the registry reader */
  int reg_started;         /* reg_th runs */
  ecs_meta_t *meta;        /* its own blocking Redis link */
  ecs_meta_node_t *nodes;  /* the registry copy (under s->mu) */
  size_t nnodes;           /* entries in it */
  int nodes_read;          /* read at least once */
};

/* ---- the registry copy ---- */

static void *reg_main(void *arg) {
  ecs_server_t *s = arg;
  struct ecs__pull *p = s->pull;
  ecs_meta_node_t *buf = calloc(PULL_MAX_NODES, sizeof *buf);
  int logged = 0;
  pthread_mutex_lock(&p->qmu);
  while (!p->stop && buf) { /* out of memory: the copy stays as it is */
    pthread_mutex_unlock(&p->qmu);
    size_t n = 0;
    /* Bounded, so that a stop during a Redis freeze joins this thread
     * within PULL_READ_MS (the link's own timeout, with reconnects through
     * sentinels, ran to 6 s under ASan in test_stop_redis_frozen). */
    ecs_meta_set_deadline(p->meta, ecs_now_ms() + PULL_READ_MS);
    int rc = ecs_meta_nodes(p->meta, buf, PULL_MAX_NODES, &n);
    if (rc == ECS_OK) {
      ecs__lock(s);
      ecs_meta_node_t *t = p->nodes;
      p->nodes = buf;
      p->nnodes = n;
      p->nodes_read = 1;
      ecs__unlock(s);
      buf = t ? t : calloc(PULL_MAX_NODES, sizeof *buf); /* the first read leaves no old copy */
      logged = 0;
    } else if (!logged) { /* the last copy stays in use */
      ECS_LOG_W("pull: cannot read the node registry (%s); pulls use the last copy", ecs_strerror(rc));
      logged = 1;
    }
    uint64_t t0 = ecs_now_ms();
    pthread_mutex_lock(&p->qmu);
    p->poke = 0;
    for (;;) {
      uint64_t now = ecs_now_ms(), until = p->poke ? t0 + PULL_POKE_MS : t0 + PULL_REGISTRY_MS;
      if (p->stop || now >= until)
        break;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + (until - now) * 1000000u;
      ts.tv_sec += (time_t)(ns / 1000000000u);
      ts.tv_nsec = (long)(ns % 1000000000u);
      pthread_cond_timedwait(&p->regcv, &p->qmu, &ts);
    }
  }
  pthread_mutex_unlock(&p->qmu);
  free(buf);
  return NULL;
}

/* The registry entry whose address is addr (len bytes), or NULL.  Under s->mu. */
static const ecs_meta_node_t *reg_find(const struct ecs__pull *p, const char *addr, size_t len) {
  for (size_t i = 0; i < p->nnodes; i++)
    if (strlen(p->nodes[i].addr) == len && !memcmp(p->nodes[i].addr, addr, len))
      return &p->nodes[i];
  return NULL;
}

/* ---- talking to a holder ---- */

/* Sends op with count records from body, reads the reply's header and
 * records (*meta, malloc'd, meta_len bytes) and checks that it answers
 * this request.  Its data section is left in the socket (a GET's). */
static int call(int fd, uint8_t op, uint32_t req_id, uint32_t count, const ecs_wbuf_t *body, ecs_hdr_t *h,
                uint8_t **meta, uint64_t deadline) {
  *meta = NULL;
  if (body->err != ECS_OK)
    return body->err;
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_hdr_t q = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = op,
                 .req_id = req_id,
                 .count = count,
                 .meta_len = (uint32_t)body->len};
  ecs_proto_hdr_encode(&q, hb);
  struct iovec iov[2] = {{hb, sizeof hb}, {body->p, body->len}};
  int rc = ecs_net_writev_all(fd, iov, body->len ? 2 : 1, deadline);
  if (rc == ECS_OK)
    rc = ecs_net_read_all(fd, hb, sizeof hb, deadline);
  if (rc != ECS_OK)
    return rc;
  if (ecs_proto_hdr_decode(hb, UINT64_MAX, h) != ECS_OK || !(h->flags & ECS_FLAG_REPLY) || h->opcode != op ||
      h->req_id != req_id || (op != ECS_OP_GET && h->data_len != 0))
    return ECS_EPROTO;
  if (h->status != ECS_OK)
    return h->status > 0 ? ECS_EPROTO : h->status; /* refused as a whole */
  *meta = malloc(h->meta_len ? h->meta_len : 1);
  if (!*meta)
    return ECS_ENOMEM;
  return ecs_net_read_all(fd, *meta, h->meta_len, deadline);
}

/* One HELLO round trip with hl; the reply record in *hr. */
static int hello_call(int fd, const ecs_hello_t *hl, ecs_hello_reply_t *hr, uint64_t deadline) {
  ecs_wbuf_t b;
  ecs_wbuf_init(&b);
  ecs_proto_hello_write(&b, hl);
  ecs_hdr_t h;
  uint8_t *meta = NULL;
  int rc = call(fd, ECS_OP_HELLO, 1, 0, &b, &h, &meta, deadline);
  ecs_wbuf_free(&b);
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, meta, h.meta_len);
    rc = ecs_proto_hello_reply_read(&r, hr);
  }
  free(meta);
  return rc;
}

/* HELLO to the holder of j, as a client of its namespace: with a token,
 * the holder proves it first (as the registry's node at the registry's
 * address) and only then this server; the token never travels.  Without
 * one, a plain HELLO.  Either way the reply must name the registry's node.
 * *max_items: the holder's batch limit. */
static int hello(ecs_server_t *s, int fd, const pull_job_t *j, uint32_t *max_items, uint64_t deadline) {
  const char *tok = s->o.pull_token[0] ? s->o.pull_token : s->o.auth_token;
  ecs_hello_t hl = {.ns = (const uint8_t *)s->o.ns, .ns_len = (uint16_t)strlen(s->o.ns)};
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  int rc;
  if (!tok[0]) {
    rc = hello_call(fd, &hl, &hr, deadline);
  } else {
    uint8_t key[ECS_AUTH_KEY_SIZE], id[ECS_AUTH_ID_SIZE], cn[ECS_AUTH_NONCE_SIZE], mac[ECS_AUTH_MAC_SIZE];
    if (ecs__auth_random(cn, sizeof cn) != 0)
      return ECS_EIO;
    ecs__auth_key(tok, strlen(tok), s->o.ns, key);
    ecs__auth_key_id(key, id);
    hl.client_flags = ECS_HELLO_C_CHALLENGE;
    hl.key_id = id;
    hl.nonce = cn;
    rc = hello_call(fd, &hl, &hr, deadline);
    if (rc == ECS_OK && !hr.proof)
      rc = ECS_EAUTH;
    if (rc == ECS_OK) {
      ecs__auth_mac(key, 1, cn, hr.snonce, s->o.ns, hr.node_id, hr.addr, mac);
      if (!ecs_ct_equal(mac, sizeof mac, hr.smac, sizeof hr.smac) || strcmp(hr.node_id, j->node_id) != 0 ||
          strcmp(hr.addr, j->addr) != 0)
        rc = ECS_EAUTH; /* not the registry's node: nothing more is sent to it */
    }
    if (rc == ECS_OK) {
      ecs__auth_mac(key, 0, cn, hr.snonce, s->o.ns, hr.node_id, hr.addr, mac);
      ecs_hello_t pv = {.ns = hl.ns, .ns_len = hl.ns_len, .client_flags = ECS_HELLO_C_PROVE, .mac = mac};
      rc = hello_call(fd, &pv, &hr, deadline);
    }
    ecs__auth_wipe(key, sizeof key);
    ecs__auth_wipe(mac, sizeof mac);
  }
  if (rc == ECS_OK && strcmp(hr.node_id, j->node_id) != 0)
    rc = ECS_EAUTH;
  *max_items = hr.max_items;
  ecs__auth_wipe(&hr, sizeof hr);
  return rc;
}

/* The holder's word on one item, checked before any size in it is used:
 * at most cap bytes, at most what is left of the data section, a codec
 * this build knows with a size a compressor could have produced. */
static int reply_sane(const ecs_get_reply_t *rp, uint64_t cap, uint64_t left) {
  if (rp->nbytes > cap || rp->nbytes > left)
    return 0;
  return rp->codec == ECS_CODEC_NONE || ecs_codec_frame_ok(rp->codec, rp->nbytes, rp->raw_nbytes);
}

/* Reserves a block for each item the holder is sending (under the lock).
 * An item already stored with the same content is OK at once; one stored
 * with other content is ECS_ECONFLICT; one being written is ECS_EBUSY; no
 * room is ECS_ENOSPC / ECS_ETOOBIG / ECS_EQUOTA.  Their bytes are drained. */
static void reserve_all(ecs_server_t *s, pull_job_t *j, pull_key_t *k, size_t m) {
  ecs__lock(s);
  for (size_t i = 0; i < m; i++) {
    if (k[i].status != ECS_OK)
      continue;
    ecs_obj_t *o = ecs_objstore_find(s->os, k[i].key, k[i].len);
    if (o && o->state == ECS_OBJ_COMMITTED) {
      k[i].status =
          ecs__obj_same(o, k[i].rp.nbytes, k[i].rp.checksum, k[i].rp.codec, k[i].rp.raw_nbytes, &k[i].rp.desc)
              ? ECS_OK
              : ECS_ECONFLICT;
      continue;
    }
    int rc = ecs_objstore_reserve_as(s->os, k[i].key, k[i].len, k[i].rp.nbytes, 0, j->owner, &k[i].obj);
    if (rc != ECS_OK) {
      k[i].obj = NULL;
      k[i].status = rc;
      continue;
    }
    k[i].dst = k[i].rp.nbytes ? ecs_objstore_data(s->os, k[i].obj) : NULL;
  }
  ecs__server_meta_flush(s); /* the deletes of anything evicted to make room */
  ecs__unlock(s);
}

/* Receives the data section: each item's bytes into its block, hashed
 * slice by slice as they land, or into scratch when it has no block. */
static int receive_all(int fd, pull_key_t *k, size_t m, uint8_t *scratch, ecs_sum_t *sum, uint64_t *sums,
                       uint64_t deadline) {
  for (size_t i = 0; i < m; i++) {
    if (k[i].rp.status != ECS_OK)
      continue;
    uint64_t left = k[i].rp.nbytes;
    uint8_t *dst = k[i].obj ? k[i].dst : NULL;
    ecs_sum_reset(sum);
    while (left > 0) {
      size_t n = left < ECS_SUM_SLICE ? (size_t)left : ECS_SUM_SLICE;
      uint8_t *p = dst ? dst : scratch;
      int rc = ecs_net_read_all(fd, p, n, deadline);
      if (rc != ECS_OK)
        return rc;
      if (dst) {
        ecs_sum_update(sum, p, n);
        dst += n;
      }
      left -= n;
    }
    sums[i] = ecs_sum_digest(sum);
  }
  return ECS_OK;
}

/* Commits (checksum right) or drops each received block (under the lock);
 * a failure rc drops them all. */
static void settle_all(ecs_server_t *s, pull_key_t *k, size_t m, const uint64_t *sums, int rc) {
  ecs__lock(s);
  uint64_t now = ecs_wall_ms();
  for (size_t i = 0; i < m; i++) {
    ecs_obj_t *o = k[i].obj;
    k[i].obj = NULL;
    if (!o)
      continue;
    if (rc != ECS_OK || sums[i] != k[i].rp.checksum) {
      ecs_objstore_abort(s->os, o);
      k[i].status = rc != ECS_OK ? rc : ECS_ECHECKSUM;
      continue;
    }
    o->codec = k[i].rp.codec;
    o->raw_nbytes = k[i].rp.raw_nbytes;
    o->checksum = sums[i];
    o->desc = k[i].rp.desc;
    o->commit_ms = now;
    ecs_objstore_commit(s->os, o);
    s->puts++;
    (void)ecs__pub_record(s, NULL, 0, o); /* sent, not awaited: a failure owes a re-sync */
  }
  ecs_meta_kick(s->meta);
  ecs__unlock(s);
}

/* One GET of m keys (m <= the holder's batch limit) on fd. */
static int get_some(ecs_server_t *s, int fd, pull_job_t *j, pull_key_t *k, size_t m, uint32_t req_id,
                    uint8_t *scratch, ecs_sum_t *sum, uint64_t deadline) {
  uint64_t cap = ecs_pool_size(s->pool); /* nothing larger could be stored here */
  ecs_wbuf_t b;
  ecs_wbuf_init(&b);
  for (size_t i = 0; i < m; i++) {
    ecs_get_item_t gi = {.key = k[i].key, .key_len = k[i].len, .capacity = cap};
    ecs_proto_get_item_write(&b, &gi);
  }
  ecs_hdr_t h;
  uint8_t *meta = NULL;
  int rc = call(fd, ECS_OP_GET, req_id, (uint32_t)m, &b, &h, &meta, deadline);
  ecs_wbuf_free(&b);
  uint64_t *sums = calloc(m, sizeof *sums);
  if (rc == ECS_OK && !sums)
    rc = ECS_ENOMEM;
  if (rc == ECS_OK && h.count != m)
    rc = ECS_EPROTO;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, rc == ECS_OK ? h.meta_len : 0);
  uint64_t left = rc == ECS_OK ? h.data_len : 0;
  for (size_t i = 0; i < m && rc == ECS_OK; i++) {
    if (ecs_proto_get_reply_read(&r, &k[i].rp) != ECS_OK) {
      rc = ECS_EPROTO; /* a record we cannot take: the data section's framing is lost */
      break;
    }
    if (k[i].rp.status == ECS_OK) {
      if (!reply_sane(&k[i].rp, cap, left))
        rc = ECS_EPROTO;
      left -= k[i].rp.nbytes;
    } else {
      k[i].status = k[i].rp.status < 0 ? k[i].rp.status : ECS_EPROTO;
      if (k[i].status == ECS_EBUFSMALL)
        k[i].status = ECS_ETOOBIG; /* larger than this pool */
    }
  }
  if (rc == ECS_OK && (r.pos != r.len || left != 0))
    rc = ECS_EPROTO;
  free(meta);
  if (rc == ECS_OK) {
    reserve_all(s, j, k, m);
    rc = receive_all(fd, k, m, scratch, sum, sums, deadline);
    settle_all(s, k, m, sums, rc);
  }
  free(sums);
  return rc;
}

/* Runs one fetch; every key's status is set. */
static void job_run(ecs_server_t *s, pull_worker_t *wk, pull_job_t *j, uint8_t *scratch, ecs_sum_t *sum) {
  struct ecs__pull *p = s->pull;
  int fd = -1;
  uint64_t now = ecs_now_ms();
  int rc = now < j->deadline_ms ? ECS_OK : ECS_ETIMEDOUT;
  if (rc == ECS_OK)
    rc = ecs_net_connect(j->host, j->port, (int)(j->deadline_ms - now), &fd);
  if (rc == ECS_OK) {
    pthread_mutex_lock(&p->qmu);
    wk->fd = fd;
    if (p->stop)
      rc = ECS_ECANCELED;
    pthread_mutex_unlock(&p->qmu);
  }
  uint32_t max_items = 0;
  if (rc == ECS_OK)
    rc = hello(s, fd, j, &max_items, j->deadline_ms);
  if (rc == ECS_OK && max_items == 0)
    rc = ECS_EPROTO;
  uint32_t req = 2;
  size_t i = 0; /* keys before i are settled; from i on, rc is theirs */
  while (rc == ECS_OK && i < j->n) {
    size_t m = j->n - i < max_items ? j->n - i : max_items;
    rc = get_some(s, fd, j, &j->keys[i], m, req++, scratch, sum, j->deadline_ms);
    if (rc == ECS_OK)
      i += m;
  }
  for (size_t k = i; rc != ECS_OK && k < j->n; k++)
    if (j->keys[k].status == ECS_OK)
      j->keys[k].status = rc;
  if (fd >= 0) {
    pthread_mutex_lock(&p->qmu);
    wk->fd = -1;
    pthread_mutex_unlock(&p->qmu);
    close(fd);
  }
  if (rc != ECS_OK && rc != ECS_ECANCELED)
    ECS_LOG_D("pull from %s (%s): %s", j->addr, j->node_id, ecs_strerror(rc));
}

/* Hands a fetch's outcome to its request (under the lock): the last one
 * builds the reply. */
static void job_settle(ecs_server_t *s, pull_job_t *j) {
  /* A key named twice: the first item fetched it, the later one found it
   * pending (its own block) and got ECS_EBUSY: it shares the first's fate. */
  for (uint32_t i = 1; i < j->n; i++)
    for (uint32_t e = 0; j->keys[i].status == ECS_EBUSY && e < i; e++)
      if (j->keys[e].len == j->keys[i].len && !memcmp(j->keys[e].key, j->keys[i].key, j->keys[i].len))
        j->keys[i].status = j->keys[e].status;
  ecs__lock(s);
  for (uint32_t i = 0; i < j->n; i++)
    j->w->status[j->keys[i].idx] = j->keys[i].status;
  ecs__pub_done(&j->w->items[j->keys[0].idx], ECS_OK);
  ecs__unlock(s);
  free(j->keys);
  free(j);
}

static void *worker_main(void *arg) {
  pull_worker_t *wk = arg;
  ecs_server_t *s = wk->s;
  struct ecs__pull *p = s->pull;
  uint8_t *scratch = malloc(ECS_SUM_SLICE);
  ecs_sum_t *sum = ecs_sum_new();
  pthread_mutex_lock(&p->qmu);
  for (;;) {
    while (!p->stop && !p->head)
      pthread_cond_wait(&p->qcv, &p->qmu);
    if (p->stop)
      break;
    pull_job_t *j = p->head;
    p->head = j->next;
    if (!p->head)
      p->tail = NULL;
    p->njobs--;
    pthread_mutex_unlock(&p->qmu);
    if (scratch && sum)
      job_run(s, wk, j, scratch, sum);
    else
      for (uint32_t i = 0; i < j->n; i++)
        j->keys[i].status = ECS_ENOMEM;
    job_settle(s, j);
    pthread_mutex_lock(&p->qmu);
  }
  pthread_mutex_unlock(&p->qmu);
  free(scratch);
  ecs_sum_free(sum);
  return NULL;
}

/* ---- the request ---- */

/* The job of holder node in jobs[0..*nj), or a new one (NULL: no memory). */
static pull_job_t *job_for(pull_job_t **jobs, size_t *nj, const ecs_meta_node_t *node) {
  for (size_t i = 0; i < *nj; i++)
    if (!strcmp(jobs[i]->node_id, node->node_id))
      return jobs[i];
  pull_job_t *j = calloc(1, sizeof *j);
  if (!j || ecs_net_parse_hostport(node->addr, j->host, sizeof j->host, &j->port) != ECS_OK) {
    free(j);
    return NULL;
  }
  snprintf(j->addr, sizeof j->addr, "%s", node->addr);
  snprintf(j->node_id, sizeof j->node_id, "%s", node->node_id);
  jobs[(*nj)++] = j;
  return j;
}

/* Room for one more key in j (grown by doubling: a request's items spread
 * over many holders cost what they name, not items x holders). */
static pull_key_t *job_key(pull_job_t *j) {
  if (j->n == j->cap) {
    uint32_t cap = j->cap ? j->cap * 2 : 4;
    pull_key_t *k = realloc(j->keys, (size_t)cap * sizeof *k);
    if (!k)
      return NULL;
    j->keys = k;
    j->cap = cap;
  }
  pull_key_t *k = &j->keys[j->n++];
  memset(k, 0, sizeof *k);
  return k;
}

/* Checks one item and adds it to its holder's job: returns 1 when it was
 * queued, else its status (ECS_OK: stored here already). */
static int item_take(ecs_server_t *s, conn_t *c, const ecs_pull_item_t *it, uint32_t idx, pull_job_t **jobs,
                     size_t *nj) {
  struct ecs__pull *p = s->pull;
  if (!(c->rights & ECS__RIGHT_READ))
    return ECS_EPERM; /* a pull answers whether a key exists, and stores it: read and write */
  if (it->addr_len == strlen(s->o.advertise) && !memcmp(it->addr, s->o.advertise, it->addr_len))
    return ECS_EINVAL; /* this server itself */
  const ecs_meta_node_t *node = reg_find(p, it->addr, it->addr_len);
  if (!node) { /* a server that joined since the last read is known within PULL_POKE_MS */
    pthread_mutex_lock(&p->qmu);
    p->poke = 1;
    pthread_cond_signal(&p->regcv);
    pthread_mutex_unlock(&p->qmu);
  }
  if (!node || !strcmp(node->node_id, s->o.node_id))
    return ECS_EPERM; /* not a registered server of this namespace: never dialled */
  ecs_obj_t *o = ecs_objstore_find(s->os, it->key, it->key_len);
  if (o && o->state == ECS_OBJ_COMMITTED)
    return ECS_OK; /* here already */
  pull_job_t *j = job_for(jobs, nj, node);
  pull_key_t *k = j ? job_key(j) : NULL;
  if (!k)
    return ECS_ENOMEM;
  uint64_t t = it->timeout_ms && it->timeout_ms < (uint32_t)s->o.pull_timeout_ms
                   ? it->timeout_ms
                   : (uint64_t)s->o.pull_timeout_ms;
  uint64_t deadline = ecs_now_ms() + t;
  if (j->n == 1 || deadline < j->deadline_ms)
    j->deadline_ms = deadline;
  k->idx = idx;
  k->len = it->key_len;
  memcpy(k->key, it->key, it->key_len);
  k->status = ECS_OK;
  return 1;
}

void ecs__handle_pull(ecs_server_t *s, conn_t *c) {
  struct ecs__pull *p = s->pull;
  uint32_t n = c->hdr.count;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  int *st = calloc(n ? n : 1, sizeof *st);
  pull_job_t **jobs = calloc(n ? n : 1, sizeof *jobs);
  size_t nj = 0;
  if (!st || !jobs) {
    free(st);
    free(jobs);
    ecs__reply_error(s, c, ECS_ENOMEM, 0);
    return;
  }
  ecs_pull_item_t *items = calloc(n ? n : 1, sizeof *items);
  for (uint32_t i = 0; items && i < n; i++) {
    st[i] = ecs_proto_pull_item_read(&r, &items[i]);
    if (st[i] == ECS_EPROTO || r.err != ECS_OK)
      break;
  }
  if (!items || r.err != ECS_OK || r.pos != r.len) {
    free(items);
    free(st);
    free(jobs);
    if (!items)
      ecs__reply_error(s, c, ECS_ENOMEM, 0);
    else
      ecs__reply_error(s, c, ECS_EPROTO, 1); /* the records do not fill the meta section */
    return;
  }
  if (!p || !p->nwk) {
    free(items);
    free(st);
    free(jobs);
    ecs__reply_error(s, c, ECS_ENOTSUP, 0); /* no Redis, or --pull-threads 0 */
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    if (st[i] == ECS_OK)
      st[i] = p->nodes_read ? item_take(s, c, &items[i], i, jobs, &nj) : ECS_EBUSY; /* just started: retry */
  free(items);
  pub_wait_t *w = nj ? ecs__pub_alloc(s, c, n) : NULL;
  pthread_mutex_lock(&p->qmu);
  for (size_t k = 0; k < nj; k++) {
    pull_job_t *j = jobs[k];
    if (j->n == 0) { /* its only key found no memory */
      free(j);
      continue;
    }
    if (!w || p->njobs >= PULL_MAX_JOBS) {
      for (uint32_t i = 0; i < j->n; i++)
        st[j->keys[i].idx] = w ? ECS_EBUSY : ECS_ENOMEM;
      free(j->keys);
      free(j);
      continue;
    }
    j->w = w;
    j->owner = c->tenant ? c->tenant->id : 0;
    j->next = NULL;
    if (p->tail)
      p->tail->next = j;
    else
      p->head = j;
    p->tail = j;
    p->njobs++;
    w->pending++;
  }
  pthread_cond_broadcast(&p->qcv);
  pthread_mutex_unlock(&p->qmu);
  free(jobs);
  if (w) {
    for (uint32_t i = 0; i < n; i++)
      w->status[i] = st[i] == 1 ? ECS_OK : st[i];
    if (w->pending == 0) {
      /* nothing queued after all: answer as below */
      ecs__pub_abandon(w);
      w = NULL;
    }
  }
  if (w && ecs__pub_end(s, c, w)) {
    free(st);
    return; /* parked until its holders answer */
  }
  ecs__reply_begin(c);
  for (uint32_t i = 0; i < n; i++)
    ecs_proto_status_write(&c->out, st[i] == 1 ? ECS_OK : st[i]);
  free(st);
  ecs__reply_finish(s, c, ECS_OK, n, 0);
}

/* ---- life cycle ---- */

void ecs__pull_start(ecs_server_t *s) {
  if (!s->meta || s->o.pull_threads <= 0)
    return; /* no registry to check addresses against: PULL is refused */
  struct ecs__pull *p = calloc(1, sizeof *p);
  if (!p)
    goto fail;
  pthread_mutex_init(&p->qmu, NULL);
  pthread_cond_init(&p->qcv, NULL);
  pthread_cond_init(&p->regcv, NULL);
  s->pull = p;
  ecs_meta_opts_t mo;
  ecs_meta_opts_init(&mo);
  mo.redis_url = s->o.redis_url;
  mo.ns = s->o.ns;
  mo.timeout_ms = s->o.redis_timeout_ms;
  mo.no_marks = 1; /* addresses only: clients' suspicion marks are not the pull's concern */
  if (ecs_meta_open(&mo, &p->meta) != ECS_OK)
    goto fail;
  p->wk = calloc((size_t)s->o.pull_threads, sizeof *p->wk);
  if (!p->wk)
    goto fail;
  if (pthread_create(&p->reg_th, NULL, reg_main, s) != 0)
    goto fail;
  p->reg_started = 1;
  for (int i = 0; i < s->o.pull_threads; i++) {
    p->wk[i].s = s;
    p->wk[i].fd = -1;
    if (pthread_create(&p->wk[i].th, NULL, worker_main, &p->wk[i]) != 0)
      break;
    p->wk[i].started = 1;
    p->nwk++;
  }
  if (p->nwk == 0)
    goto fail;
  return;
fail:
  ECS_LOG_W("pull: cannot start its threads; PULL requests are refused");
  ecs__pull_stop(s);
}

void ecs__pull_stop(ecs_server_t *s) {
  struct ecs__pull *p = s->pull;
  if (!p)
    return;
  pthread_mutex_lock(&p->qmu);
  p->stop = 1;
  for (unsigned i = 0; i < p->nwk; i++)
    if (p->wk[i].fd >= 0)
      shutdown(p->wk[i].fd, SHUT_RDWR); /* a fetch under way ends now, not at its deadline */
  pthread_cond_broadcast(&p->qcv);
  pthread_cond_signal(&p->regcv);
  pthread_mutex_unlock(&p->qmu);
  for (unsigned i = 0; p->wk && i < (unsigned)s->o.pull_threads; i++)
    if (p->wk[i].started)
      pthread_join(p->wk[i].th, NULL);
  if (p->reg_started)
    pthread_join(p->reg_th, NULL);
  pull_job_t *j = p->head; /* queued, never run: their requests get ECS_ECANCELED */
  p->head = p->tail = NULL;
  while (j) {
    pull_job_t *next = j->next;
    for (uint32_t i = 0; i < j->n; i++)
      j->keys[i].status = ECS_ECANCELED;
    job_settle(s, j);
    j = next;
  }
  s->pull = NULL;
  ecs_meta_close(p->meta);
  free(p->nodes);
  free(p->wk);
  pthread_cond_destroy(&p->qcv);
  pthread_cond_destroy(&p->regcv);
  pthread_mutex_destroy(&p->qmu);
  free(p);
}
