/*
 * One client connection: a request out, a reply in, and what happens when
 * either goes wrong.
 *
 * Every request is a header, its records (built in c->w) and an optional
 * payload; every reply a header, records (read into c->rmeta) and an
 * optional payload the caller reads itself.  A connection that timed out or
 * broke mid-reply is dropped (its stream position is unknown) and re-opened
 * by the next call.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/core/auth.h"
#include "store/core/checksum.h"
#include "store/client/client_priv.h"
#include "store/core/codec.h"
#include "store/core/net.h"

void ecs__cli_err(ecs_client_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
  va_end(ap);
}

void ecs__cli_drop(ecs_cli_srv_t *s) {
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
  const ecs_cli_ops_t *ops = s->ops;
  s->ops = NULL;
  if (ops && ops->drop)
    ops->drop(s);
}

/* After a whole-request failure the stream position is unknown: drop. */
int ecs__cli_fail(ecs_client_t *c, ecs_cli_srv_t *s, int rc) {
  if (!c->errmsg[0] || rc == ECS_ETIMEDOUT)
    ecs__cli_err(c, "%s: %s", s->addr, ecs_strerror(rc));
  ecs__cli_drop(s);
  return rc;
}

/* Sends header + c->w records + data iovecs. */
int ecs__cli_send(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint16_t flags, uint32_t count,
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
static int recv_reply(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint32_t req_id, ecs_hdr_t *h,
                      uint64_t deadline) {
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

int ecs__cli_reply(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint32_t id, uint32_t count, unsigned check,
                   const char *what, ecs_hdr_t *h, uint64_t deadline) {
  int rc = recv_reply(c, s, op, id, h, deadline);
  if (rc) {
    h->status = ECS_OK; /* not the reply's word: it may not have come */
    return rc;
  }
  if (h->status != ECS_OK)
    rc = h->status;
  else if (((check & ECS_CALL_COUNT) && h->count != count) || (!(check & ECS_CALL_PAYLOAD) && h->data_len))
    rc = ECS_EPROTO;
  if (rc && what)
    ecs__cli_err(c, "%s: %s refused: %s", s->addr, what, ecs_strerror(rc));
  return rc;
}

int ecs__cli_call(ecs_client_t *c, ecs_cli_srv_t *s, uint8_t op, uint32_t count, const struct iovec *data,
                  int ndata, uint64_t data_len, unsigned check, const char *what, ecs_hdr_t *h,
                  uint64_t deadline) {
  uint32_t id;
  int rc = ecs__cli_send(c, s, op, 0, count, data, ndata, data_len, &id, deadline);
  if (rc) {
    h->status = ECS_OK;
    return rc;
  }
  return ecs__cli_reply(c, s, op, id, count, check, what, h, deadline);
}

int ecs__cli_read_statuses(ecs_client_t *c, const ecs_hdr_t *h, const size_t *idx, size_t m, int *out) {
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h->meta_len);
  for (size_t j = 0; j < m; j++) {
    int32_t st;
    if (ecs_proto_status_read(&r, &st) != ECS_OK)
      return ECS_EPROTO;
    out[idx[j]] = st;
  }
  return ECS_OK;
}

/* Takes the HELLO reply's values into s. */
static void take_hello(ecs_cli_srv_t *s, ecs_hello_reply_t *hr) {
  snprintf(s->node_id, sizeof s->node_id, "%s", hr->node_id);
  s->epoch = hr->epoch;
  s->max_data = hr->max_data;
  snprintf(s->shm_path, sizeof s->shm_path, "%s", hr->shm_path);
  s->up_id = hr->upgrade_id;
  memcpy(s->up_secret, hr->upgrade_secret, sizeof s->up_secret);
  ecs__auth_wipe(hr, sizeof *hr);
}

/* One HELLO round trip with the record in c->w; the reply record in *hr. */
static int hello_call(ecs_client_t *c, ecs_cli_srv_t *s, ecs_hello_reply_t *hr, uint64_t deadline) {
  ecs_hdr_t h;
  int rc = ecs__cli_call(c, s, ECS_OP_HELLO, 0, NULL, 0, 0, ECS_CALL_PAYLOAD, NULL, &h, deadline);
  if (rc != ECS_OK && h.status != ECS_OK) {
    if (rc == ECS_EINVAL)
      ecs__cli_err(c, "%s refused the namespace '%s' (it serves another one)", s->addr, c->ns_s);
    else if (rc == ECS_EAUTH && c->token_s)
      ecs__cli_err(c,
                   "%s refused the auth token (unknown there, not allowed in namespace '%s', or the server "
                   "has no token)",
                   s->addr, c->ns_s);
    else if (rc == ECS_EAUTH)
      ecs__cli_err(c, "%s refused a client without an auth token (it requires one: set auth_token)", s->addr);
    else
      ecs__cli_err(c, "%s refused HELLO: %s", s->addr, ecs_strerror(rc));
    return rc;
  }
  if (rc != ECS_OK)
    return rc;
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, c->rmeta, h.meta_len);
  rc = ecs_proto_hello_reply_read(&r, hr);
  if (rc != ECS_OK)
    ecs__cli_err(c, "%s: malformed HELLO reply", s->addr);
  return rc;
}

/* A client with a token never sends it: it sends a key id and a nonce,
 * checks the server's proof over both nonces, the namespace, the node id
 * and the address (against the registry's, for a discovered server), and
 * only then proves the key in turn.  A server that cannot prove the key
 * (a rogue registry entry, a server of another tenant) gets nothing else:
 * no token, no request, no payload. */
int ecs__cli_hello(ecs_client_t *c, ecs_cli_srv_t *s, uint64_t deadline) {
  ecs_hello_t hl = {.ns = (const uint8_t *)c->ns_s, .ns_len = (uint16_t)strlen(c->ns_s)};
  ecs_hello_reply_t hr;
  if (!c->token_s || !c->token_s[0]) {
    ecs_wbuf_reset(&c->w);
    ecs_proto_hello_write(&c->w, &hl);
    int rc = hello_call(c, s, &hr, deadline);
    if (rc == ECS_OK)
      take_hello(s, &hr);
    return rc;
  }
  uint8_t key[ECS_AUTH_KEY_SIZE], id[ECS_AUTH_ID_SIZE], cn[ECS_AUTH_NONCE_SIZE], mac[ECS_AUTH_MAC_SIZE];
  if (ecs__auth_random(cn, sizeof cn) != 0) {
    ecs__cli_err(c, "no random bytes from the kernel for the HELLO nonce");
    return ECS_EIO;
  }
  ecs__auth_key(c->token_s, strlen(c->token_s), c->ns_s, key);
  ecs__auth_key_id(key, id);
  hl.client_flags = ECS_HELLO_C_CHALLENGE;
  hl.key_id = id;
  hl.nonce = cn;
  ecs_wbuf_reset(&c->w);
  ecs_proto_hello_write(&c->w, &hl);
  int rc = hello_call(c, s, &hr, deadline);
  if (rc == ECS_OK && !hr.proof) {
    ecs__cli_err(c,
                 "%s did not prove it holds the auth token (its HELLO reply has no proof): not an ecstore "
                 "server of namespace '%s' with this token, or one older than this client; nothing was "
                 "sent to it",
                 s->addr, c->ns_s);
    rc = ECS_EAUTH;
  }
  if (rc == ECS_OK) {
    ecs__auth_mac(key, 1, cn, hr.snonce, c->ns_s, hr.node_id, hr.addr, mac);
    if (!ecs_ct_equal(mac, sizeof mac, hr.smac, sizeof hr.smac)) {
      ecs__cli_err(c,
                   "%s failed to prove it holds the auth token (wrong proof): a rogue server, or one of "
                   "another namespace; nothing was sent to it",
                   s->addr);
      rc = ECS_EAUTH;
    } else if (s->reg_id[0] && (strcmp(hr.node_id, s->reg_id) != 0 || strcmp(hr.addr, s->addr) != 0)) {
      /* a discovered server: the proof must name the registry's entry,
       * or a rogue entry could relay to a real server */
      ecs__cli_err(c,
                   "%s proved the token as node '%s' at %s, but the registry names node '%s' there: a "
                   "relayed or forged registry entry; nothing was sent to it",
                   s->addr, hr.node_id, hr.addr, s->reg_id);
      rc = ECS_EAUTH;
    }
  }
  char node_id[sizeof hr.node_id];
  snprintf(node_id, sizeof node_id, "%s", hr.node_id);
  if (rc == ECS_OK) {
    ecs__auth_mac(key, 0, cn, hr.snonce, c->ns_s, hr.node_id, hr.addr, mac);
    ecs_hello_t pv = {.ns = hl.ns, .ns_len = hl.ns_len, .client_flags = ECS_HELLO_C_PROVE, .mac = mac};
    ecs_wbuf_reset(&c->w);
    ecs_proto_hello_write(&c->w, &pv);
    rc = hello_call(c, s, &hr, deadline);
    if (rc == ECS_OK && strcmp(hr.node_id, node_id) != 0) {
      ecs__cli_err(c, "%s: HELLO reply names node '%s' after proving node '%s'", s->addr, hr.node_id,
                   node_id);
      rc = ECS_EPROTO;
    }
  }
  ecs__auth_wipe(key, sizeof key);
  ecs__auth_wipe(mac, sizeof mac);
  if (rc == ECS_OK)
    take_hello(s, &hr);
  else
    ecs__auth_wipe(&hr, sizeof hr);
  return rc;
}

/* Puts one stored object (at src, as the server keeps it) into the
 * caller's buffer: checksum first, then a copy or a decompression, with
 * the capacity checked against the raw size.  Returns the item's status. */
int ecs__cli_deliver(ecs_client_t *c, ecs_get_buf_t *b, const void *src, uint8_t codec, uint64_t nbytes,
                     uint64_t raw_nbytes, uint64_t checksum, int alloc) {
  if (c->cfg.verify_checksum && ecs_checksum(src, (size_t)nbytes) != checksum)
    return ECS_ECHECKSUM;
  if (alloc && raw_nbytes > c->cfg.max_object_size) {
    b->nbytes = raw_nbytes; /* the caller's cap, not the server's word, bounds a malloc */
    return ECS_EBUFSMALL;
  }
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

int ecs_client_set_soft_pin(ecs_client_t *c, int on) {
  return ecs_client_set_pin(c, on ? ECS_PIN_SOFT : ECS_PIN_NONE, 0);
}

int ecs_client_set_pin(ecs_client_t *c, int kind, uint64_t soft_ttl_ms) {
  static const uint8_t flags[] = {0, ECS_PUT_F_SOFT_PIN, ECS_PUT_F_HARD_PIN};
  if (!c || kind < ECS_PIN_NONE || kind > ECS_PIN_HARD || (soft_ttl_ms && kind != ECS_PIN_SOFT))
    return ECS_EINVAL;
  uint8_t pins = ECS_PUT_F_SOFT_PIN | ECS_PUT_F_HARD_PIN | ECS_PUT_F_PIN_TTL;
  c->sticky_put_flags =
      (uint8_t)((c->sticky_put_flags & ~pins) | flags[kind] | (soft_ttl_ms ? ECS_PUT_F_PIN_TTL : 0));
  c->sticky_pin_ttl = soft_ttl_ms ? ecs_proto_pin_ttl_encode(soft_ttl_ms) : 0;
  return ECS_OK;
}
