/*
 * The client's shared-memory data path (a server on this host).
 *
 * Discovery: a TCP HELLO names the server's Unix socket and issues a
 * one-time upgrade secret.  The client checks who holds the socket
 * (SO_PEERCRED), then proves it knows the secret by challenge-response
 * (UPGRADE: the server's nonce, HMAC-SHA256 under the secret): the auth
 * token is never sent there, and a recorded proof is worth nothing.  Only
 * when the answer names the same node and epoch is it the same server.
 * ATTACH then hands over the pool's memfd (SCM_RIGHTS), which the client
 * maps: read-only unless it will put and its uid may write
 * (--shm-write-uid); a uid that may not map at all (not in
 * --shm-allow-uid) stays on the socket and copies, as over TCP.
 *
 * get:  LEASE pins the objects and says where they lie; the client copies
 *       them into the caller's buffers (or hands out views, no copy at all)
 *       and RELEASEs the pins with a one-way message.
 * put:  RESERVE allocates blocks; the client copies the bytes in place;
 *       COMMIT has the server verify the checksum, index and publish them.
 *
 * Every length the server sends is checked against the mapping before the
 * client touches memory through it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "store/core/checksum.h"
#include "store/client/client_priv.h"
#include "store/core/copy.h"
#include "store/core/sha256.h"

static const ecs_cli_ops_t shm_ro_ops;
static const ecs_cli_ops_t unix_copy_ops;
_Static_assert(sizeof(((ecs_cli_srv_t *)0)->up_secret) == ECS_UPGRADE_SECRET_SIZE, "the upgrade secret");

void ecs__shm_map_put(ecs_shm_map_t *m) {
  if (m && m->retired && m->views == 0) {
    munmap(m->base, m->len);
    free(m);
  }
}

/* ATTACH on fd: receive the pool's descriptor and map it. */
static int attach(ecs_client_t *c, ecs_cli_srv_t *u, int want_write, uint64_t deadline, ecs_shm_map_t **out) {
  *out = NULL;
  ecs_wbuf_reset(&c->w);
  ecs_wbuf_u32(&c->w, want_write ? ECS_ATTACH_WRITE : 0);
  uint32_t id;
  int rc = ecs__cli_send(c, u, ECS_OP_ATTACH, 0, 0, NULL, 0, 0, &id, deadline);
  if (rc)
    return rc;
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  int pfd = -1;
  rc = ecs_net_read_all_fd(u->fd, hb, sizeof hb, deadline, &pfd);
  if (rc)
    return rc;
  ecs_hdr_t h;
  rc = ecs_proto_hdr_decode(hb, 0, &h);
  uint8_t meta[64];
  if (rc == ECS_OK && (!(h.flags & ECS_FLAG_REPLY) || h.opcode != ECS_OP_ATTACH || h.req_id != id ||
                       h.meta_len > sizeof meta))
    rc = ECS_EPROTO;
  if (rc == ECS_OK)
    rc = ecs_net_read_all(u->fd, meta, h.meta_len, deadline);
  if (rc == ECS_OK && h.status != ECS_OK)
    rc = h.status;
  ecs_attach_reply_t ar;
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, meta, h.meta_len);
    rc = ecs_proto_attach_reply_read(&r, &ar);
  }
  if (rc == ECS_OK && (pfd < 0 || ar.pool_size == 0 || (ar.pool_size >> 62) != 0 ||
                       ((ar.flags & ECS_ATTACH_WRITE) && !want_write)))
    rc = ECS_EPROTO;
  ecs_shm_map_t *m = NULL;
  if (rc == ECS_OK) {
    m = calloc(1, sizeof *m);
    int writable = (ar.flags & ECS_ATTACH_WRITE) != 0;
    void *base = MAP_FAILED;
    if (!m)
      rc = ECS_ENOMEM;
    else
      base = mmap(NULL, (size_t)ar.pool_size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, pfd, 0);
    if (m && base == MAP_FAILED) {
      rc = ecs_from_errno(errno);
      free(m);
      m = NULL;
    } else if (m) {
      m->base = base;
      m->len = (size_t)ar.pool_size;
      m->writable = writable;
    }
  }
  if (pfd >= 0)
    close(pfd); /* the mapping keeps the pages */
  *out = m;
  return rc;
}

/* Whether uid may own the shm socket: root, this process's own user, or
 * the one the config names.  Anyone else listening at the advertised path
 * is a squatter (a server's socket removed and taken over): it could
 * serve us anything.  (It would not learn our token: that never goes on
 * the socket.) */
static int trusted_uid(const ecs_client_t *c, unsigned uid) {
  return uid == 0 || uid == (unsigned)geteuid() ||
         (c->cfg.shm_server_uid >= 0 && uid == (unsigned)c->cfg.shm_server_uid);
}

/* UPGRADE on u: ask for the server's nonce, answer HMAC-SHA256(secret,
 * nonce) under the secret s's TCP HELLO issued, and take the HELLO reply
 * that comes back (node and epoch, into u).  The secret is spent either
 * way. */
static int upgrade_prove(ecs_client_t *c, ecs_cli_srv_t *s, ecs_cli_srv_t *u, uint64_t deadline) {
  if (!s->up_id) {
    ecs__cli_err(c,
                 "%s issued no shm upgrade secret in its HELLO (it issues one only to a client on its own "
                 "host, by the address it sees: not a client in another network namespace)",
                 s->addr);
    return ECS_ENOTSUP;
  }
  ecs_upgrade_t up = {.phase = ECS_UPGRADE_CHALLENGE};
  ecs_wbuf_reset(&c->w);
  ecs_proto_upgrade_write(&c->w, &up);
  ecs_hdr_t h;
  int rc = ecs__cli_call(c, u, ECS_OP_UPGRADE, 0, NULL, 0, 0, 0, "shm upgrade", &h, deadline);
  if (rc == ECS_OK && h.meta_len != ECS_UPGRADE_NONCE_SIZE)
    rc = ECS_EPROTO;
  if (rc == ECS_OK) {
    up.phase = ECS_UPGRADE_PROVE;
    up.upgrade_id = s->up_id;
    ecs__hmac_sha256(s->up_secret, sizeof s->up_secret, c->rmeta, ECS_UPGRADE_NONCE_SIZE, up.mac);
    ecs_wbuf_reset(&c->w);
    ecs_proto_upgrade_write(&c->w, &up);
    memset(&up, 0, sizeof up);
    rc = ecs__cli_call(c, u, ECS_OP_UPGRADE, 0, NULL, 0, 0, 0, "shm upgrade", &h, deadline);
  }
  s->up_id = 0;
  memset(s->up_secret, 0, sizeof s->up_secret);
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_hello_reply_t hr;
    ecs_rbuf_init(&r, c->rmeta, h.meta_len);
    rc = ecs_proto_hello_reply_read(&r, &hr);
    snprintf(u->node_id, sizeof u->node_id, "%s", hr.node_id);
    u->epoch = hr.epoch;
  }
  return rc;
}

/* shm when the server is on this host: its Unix socket is held by a
 * trusted uid (checked before a byte is sent there) and answers as the
 * same node and epoch.  In auto mode the Unix path is tried only for a
 * server whose address is on this host: a remote server's advertised
 * path names nothing of its own here. */
static int shm_upgrade(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline) {
  if (!s->shm_path[0]) {
    ecs__cli_err(c, "%s has shared memory turned off", s->addr);
    return ECS_ENOTSUP;
  }
  if (c->fallback != ECS_FALLBACK_NONE && !ecs_net_peer_is_local(s->fd)) {
    ecs__cli_err(c, "%s is not on this host", s->addr);
    return ECS_ENOTSUP;
  }
  ecs_cli_srv_t u = *s; /* the Unix-socket side, checked before it replaces s */
  u.map = NULL;
  int rc = ecs_net_connect_unix(s->shm_path, deadline, &u.fd);
  if (rc) {
    ecs__cli_err(c, "%s: cannot open its shm socket %s (not on this host?)", s->addr, s->shm_path);
    return rc;
  }
  unsigned uid = 0;
  if (ecs_net_peer_uid(u.fd, &uid) != ECS_OK || !trusted_uid(c, uid)) {
    ecs__cli_err(c,
                 "%s: the shm socket %s is held by uid %u, not by root or uid %u (set shm_server_uid "
                 "to trust the server's user); nothing was sent to it",
                 s->addr, s->shm_path, uid, (unsigned)geteuid());
    close(u.fd);
    return ECS_ENOTSUP;
  }
  rc = upgrade_prove(c, s, &u, deadline);
  if (rc == ECS_ECONN && !c->errmsg[0])
    ecs__cli_err(c, "%s closed its shm socket %s at once (at --max-conns?)", s->addr, s->shm_path);
  if (rc == ECS_OK && (strcmp(u.node_id, s->node_id) != 0 || u.epoch != s->epoch)) {
    ecs__cli_err(c, "%s: the socket %s belongs to another server (node %s)", s->addr, s->shm_path, u.node_id);
    rc = ECS_ENOTSUP;
  }
  /* Writable if we put and our uid may write; else read-only (puts by
   * copy); else, a uid that may not map at all, copies both ways. */
  ecs_shm_map_t *m = NULL;
  int want_write = !c->cfg.shm_read_only, copy_only = 0;
  if (rc == ECS_OK) {
    rc = attach(c, &u, want_write, deadline, &m);
    if (rc == ECS_EAUTH && want_write)
      rc = attach(c, &u, 0, deadline, &m);
    copy_only = rc == ECS_EAUTH; /* refused a map, not the connection */
    if (copy_only)
      rc = ECS_OK;
  }
  if (rc) {
    if (!c->errmsg[0])
      ecs__cli_err(c, "%s: shm attach failed: %s", s->addr, ecs_strerror(rc));
    close(u.fd);
    return rc;
  }
  close(s->fd); /* the TCP connection is no longer needed */
  s->fd = u.fd;
  s->ops = copy_only ? &unix_copy_ops : m->writable ? &ecs__cli_shm_ops : &shm_ro_ops;
  s->map = m;
  return ECS_OK;
}

/* A lease record the mapping can honour. */
static int lease_in_bounds(const ecs_shm_map_t *map, const ecs_lease_reply_t *l) {
  return l->off <= map->len && l->nbytes <= map->len - l->off;
}

static int shm_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                   const size_t *idx, size_t m, int alloc, uint64_t deadline) {
  ecs_hdr_t h;
  int rc = ecs__cli_lease(c, s, keys, idx, m, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  uint64_t *ids = malloc((m ? m : 1) * sizeof *ids);
  if (!ids)
    return ecs__cli_fail(c, s, ECS_ENOMEM); /* closing drops the pins */
  size_t nids = 0;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  const uint8_t *base = s->map->base;
  for (size_t j = 0; j < m && rc == ECS_OK; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    ecs_lease_reply_t l;
    if (ecs_proto_lease_reply_read(&r, &l) != ECS_OK ||
        (l.status == ECS_OK && !lease_in_bounds(s->map, &l))) {
      rc = ECS_EPROTO;
      break;
    }
    b->status = l.status;
    b->nbytes = l.nbytes;
    b->desc = l.desc;
    if (l.status != ECS_OK)
      continue;
    ids[nids++] = l.lease_id;
    if (l.codec == ECS_CODEC_NONE && !alloc && l.nbytes <= b->capacity && (b->data || !l.nbytes)) {
      /* raw: copy and verify in one pass (store/core/copy.h) */
      if (c->cfg.verify_checksum) {
        if (ecs__copy_hash(b->data, base + l.off, (size_t)l.nbytes) != l.checksum) {
          b->status = ECS_ECHECKSUM;
          b->nbytes = 0;
        }
      } else if (l.nbytes) {
        memcpy(b->data, base + l.off, (size_t)l.nbytes);
      }
      continue;
    }
    b->status = ecs__cli_deliver(c, b, base + l.off, l.codec, l.nbytes, l.raw_nbytes, l.checksum, alloc);
    if (b->status == ECS_ECHECKSUM || b->status == ECS_ECODEC || b->status == ECS_ENOMEM)
      b->nbytes = 0;
  }
  if (rc) {
    free(ids);
    return ecs__cli_fail(c, s, rc);
  }
  ecs__cli_release(c, s, ids, nids, deadline);
  free(ids);
  return ECS_OK;
}

/* The shm writer: memcpy into the shared map, bounds-checked. */
static int shm_write(ecs_client_t *c, ecs_cli_srv_t *s, ecs_cli_wr_t *w, size_t n, uint64_t deadline) {
  (void)c;
  (void)deadline;
  for (size_t k = 0; k < n; k++)
    if (w[k].off > s->map->len || w[k].src->nbytes > s->map->len - w[k].off)
      return ECS_EPROTO;
  for (size_t k = 0; k < n; k++) {
    if (w[k].src->nbytes)
      memcpy(s->map->base + w[k].off, w[k].src->data, (size_t)w[k].src->nbytes);
    w[k].status = ECS_OK;
  }
  return ECS_OK;
}

static int shm_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                   const size_t *idx, size_t m, int *status, uint64_t deadline) {
  return ecs__cli_put_inplace(c, s, keys, ts, idx, m, status, deadline, shm_write);
}

/* ------------------------------------------------------------------ */
/* views                                                                */

static int shm_view(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_view_t *views,
                    const size_t *idx, size_t m, uint64_t deadline) {
  size_t si = (size_t)(s - c->srv);
  ecs_hdr_t h;
  int rc = ecs__cli_lease(c, s, keys, idx, m, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  uint64_t *drop = malloc((m ? m : 1) * sizeof *drop);
  if (!drop)
    return ecs__cli_fail(c, s, ECS_ENOMEM);
  size_t ndrop = 0;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  for (size_t j = 0; j < m; j++) {
    ecs_view_t *v = &views[idx[j]];
    ecs_lease_reply_t l;
    if (ecs_proto_lease_reply_read(&r, &l) != ECS_OK ||
        (l.status == ECS_OK && !lease_in_bounds(s->map, &l))) {
      /* the connection goes, and every pin of this batch with it */
      for (size_t k = 0; k < j; k++)
        if (views[idx[k]].status == ECS_OK) {
          s->map->views--;
          memset(&views[idx[k]], 0, sizeof(ecs_view_t));
          views[idx[k]].status = ECS_EPROTO;
        }
      free(drop);
      return ecs__cli_fail(c, s, ECS_EPROTO);
    }
    v->status = l.status;
    v->nbytes = l.nbytes;
    v->desc = l.desc;
    if (l.status != ECS_OK)
      continue;
    const uint8_t *p = s->map->base + l.off;
    if (l.codec != ECS_CODEC_NONE)
      v->status = ECS_ENOTSUP; /* a compressed object has no raw view */
    else if (c->cfg.verify_checksum && ecs_checksum(p, (size_t)l.nbytes) != l.checksum)
      v->status = ECS_ECHECKSUM;
    if (v->status != ECS_OK) {
      drop[ndrop++] = l.lease_id;
      v->nbytes = 0;
      continue;
    }
    v->data = p;
    v->lease_ = l.lease_id;
    v->map_ = s->map;
    v->srv_ = (uint32_t)si;
    s->map->views++;
  }
  ecs__cli_release(c, s, drop, ndrop, deadline);
  free(drop);
  return ECS_OK;
}

int ecs_view_release(ecs_client_t *c, ecs_view_t *views, size_t n) {
  if (!c || (n && !views))
    return ECS_EINVAL;
  uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids)
    return ECS_ENOMEM;
  uint64_t deadline = ecs__cli_deadline(c);
  for (size_t si = 0; si < c->nsrv; si++) {
    ecs_cli_srv_t *s = &c->srv[si];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      ecs_view_t *v = &views[i];
      if (v->status != ECS_OK || !v->map_ || v->srv_ != si)
        continue;
      ecs_shm_map_t *m = v->map_;
      if (m == s->map && s->fd >= 0)
        ids[k++] = v->lease_; /* pins of an older connection died with it */
      m->views--;
      ecs__shm_map_put(m);
      memset(v, 0, sizeof *v);
      v->status = ECS_ENOTFOUND;
    }
    if (k)
      ecs__cli_release(c, s, ids, k, deadline);
  }
  free(ids);
  return ECS_OK;
}

/* The mapping goes when the connection does; views still out keep it
 * until they are released. */
static void shm_drop(ecs_cli_srv_t *s) {
  if (s->map) {
    s->map->retired = 1;
    ecs__shm_map_put(s->map);
    s->map = NULL;
  }
}

const ecs_cli_ops_t ecs__cli_shm_ops = {
    .name = "shm",
    .upgrade = shm_upgrade,
    .put = shm_put,
    .get = shm_get,
    .view = shm_view,
    .drop = shm_drop,
};

/* A uid the server will not let map its pool (not in --shm-allow-uid):
 * the TCP path's requests over the Unix socket, copies both ways, no
 * views.  Wrappers, because the TCP table's entries are not constants
 * this file's initializer may use. */
static int unix_put(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                    const size_t *idx, size_t m, int *status, uint64_t deadline) {
  return ecs__cli_tcp_ops.put(c, s, keys, ts, idx, m, status, deadline);
}

static int unix_get(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                    const size_t *idx, size_t m, int alloc, uint64_t deadline) {
  return ecs__cli_tcp_ops.get(c, s, keys, bufs, idx, m, alloc, deadline);
}

static const ecs_cli_ops_t unix_copy_ops = {
    .name = "unix",
    .upgrade = shm_upgrade,
    .put = unix_put,
    .get = unix_get,
    .view = NULL,
    .drop = NULL,
};

/* A read-only mapping (shm_read_only, or a uid the server lets map its
 * pool but not write it): gets and views in place, puts over the Unix
 * socket. */
static const ecs_cli_ops_t shm_ro_ops = {
    .name = "shm",
    .upgrade = shm_upgrade,
    .put = ecs__tcp_put,
    .get = shm_get,
    .view = shm_view,
    .drop = shm_drop,
};
