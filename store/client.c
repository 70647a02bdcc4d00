/*
 * libecstore client over TCP; see include/ecstore/ecstore.h.
 *
 * A call splits its batch by server (key hash), and for each server sends
 * one request and reads one reply.  GET replies are read in two steps: the
 * header and the item records first, then the payload with one readv whose
 * iovecs point straight into the caller's buffers, so no payload byte is
 * copied in user space.  Every socket wait is bounded by the call's
 * deadline; a connection that timed out or broke mid-reply is closed (its
 * stream position is unknown) and re-opened by the next call.
 */
#include "ecstore/ecstore.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <xxhash.h>

#include "store/checksum.h"
#include "store/client_internal.h"
#include "store/client_priv.h"
#include "store/codec.h"
#include "store/meta.h"
#include "store/net.h"
#include "store/proto.h"

typedef ecs_cli_srv_t srv_t;

void ecs__cli_err(ecs_client_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
  va_end(ap);
}

const char *ecs_client_errmsg(const ecs_client_t *c) {
  return c ? c->errmsg : "";
}

void ecs_client_config_init(ecs_client_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->servers = "127.0.0.1:7700";
  cfg->ns = "default";
  cfg->connect_timeout_ms = 2000;
  cfg->timeout_ms = 10000;
  cfg->verify_checksum = 1;
}

void ecs_free(void *p) {
  free(p);
}

void ecs__cli_drop(srv_t *s) {
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
  s->path = ECS_PATH_TCP;
  ecs__rdma_drop(s);
  if (s->map) {
    s->map->retired = 1;
    ecs__shm_map_put(s->map);
    s->map = NULL;
  }
}

/* ------------------------------------------------------------------ */
/* one request / reply                                                  */

/* Sends header + c->w records + data iovecs. */
int ecs__cli_send(ecs_client_t *c, srv_t *s, uint8_t op, uint16_t flags, uint32_t count,
                  const struct iovec *data, int ndata, uint64_t data_len, uint32_t *req_id,
                  uint64_t deadline) {
  if (c->w.err)
    return c->w.err;
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = op,
                 .flags = flags,
                 .req_id = ++c->next_req,
                 .count = count,
                 .meta_len = (uint32_t)c->w.len,
                 .data_len = data_len};
  *req_id = h.req_id;
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, hb);
  struct iovec iov[2 + ECS_CLI_IOV_CHUNK];
  iov[0].iov_base = hb;
  iov[0].iov_len = sizeof hb;
  iov[1].iov_base = c->w.p;
  iov[1].iov_len = c->w.len;
  int cnt = 2;
  int i = 0;
  /* header, records and the first data chunk in one sendmsg; then the rest */
  for (; i < ndata && cnt < 2 + ECS_CLI_IOV_CHUNK; i++)
    iov[cnt++] = data[i];
  int rc = ecs_net_writev_all(s->fd, iov, cnt, deadline);
  while (rc == ECS_OK && i < ndata) {
    cnt = 0;
    for (; i < ndata && cnt < ECS_CLI_IOV_CHUNK; i++)
      iov[cnt++] = data[i];
    rc = ecs_net_writev_all(s->fd, iov, cnt, deadline);
  }
  return rc;
}

/* Reads a reply header and its records into c->rmeta. */
int ecs__cli_recv(ecs_client_t *c, srv_t *s, uint8_t op, uint32_t req_id, ecs_hdr_t *h, uint64_t deadline) {
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  int rc = ecs_net_read_all(s->fd, hb, sizeof hb, deadline);
  if (rc)
    return rc;
  rc = ecs_proto_hdr_decode(hb, UINT64_MAX, h);
  if (rc || !(h->flags & ECS_FLAG_REPLY) || h->opcode != op || h->req_id != req_id) {
    ecs__cli_err(c, "%s: malformed reply", s->addr);
    return ECS_EPROTO;
  }
  if (h->meta_len > c->rmeta_cap) {
    uint8_t *m = realloc(c->rmeta, h->meta_len);
    if (!m)
      return ECS_ENOMEM;
    c->rmeta = m;
    c->rmeta_cap = h->meta_len;
  }
  return ecs_net_read_all(s->fd, c->rmeta, h->meta_len, deadline);
}

int ecs__cli_hello(ecs_client_t *c, srv_t *s, uint64_t deadline) {
  ecs_hello_t hl = {.token = (const uint8_t *)c->token_s,
                    .token_len = (uint16_t)(c->token_s ? strlen(c->token_s) : 0),
                    .ns = (const uint8_t *)c->ns_s,
                    .ns_len = (uint16_t)strlen(c->ns_s)};
  ecs_wbuf_reset(&c->w);
  ecs_proto_hello_write(&c->w, &hl);
  uint32_t id;
  int rc = ecs__cli_send(c, s, ECS_OP_HELLO, 0, 0, NULL, 0, 0, &id, deadline);
  ecs_hdr_t h;
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, ECS_OP_HELLO, id, &h, deadline);
  if (rc == ECS_OK && h.status != ECS_OK) {
    rc = h.status;
    if (rc == ECS_EINVAL)
      ecs__cli_err(c, "%s refused the namespace '%s' (it serves another one)", s->addr, c->ns_s);
    else if (rc == ECS_EAUTH)
      ecs__cli_err(c, "%s refused the auth token", s->addr);
    else
      ecs__cli_err(c, "%s refused HELLO: %s", s->addr, ecs_strerror(rc));
    return rc;
  }
  if (rc == ECS_OK) {
    ecs_rbuf_t r;
    ecs_hello_reply_t hr;
    ecs_rbuf_init(&r, c->rmeta, h.meta_len);
    rc = ecs_proto_hello_reply_read(&r, &hr);
    if (rc == ECS_OK) {
      snprintf(s->node_id, sizeof s->node_id, "%s", hr.node_id);
      s->epoch = hr.epoch;
      s->max_data = hr.max_data;
      snprintf(s->shm_path, sizeof s->shm_path, "%s", hr.shm_path);
    }
  }
  return rc;
}

/* Why a connection could not be made, in the words a user acts on: the
 * system's reason ("connection refused") and what it usually means. */
static void connect_err(ecs_client_t *c, const srv_t *s, int rc, int to_ms) {
  if (rc == ECS_ETIMEDOUT) {
    ecs__cli_err(c, "cannot connect to %s: no answer within %d ms", s->addr, to_ms);
    return;
  }
  int e = errno;
  char why[96];
  snprintf(why, sizeof why, "%s", e == EHOSTUNREACH ? "host unreachable or name not resolved" : strerror(e));
  why[0] = (char)tolower((unsigned char)why[0]);
  ecs__cli_err(c, "cannot connect to %s: %s%s", s->addr, why,
               e == ECONNREFUSED ? " (is ecstore-server running there?)" : "");
}

/* Makes sure server s is connected and greeted. */
int ecs__cli_ensure(ecs_client_t *c, srv_t *s, uint64_t deadline) {
  if (s->fd >= 0)
    return ECS_OK;
  uint64_t now = ecs_now_ms();
  int left = now >= deadline ? 0 : (int)((deadline - now) > INT_MAX ? INT_MAX : deadline - now);
  if (left == 0)
    return ECS_ETIMEDOUT;
  int to = c->cfg.connect_timeout_ms < left ? c->cfg.connect_timeout_ms : left;
  int rc = ecs_net_connect(s->host, s->port, to, &s->fd);
  if (rc) {
    s->fd = -1;
    connect_err(c, s, rc, to);
    return rc;
  }
  rc = ecs__cli_hello(c, s, deadline);
  if (rc) {
    if (!c->errmsg[0])
      ecs__cli_err(c, "%s: HELLO failed: %s", s->addr, ecs_strerror(rc));
    ecs__cli_drop(s);
    return rc;
  }
  if (c->want == ECS_WANT_TCP)
    return ECS_OK;
  if (c->want == ECS_WANT_RDMA) {
    rc = ecs__rdma_upgrade(c, s, deadline);
    if (rc != ECS_OK && s->fd >= 0)
      fprintf(stderr, "ecstore: %s; using tcp\n", c->errmsg);
    c->errmsg[0] = '\0';
    return s->fd >= 0 ? ECS_OK : (rc ? rc : ECS_ECONN);
  }
  /* shm when the server is on this host: its Unix socket answers as the
   * same node and epoch */
  if (!s->shm_path[0]) {
    rc = ECS_ENOTSUP;
    ecs__cli_err(c, "%s has shared memory turned off", s->addr);
  } else {
    rc = ecs__shm_upgrade(c, s, deadline);
  }
  if (rc != ECS_OK && c->want == ECS_WANT_SHM) {
    ecs__cli_drop(s);
    return rc;
  }
  c->errmsg[0] = '\0'; /* auto: TCP it is */
  return ECS_OK;
}

/* After a whole-request failure the stream position is unknown: drop. */
int ecs__cli_fail(ecs_client_t *c, srv_t *s, int rc) {
  if (!c->errmsg[0] || rc == ECS_ETIMEDOUT)
    ecs__cli_err(c, "%s: %s", s->addr, ecs_strerror(rc));
  ecs__cli_drop(s);
  return rc;
}

/* ------------------------------------------------------------------ */
/* connect / close                                                      */

static int parse_servers(ecs_client_t *c, char *errbuf, size_t errlen) {
  char *save = NULL;
  for (char *tok = strtok_r(c->servers_s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ')
      tok++;
    if (!*tok)
      continue;
    if (c->nsrv == ECS_CLI_MAX_SERVERS) {
      snprintf(errbuf, errlen, "too many servers (at most %d)", ECS_CLI_MAX_SERVERS);
      return ECS_EINVAL;
    }
    srv_t *s = &c->srv[c->nsrv];
    if (ecs_net_parse_hostport(tok, s->host, sizeof s->host, &s->port) || s->port == 0) {
      snprintf(errbuf, errlen, "bad server address '%s' (expected HOST:PORT)", tok);
      return ECS_EINVAL;
    }
    snprintf(s->addr, sizeof s->addr, "%s", tok);
    s->fd = -1;
    s->cli = c;
    c->nsrv++;
  }
  if (c->nsrv == 0) {
    snprintf(errbuf, errlen, "no server address given");
    return ECS_EINVAL;
  }
  return ECS_OK;
}

int ecs_client_connect(const ecs_client_config_t *cfg, ecs_client_t **out, char *errbuf, size_t errlen) {
  char dummy[8];
  if (!errbuf) {
    errbuf = dummy;
    errlen = sizeof dummy;
  }
  errbuf[0] = '\0';
  *out = NULL;
  ecs_client_config_t def;
  ecs_client_config_init(&def);
  if (!cfg)
    cfg = &def;
  ecs_client_t *c = calloc(1, sizeof *c);
  if (!c)
    return ECS_ENOMEM;
  c->cfg = *cfg;
  if (c->cfg.connect_timeout_ms <= 0)
    c->cfg.connect_timeout_ms = def.connect_timeout_ms;
  if (c->cfg.timeout_ms <= 0)
    c->cfg.timeout_ms = def.timeout_ms;
  c->servers_s = strdup(cfg->servers ? cfg->servers : def.servers);
  c->ns_s = strdup(cfg->ns && *cfg->ns ? cfg->ns : def.ns);
  c->redis_s = cfg->redis_url && *cfg->redis_url ? strdup(cfg->redis_url) : NULL;
  c->token_s = cfg->auth_token && *cfg->auth_token ? strdup(cfg->auth_token) : NULL;
  ecs_wbuf_init(&c->w);
  int rc = ECS_ENOMEM;
  if (!c->servers_s || !c->ns_s || (cfg->redis_url && *cfg->redis_url && !c->redis_s) ||
      (cfg->auth_token && *cfg->auth_token && !c->token_s))
    goto fail;
  rc = ECS_EINVAL;
  if (strlen(c->ns_s) > ECS_PROTO_MAX_NS) {
    snprintf(errbuf, errlen, "namespace longer than %d bytes", ECS_PROTO_MAX_NS);
    goto fail;
  }
  if (c->token_s && strlen(c->token_s) > ECS_PROTO_MAX_TOKEN) {
    snprintf(errbuf, errlen, "auth token longer than %d bytes", ECS_PROTO_MAX_TOKEN);
    goto fail;
  }
  rc = parse_servers(c, errbuf, errlen);
  if (rc)
    goto fail;
  const char *tr = c->cfg.transport && *c->cfg.transport ? c->cfg.transport : "auto";
  if (!strcmp(tr, "auto")) {
    c->want = ECS_WANT_AUTO;
  } else if (!strcmp(tr, "tcp")) {
    c->want = ECS_WANT_TCP;
  } else if (!strcmp(tr, "shm")) {
    c->want = ECS_WANT_SHM;
  } else if (!strcmp(tr, "rdma")) {
    /* Without a device: one line, then tcp: asking for rdma where there is
     * none is a deployment choice, not a reason to refuse to connect. */
    char rerr[256] = "";
    c->want = ECS_WANT_RDMA;
    if (ecs__rdma_client_open(c, rerr, sizeof rerr) != ECS_OK) {
      fprintf(stderr, "ecstore: %s; using tcp\n", rerr[0] ? rerr : "rdma: unavailable");
      c->want = ECS_WANT_TCP;
    }
  } else {
    snprintf(errbuf, errlen, "unknown transport '%s' (expected auto, tcp, shm or rdma)", tr);
    rc = ECS_EINVAL;
    goto fail;
  }
  if (c->cfg.compression && *c->cfg.compression && ecs_codec_parse(c->cfg.compression, &c->codec) != ECS_OK) {
    snprintf(errbuf, errlen, "unknown compression '%s' (expected none, lz4, zstd or auto)",
             c->cfg.compression);
    rc = ECS_EINVAL;
    goto fail;
  }
  uint64_t deadline = ecs_now_ms() + (uint64_t)c->cfg.connect_timeout_ms + (uint64_t)c->cfg.timeout_ms;
  for (size_t i = 0; i < c->nsrv; i++) {
    rc = ecs__cli_ensure(c, &c->srv[i], deadline);
    if (rc) {
      snprintf(errbuf, errlen, "%s", c->errmsg);
      goto fail;
    }
  }
  if (c->redis_s) {
    ecs_meta_opts_t mo;
    ecs_meta_opts_init(&mo);
    mo.redis_url = c->redis_s;
    mo.ns = c->ns_s;
    mo.timeout_ms = c->cfg.timeout_ms < 2000 ? c->cfg.timeout_ms : 2000;
    rc = ecs_meta_open(&mo, &c->meta);
    if (rc) {
      snprintf(errbuf, errlen, "bad Redis URL '%s'", c->redis_s);
      goto fail;
    }
    /* A Redis that is down is not a reason to refuse: puts and gets go to
     * the servers, which keep serving without it; exists falls back to
     * asking the servers, and the handle reconnects on the next call. */
  }
  c->errmsg[0] = '\0';
  *out = c;
  return ECS_OK;
fail:
  ecs_client_close(c);
  return rc;
}

void ecs_client_close(ecs_client_t *c) {
  if (!c)
    return;
  for (size_t i = 0; i < c->nsrv; i++)
    ecs__cli_drop(&c->srv[i]);
  ecs_meta_close(c->meta);
  ecs__rdma_client_close(c);
  ecs_wbuf_free(&c->w);
  free(c->rmeta);
  free(c->servers_s);
  free(c->redis_s);
  free(c->ns_s);
  free(c->token_s);
  free(c);
}

size_t ecs_client_server_count(const ecs_client_t *c) {
  return c->nsrv;
}

/* The server an object lives on. */
size_t ecs__cli_route(const ecs_client_t *c, const ecs_key_t *k) {
  if (c->nsrv == 1)
    return 0;
  return (size_t)(XXH3_64bits(k->data, k->len) % c->nsrv);
}

/* Items of a batch that go to server si, as indices into the caller's
 * arrays.  idx must hold n entries. */
static size_t pick(const ecs_client_t *c, const ecs_key_t *keys, const int *skip, size_t n, size_t si,
                   size_t *idx) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if ((!skip || !skip[i]) && ecs__cli_route(c, &keys[i]) == si)
      idx[m++] = i;
  return m;
}

static int key_ok(const ecs_key_t *k) {
  return k->data && ecs_key_check(k->data, k->len) == ECS_OK;
}

/* Runs a batch server by server: fn gets each server's share of the items
 * that skip[] does not exclude (indices into the caller's arrays, at most
 * ECS_PROTO_MAX_ITEMS at a time).  A connection that turns out stale (the
 * server restarted since the last call) is re-opened and the share sent
 * once more: every request is idempotent (a removal retried after it took
 * effect reports ENOTFOUND).  When a share fails as a whole, mark() gives
 * its items, and the server's remaining ones, that error; the first such
 * error is returned.  Other servers still run. */
int ecs__cli_each_share(ecs_client_t *c, const ecs_key_t *keys, const int *skip, size_t n, uint64_t deadline,
                        ecs_cli_share_fn fn, ecs_cli_mark_fn mark, void *arg) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx);
  if (!idx)
    return ECS_ENOMEM;
  int ret = ECS_OK;
  for (size_t si = 0; si < c->nsrv; si++) {
    size_t m = pick(c, keys, skip, n, si, idx);
    for (size_t off = 0; off < m; off += ECS_PROTO_MAX_ITEMS) {
      size_t k = m - off < ECS_PROTO_MAX_ITEMS ? m - off : ECS_PROTO_MAX_ITEMS;
      srv_t *sv = &c->srv[si];
      int reused = sv->fd >= 0;
      int rc = fn(c, sv, idx + off, k, arg, deadline);
      if (rc == ECS_ECONN && reused)
        rc = fn(c, sv, idx + off, k, arg, deadline);
      if (rc) {
        for (size_t j = off; j < m; j++)
          mark(arg, idx[j], rc);
        if (ret == ECS_OK)
          ret = rc;
        break;
      }
    }
  }
  free(idx);
  return ret;
}

/* ------------------------------------------------------------------ */
/* put                                                                  */

static int put_validate(const ecs_key_t *k, const ecs_tensor_t *t) {
  if (!key_ok(k))
    return ECS_EKEY;
  uint64_t want;
  int rc = ecs_tensor_nbytes(&t->desc, &want);
  if (rc)
    return ECS_EDTYPE;
  if (want != t->nbytes)
    return ECS_EDTYPE;
  if (t->nbytes && !t->data)
    return ECS_EINVAL;
  return ECS_OK;
}

/* Compresses one tensor for the wire with the handle's codec.  Returns a
 * malloc'd buffer of *len bytes and sets *codec, or NULL when the bytes go
 * raw (small, incompressible, auto said no, or any codec error: raw is
 * always a correct fallback). */
static void *compress_item(int codec, const ecs_tensor_t *t, size_t *len, uint8_t *used) {
  if (t->nbytes < 4096)
    return NULL; /* not worth a codec frame */
  int req = codec;
  if (codec & ECS_CODEC_AUTO) {
    int ch = ecs_codec_choose(codec, t->desc.dtype, t->data, (size_t)t->nbytes, 0);
    if (ch <= 0)
      return NULL;
    req = ch;
  }
  size_t cap = ecs_codec_bound(req, (size_t)t->nbytes);
  void *buf = cap ? malloc(cap) : NULL;
  size_t out = 0;
  uint8_t u = ECS_CODEC_NONE;
  if (!buf ||
      ecs_codec_compress(req, t->desc.dtype, t->data, (size_t)t->nbytes, buf, cap, &out, &u, 0) != ECS_OK ||
      u == ECS_CODEC_NONE || out >= t->nbytes) {
    free(buf);
    return NULL;
  }
  *len = out;
  *used = u;
  return buf;
}

/* One PUT request over the socket for items idx[0..m), whose payload the
 * caller keeps within s->max_data unless m is 1: a single item that is
 * still over it after compression gets ECS_ETOOBIG alone, unsent. */
static int put_request(ecs_client_t *c, srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                       const size_t *idx, size_t m, int *status, uint64_t deadline) {
  int rc;
  /* calloc: gcc, once it inlines ecs__cli_send (as hidden visibility
   * lets it), cannot see that only the nd entries written are read */
  struct iovec *data = calloc(m ? m : 1, sizeof *data);
  void **zbuf = calloc(m ? m : 1, sizeof *zbuf);
  if (!data || !zbuf) {
    free(data);
    free(zbuf);
    return ECS_ENOMEM;
  }
  ecs_wbuf_reset(&c->w);
  uint64_t total = 0;
  int nd = 0;
  for (size_t j = 0; j < m; j++) {
    const ecs_tensor_t *t = &ts[idx[j]];
    const void *stored = t->data;
    size_t slen = (size_t)t->nbytes;
    uint8_t codec = ECS_CODEC_NONE;
    if (c->codec != ECS_CODEC_NONE)
      zbuf[j] = compress_item(c->codec, t, &slen, &codec);
    if (zbuf[j])
      stored = zbuf[j];
    ecs_put_item_t it = {.key = keys[idx[j]].data,
                         .key_len = (uint16_t)keys[idx[j]].len,
                         .codec = codec,
                         .flags = c->put_flags,
                         .desc = t->desc,
                         .nbytes = slen,
                         .raw_nbytes = t->nbytes,
                         .checksum = ecs_checksum(stored, slen)};
    ecs_proto_put_item_write(&c->w, &it);
    if (slen) {
      data[nd].iov_base = (void *)stored;
      data[nd].iov_len = slen;
      nd++;
    }
    total += slen;
  }
  if (total > s->max_data) { /* m is 1 here (put_one_server) */
    for (size_t j = 0; j < m; j++) {
      free(zbuf[j]);
      status[idx[j]] = ECS_ETOOBIG;
    }
    free(data);
    free(zbuf);
    return ECS_OK;
  }
  uint32_t id;
  rc = ecs__cli_send(c, s, ECS_OP_PUT, 0, (uint32_t)m, data, nd, total, &id, deadline);
  free(data);
  for (size_t j = 0; j < m; j++)
    free(zbuf[j]);
  free(zbuf);
  ecs_hdr_t h;
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, ECS_OP_PUT, id, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  if (h.status != ECS_OK || h.count != m || h.data_len != 0) {
    rc = h.status != ECS_OK ? h.status : ECS_EPROTO;
    ecs__cli_err(c, "%s: put refused: %s", s->addr, ecs_strerror(rc));
    return ecs__cli_fail(c, s, rc);
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  for (size_t j = 0; j < m; j++) {
    int32_t st;
    if (ecs_proto_status_read(&r, &st) != ECS_OK)
      return ecs__cli_fail(c, s, ECS_EPROTO);
    status[idx[j]] = st;
  }
  return ECS_OK;
}

/* Over the socket a request carries at most the server's max_data payload
 * bytes, so the items are sent in runs that fit (a compressed item is never
 * larger than its raw bytes): an item too big for any request fails alone
 * with ECS_ETOOBIG and never takes its neighbours with it. */
static int put_one_server(ecs_client_t *c, srv_t *s, const ecs_key_t *keys, const ecs_tensor_t *ts,
                          const size_t *idx, size_t m, int *status, uint64_t deadline) {
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  if (s->path == ECS_PATH_SHM && s->map && s->map->writable)
    return ecs__shm_put(c, s, keys, ts, idx, m, status, deadline);
  if (s->path == ECS_PATH_RDMA)
    return ecs__rdma_put(c, s, keys, ts, idx, m, status, deadline);
  for (size_t lo = 0; lo < m;) {
    size_t hi = lo + 1;
    uint64_t sum = ts[idx[lo]].nbytes;
    while (sum <= s->max_data && hi < m && ts[idx[hi]].nbytes <= s->max_data - sum) {
      sum += ts[idx[hi]].nbytes;
      hi++;
    }
    rc = put_request(c, s, keys, ts, idx + lo, hi - lo, status, deadline);
    if (rc)
      return rc;
    lo = hi;
  }
  return ECS_OK;
}

typedef struct put_arg {
  const ecs_key_t *keys;
  const ecs_tensor_t *ts;
  int *status;
} put_arg_t;

static int put_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  put_arg_t *a = arg;
  return put_one_server(c, s, a->keys, a->ts, idx, m, a->status, deadline);
}

static void put_mark(void *arg, size_t i, int rc) {
  ((put_arg_t *)arg)->status[i] = rc;
}

static int put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                     int *status) {
  c->errmsg[0] = '\0';
  int *skip = calloc(n ? n : 1, sizeof *skip);
  if (!skip)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    status[i] = put_validate(&keys[i], &tensors[i]);
    skip[i] = status[i] != ECS_OK;
  }
  put_arg_t a = {keys, tensors, status};
  int ret = ecs__cli_each_share(c, keys, skip, n, ecs__cli_deadline(c), put_share, put_mark, &a);
  free(skip);
  return ret;
}

int ecs_put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                  int *status) {
  if (!c || (n && (!keys || !tensors || !status)))
    return ECS_EINVAL;
  c->put_flags = 0;
  return put_batch(c, keys, tensors, n, status);
}

/* The same path as a put with one flag on every item; the server does the
 * replacing (store/objstore.h, reserve_replace). */
int ecs_upsert_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                     int *status) {
  if (!c || (n && (!keys || !tensors || !status)))
    return ECS_EINVAL;
  c->put_flags = ECS_PUT_F_UPSERT;
  int ret = put_batch(c, keys, tensors, n, status);
  c->put_flags = 0;
  return ret;
}

/* ------------------------------------------------------------------ */
/* get                                                                  */

/* Reads a get's payloads into iov[0..niov) (whole items in reply order;
 * iov_item[i] is the reply index of iov[i]) in slices of about
 * ECS_SUM_SLICE bytes, and checksums each raw item's bytes right after
 * each slice lands, while they are still in cache: one trip through
 * memory instead of two, and the hashing overlaps the server's sending.
 * A mismatch marks the item ECS_ECHECKSUM.  Compressed items are checked
 * later, by ecs__cli_deliver; empty ones, which have no iovec, by the
 * caller. */
static int recv_payloads(ecs_client_t *c, srv_t *s, const struct iovec *iov, int niov, const size_t *iov_item,
                         const ecs_get_reply_t *reps, ecs_get_buf_t *bufs, const size_t *idx,
                         uint64_t deadline) {
  struct iovec v[ECS_CLI_IOV_CHUNK];
  int vi[ECS_CLI_IOV_CHUNK];    /* which iov each slice piece is from */
  size_t vo[ECS_CLI_IOV_CHUNK]; /* at what offset in it */
  size_t vl[ECS_CLI_IOV_CHUNK]; /* how many bytes (readv_all consumes v) */
  ecs_sum_t *sum = NULL;        /* for an item that spans slices */
  int rc = ECS_OK, i = 0;
  size_t off = 0;
  while (rc == ECS_OK && i < niov) {
    int k = 0;
    size_t slice_bytes = 0;
    while (i < niov && k < ECS_CLI_IOV_CHUNK && slice_bytes < ECS_SUM_SLICE) {
      size_t take = iov[i].iov_len - off;
      if (take > ECS_SUM_SLICE - slice_bytes)
        take = ECS_SUM_SLICE - slice_bytes;
      v[k].iov_base = (uint8_t *)iov[i].iov_base + off;
      v[k].iov_len = take;
      vi[k] = i;
      vo[k] = off;
      vl[k] = take;
      k++;
      slice_bytes += take;
      off += take;
      if (off == iov[i].iov_len) {
        i++;
        off = 0;
      }
    }
    rc = ecs_net_readv_all(s->fd, v, k, deadline);
    if (rc != ECS_OK || !c->cfg.verify_checksum)
      continue;
    for (int q = 0; q < k; q++) {
      size_t j = iov_item[vi[q]];
      if (reps[j].codec != ECS_CODEC_NONE)
        continue;
      const uint8_t *p = (const uint8_t *)iov[vi[q]].iov_base + vo[q];
      int first = vo[q] == 0, last = vo[q] + vl[q] == iov[vi[q]].iov_len;
      uint64_t got_sum;
      if (first && last) {
        got_sum = ecs_checksum(p, vl[q]);
      } else if (sum || (sum = ecs_sum_new()) != NULL) {
        if (first)
          ecs_sum_reset(sum);
        ecs_sum_update(sum, p, vl[q]);
        if (!last)
          continue;
        got_sum = ecs_sum_digest(sum);
      } else if (last) { /* no memory for a state: hash the whole item now */
        got_sum = ecs_checksum(iov[vi[q]].iov_base, iov[vi[q]].iov_len);
      } else {
        continue;
      }
      if (got_sum != reps[j].checksum) {
        bufs[idx[j]].status = ECS_ECHECKSUM;
        bufs[idx[j]].nbytes = 0;
      }
    }
  }
  ecs_sum_free(sum);
  return rc;
}

static int get_one_server(ecs_client_t *c, srv_t *s, const ecs_key_t *keys, ecs_get_buf_t *bufs,
                          const size_t *idx, size_t m, int alloc, uint64_t deadline) {
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  if (s->path == ECS_PATH_SHM)
    return ecs__shm_get(c, s, keys, bufs, idx, m, alloc, deadline);
  if (s->path == ECS_PATH_RDMA)
    return ecs__rdma_get(c, s, keys, bufs, idx, m, alloc, deadline);
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++) {
    ecs_get_item_t it = {.key = keys[idx[j]].data,
                         .key_len = (uint16_t)keys[idx[j]].len,
                         .capacity = alloc ? UINT64_MAX : (bufs[idx[j]].data ? bufs[idx[j]].capacity : 0)};
    ecs_proto_get_item_write(&c->w, &it);
  }
  uint32_t id;
  rc = ecs__cli_send(c, s, ECS_OP_GET, 0, (uint32_t)m, NULL, 0, 0, &id, deadline);
  ecs_hdr_t h;
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, ECS_OP_GET, id, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  if (h.status != ECS_OK || h.count != m) {
    rc = h.status != ECS_OK ? h.status : ECS_EPROTO;
    ecs__cli_err(c, "%s: get refused: %s", s->addr, ecs_strerror(rc));
    return ecs__cli_fail(c, s, rc);
  }
  /* Records first: they say where each payload goes.  Raw payloads are
   * read straight into the caller's buffers; compressed ones into one
   * scratch buffer, then decompressed into the caller's. */
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  struct iovec *iov = malloc((m ? m : 1) * sizeof *iov);
  ecs_get_reply_t *reps = malloc((m ? m : 1) * sizeof *reps);
  uint64_t *zoff = malloc((m ? m : 1) * sizeof *zoff);
  size_t *iov_item = malloc((m ? m : 1) * sizeof *iov_item); /* iov index -> reply index */
  uint8_t *scratch = NULL;
  if (!iov || !reps || !zoff || !iov_item) {
    free(iov);
    free(reps);
    free(zoff);
    free(iov_item);
    return ecs__cli_fail(c, s, ECS_ENOMEM);
  }
  int niov = 0;
  uint64_t total = 0, ztotal = 0;
  rc = ECS_OK;
  for (size_t j = 0; j < m && rc == ECS_OK; j++) {
    ecs_get_buf_t *b = &bufs[idx[j]];
    ecs_get_reply_t *rep = &reps[j];
    if (ecs_proto_get_reply_read(&r, rep) != ECS_OK) {
      rc = ECS_EPROTO;
      break;
    }
    b->status = rep->status;
    b->nbytes = rep->status == ECS_EBUFSMALL ? rep->raw_nbytes : rep->nbytes;
    b->desc = rep->desc;
    if (rep->status != ECS_OK)
      continue;
    total += rep->nbytes;
    if (rep->codec != ECS_CODEC_NONE) {
      zoff[j] = ztotal;
      ztotal += rep->nbytes;
      continue;
    }
    if (alloc) {
      free(b->data); /* a retry's first attempt may have allocated it */
      b->data = malloc(rep->nbytes ? (size_t)rep->nbytes : 1);
      if (!b->data) {
        rc = ECS_ENOMEM;
        break;
      }
      b->capacity = rep->nbytes;
    } else if (rep->nbytes > b->capacity) {
      rc = ECS_EPROTO; /* the server sent more than we asked for */
      break;
    }
    if (rep->nbytes) {
      iov[niov].iov_base = b->data;
      iov[niov].iov_len = (size_t)rep->nbytes;
      iov_item[niov] = j;
      niov++;
    }
  }
  if (rc == ECS_OK && total != h.data_len)
    rc = ECS_EPROTO;
  if (rc == ECS_OK && ztotal) {
    scratch = malloc((size_t)ztotal);
    if (!scratch)
      rc = ECS_ENOMEM;
  }
  /* the iovecs in reply order: raw items into their buffers, compressed
   * ones into the scratch buffer */
  if (rc == ECS_OK && ztotal) {
    niov = 0;
    for (size_t j = 0; j < m; j++) {
      if (reps[j].status != ECS_OK || reps[j].nbytes == 0)
        continue;
      iov[niov].iov_base = reps[j].codec != ECS_CODEC_NONE ? scratch + zoff[j] : bufs[idx[j]].data;
      iov[niov].iov_len = (size_t)reps[j].nbytes;
      iov_item[niov] = j;
      niov++;
    }
  }
  if (rc == ECS_OK)
    rc = recv_payloads(c, s, iov, niov, iov_item, reps, bufs, idx, deadline);
  free(iov);
  free(iov_item);
  if (rc == ECS_OK) {
    for (size_t j = 0; j < m; j++) {
      ecs_get_buf_t *b = &bufs[idx[j]];
      const ecs_get_reply_t *rep = &reps[j];
      if (b->status != ECS_OK)
        continue;
      if (rep->codec != ECS_CODEC_NONE)
        b->status = ecs__cli_deliver(c, b, scratch + zoff[j], rep->codec, rep->nbytes, rep->raw_nbytes,
                                     rep->checksum, alloc);
      else if (rep->nbytes == 0 && c->cfg.verify_checksum && ecs_checksum(NULL, 0) != rep->checksum)
        b->status = ECS_ECHECKSUM; /* an empty item had no iovec to check */
      if (b->status == ECS_ECHECKSUM || b->status == ECS_ECODEC)
        b->nbytes = 0;
    }
  }
  free(scratch);
  free(reps);
  free(zoff);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
}

/* Puts one stored object (at src, as the server keeps it) into the
 * caller's buffer: checksum first, then a copy or a decompression, with
 * the capacity checked against the raw size.  Returns the item's status. */
int ecs__cli_deliver(ecs_client_t *c, ecs_get_buf_t *b, const void *src, uint8_t codec, uint64_t nbytes,
                     uint64_t raw_nbytes, uint64_t checksum, int alloc) {
  if (c->cfg.verify_checksum && ecs_checksum(src, (size_t)nbytes) != checksum)
    return ECS_ECHECKSUM;
  if (alloc) {
    free(b->data); /* a retry's first attempt may have allocated it */
    b->data = malloc(raw_nbytes ? (size_t)raw_nbytes : 1);
    if (!b->data)
      return ECS_ENOMEM;
    b->capacity = raw_nbytes;
  } else if (raw_nbytes > b->capacity || (raw_nbytes && !b->data)) {
    b->nbytes = raw_nbytes; /* what is needed */
    return ECS_EBUFSMALL;
  }
  if (codec == ECS_CODEC_NONE) {
    if (raw_nbytes)
      memcpy(b->data, src, (size_t)raw_nbytes);
  } else if (ecs_codec_decompress(codec, b->desc.dtype, src, (size_t)nbytes, b->data, (size_t)raw_nbytes) !=
             ECS_OK) {
    return ECS_ECODEC;
  }
  b->nbytes = raw_nbytes;
  return ECS_OK;
}

typedef struct get_arg {
  const ecs_key_t *keys;
  ecs_get_buf_t *bufs;
  int alloc;
} get_arg_t;

static int get_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  get_arg_t *a = arg;
  return get_one_server(c, s, a->keys, a->bufs, idx, m, a->alloc, deadline);
}

static void get_mark(void *arg, size_t i, int rc) {
  get_arg_t *a = arg;
  ecs_get_buf_t *b = &a->bufs[i];
  if (a->alloc) {
    free(b->data);
    b->data = NULL;
  }
  b->status = rc;
  b->nbytes = 0;
}

static int get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n, int alloc) {
  if (!c || (n && (!keys || !bufs)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  int *skip = calloc(n ? n : 1, sizeof *skip);
  if (!skip)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (alloc)
      bufs[i].data = NULL;
    bufs[i].nbytes = 0;
    memset(&bufs[i].desc, 0, sizeof bufs[i].desc);
    bufs[i].status = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
    skip[i] = bufs[i].status != ECS_OK;
  }
  get_arg_t a = {keys, bufs, alloc};
  int ret = ecs__cli_each_share(c, keys, skip, n, ecs__cli_deadline(c), get_share, get_mark, &a);
  if (alloc) { /* only OK items keep a buffer */
    for (size_t i = 0; i < n; i++) {
      if (bufs[i].status != ECS_OK && bufs[i].data) {
        free(bufs[i].data);
        bufs[i].data = NULL;
      }
    }
  }
  free(skip);
  return ret;
}

int ecs_get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  return get_batch(c, keys, bufs, n, 0);
}

int ecs_get_batch_alloc(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  return get_batch(c, keys, bufs, n, 1);
}

/* ------------------------------------------------------------------ */
/* exists / remove: key items in, statuses out                          */

static int keys_one_server(ecs_client_t *c, srv_t *s, uint8_t op, const ecs_key_t *keys, const size_t *idx,
                           size_t m, int *out, uint64_t deadline) {
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  ecs_wbuf_reset(&c->w);
  for (size_t j = 0; j < m; j++)
    ecs_proto_key_write(&c->w, keys[idx[j]].data, (uint16_t)keys[idx[j]].len);
  uint32_t id;
  rc = ecs__cli_send(c, s, op, 0, (uint32_t)m, NULL, 0, 0, &id, deadline);
  ecs_hdr_t h;
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, op, id, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  if (h.status != ECS_OK || h.count != m || h.data_len != 0)
    return ecs__cli_fail(c, s, h.status != ECS_OK ? h.status : ECS_EPROTO);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  for (size_t j = 0; j < m; j++) {
    int32_t st;
    if (ecs_proto_status_read(&r, &st) != ECS_OK)
      return ecs__cli_fail(c, s, ECS_EPROTO);
    out[idx[j]] = st;
  }
  return ECS_OK;
}

typedef struct keys_arg {
  const ecs_key_t *keys;
  uint8_t op;
  int *out;
} keys_arg_t;

static int keys_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  keys_arg_t *a = arg;
  return keys_one_server(c, s, a->op, a->keys, idx, m, a->out, deadline);
}

static void keys_mark(void *arg, size_t i, int rc) {
  ((keys_arg_t *)arg)->out[i] = rc;
}

static int keys_batch(ecs_client_t *c, uint8_t op, const ecs_key_t *keys, size_t n, int *out) {
  c->errmsg[0] = '\0';
  int *skip = calloc(n ? n : 1, sizeof *skip);
  if (!skip)
    return ECS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    out[i] = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
    skip[i] = out[i] != ECS_OK;
  }
  keys_arg_t a = {keys, op, out};
  int ret = ecs__cli_each_share(c, keys, skip, n, ecs__cli_deadline(c), keys_share, keys_mark, &a);
  free(skip);
  return ret;
}

int ecs_remove_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *status) {
  if (!c || (n && (!keys || !status)))
    return ECS_EINVAL;
  return keys_batch(c, ECS_OP_REMOVE, keys, n, status);
}

static int exists_from_servers(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists);

int ecs_exists_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  if (!c || (n && (!keys || !exists)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++)
    exists[i] = 0;
  if (n == 0)
    return ECS_OK;
  if (c->meta && ecs_now_ms() >= c->redis_retry_ms) {
    const uint8_t **kp = malloc(n * sizeof *kp);
    uint16_t *kl = malloc(n * sizeof *kl);
    int *ex = malloc(n * sizeof *ex);
    int rc = ECS_ENOMEM;
    if (kp && kl && ex) {
      size_t m = 0;
      size_t *map = (size_t *)malloc(n * sizeof *map);
      if (map) {
        for (size_t i = 0; i < n; i++) {
          if (!key_ok(&keys[i]))
            continue; /* a bad key exists nowhere */
          kp[m] = keys[i].data;
          kl[m] = (uint16_t)keys[i].len;
          map[m++] = i;
        }
        rc = m ? ecs_meta_exists_batch(c->meta, kp, kl, m, ex) : ECS_OK;
        if (rc == ECS_OK)
          for (size_t j = 0; j < m; j++)
            exists[map[j]] = ex[j] == 1;
        free(map);
      }
    }
    free(kp);
    free(kl);
    free(ex);
    if (rc != ECS_EREDIS && rc != ECS_ETIMEDOUT)
      return rc;
    /* Redis is down or frozen: the servers hold the truth about their own
     * objects, so ask them rather than fail a scheduler's check, and keep
     * asking them for a while rather than pay a frozen Redis's timeout on
     * every call. */
    c->redis_retry_ms = ecs_now_ms() + ECS_CLI_REDIS_RETRY_MS;
  }
  if (!c->meta)
    return exists_from_servers(c, keys, n, exists);
  /* If the servers fail too, both reasons are in the message. */
  char why[128];
  snprintf(why, sizeof why, "%s", ecs_meta_errstr(c->meta));
  int frc = exists_from_servers(c, keys, n, exists);
  if (frc != ECS_OK) {
    char srv[sizeof c->errmsg];
    snprintf(srv, sizeof srv, "%s", c->errmsg);
    ecs__cli_err(c, "Redis unreachable (%s) and servers failed too: %s", why, srv);
  }
  return frc;
}

/* exists answered by the servers: each server says whether it holds the
 * keys routed to it. */
static int exists_from_servers(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  int *st = malloc(n * sizeof *st);
  if (!st)
    return ECS_ENOMEM;
  int rc = keys_batch(c, ECS_OP_EXISTS, keys, n, st);
  if (rc == ECS_OK)
    for (size_t i = 0; i < n; i++)
      exists[i] = st[i] == ECS_OK;
  free(st);
  return rc;
}

/* ------------------------------------------------------------------ */
/* stat / ping / debug                                                  */

/* A request whose records the caller builds in c->w *after* this connects
 * (a reconnect's HELLO reuses c->w); the reply's records stay in c->rmeta. */
typedef void (*build_fn)(ecs_client_t *c, const void *arg, size_t len);

static int simple_rpc_once(ecs_client_t *c, srv_t *s, uint8_t op, build_fn build, const void *arg, size_t len,
                           ecs_hdr_t *h, uint64_t deadline) {
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  ecs_wbuf_reset(&c->w);
  if (build)
    build(c, arg, len);
  uint32_t id;
  rc = ecs__cli_send(c, s, op, 0, 0, NULL, 0, 0, &id, deadline);
  if (rc == ECS_OK)
    rc = ecs__cli_recv(c, s, op, id, h, deadline);
  if (rc == ECS_OK && h->data_len != 0)
    rc = ECS_EPROTO;
  if (rc)
    return ecs__cli_fail(c, s, rc);
  return h->status;
}

static int simple_rpc(ecs_client_t *c, srv_t *s, uint8_t op, build_fn build, const void *arg, size_t len,
                      ecs_hdr_t *h) {
  uint64_t deadline = ecs__cli_deadline(c);
  int reused = s->fd >= 0;
  int rc = simple_rpc_once(c, s, op, build, arg, len, h, deadline);
  if (rc == ECS_ECONN && reused) /* a stale connection: retry once on a fresh one */
    rc = simple_rpc_once(c, s, op, build, arg, len, h, deadline);
  return rc;
}

int ecs_stat(ecs_client_t *c, size_t server, ecs_server_stat_t *st) {
  if (!c || !st || server >= c->nsrv)
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  srv_t *s = &c->srv[server];
  ecs_hdr_t h;
  int rc = simple_rpc(c, s, ECS_OP_STAT, NULL, NULL, 0, &h);
  if (rc)
    return rc;
  ecs_stat_reply_t sr;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  rc = ecs_proto_stat_read(&r, &sr);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  memset(st, 0, sizeof *st);
  st->pool_size = sr.pool_size;
  st->bytes_in_use = sr.bytes_in_use;
  st->bytes_free = sr.bytes_free;
  st->largest_free = sr.largest_free;
  st->bytes_requested = sr.bytes_requested;
  st->objects = sr.objects;
  st->puts = sr.puts;
  st->gets = sr.gets;
  st->hits = sr.hits;
  st->misses = sr.misses;
  st->evictions = sr.evictions;
  st->removes = sr.removes;
  st->connections = sr.connections;
  st->epoch = sr.epoch;
  st->redis_ok = sr.redis_ok;
  st->pool_locked = sr.pool_locked;
  snprintf(st->node_id, sizeof st->node_id, "%s", s->node_id);
  snprintf(st->address, sizeof st->address, "%s", s->addr);
  return ECS_OK;
}

int ecs_ping(ecs_client_t *c) {
  if (!c)
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < c->nsrv; i++) {
    ecs_hdr_t h;
    int rc = simple_rpc(c, &c->srv[i], ECS_OP_PING, NULL, NULL, 0, &h);
    if (rc)
      return rc;
  }
  return ECS_OK;
}

static void build_corrupt(ecs_client_t *c, const void *key, size_t key_len) {
  ecs_wbuf_u32(&c->w, 1); /* DEBUG subcode 1: corrupt one byte */
  ecs_proto_key_write(&c->w, key, (uint16_t)key_len);
}

int ecs__client_debug_corrupt(ecs_client_t *c, const void *key, size_t key_len) {
  ecs_key_t k = {key, key_len};
  if (!c || !key_ok(&k))
    return ECS_EINVAL;
  ecs_hdr_t h;
  return simple_rpc(c, &c->srv[ecs__cli_route(c, &k)], ECS_OP_DEBUG, build_corrupt, key, key_len, &h);
}

int ecs__client_server_fd(ecs_client_t *c, size_t server) {
  return server < c->nsrv ? c->srv[server].fd : -1;
}
