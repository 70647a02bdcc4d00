/*
 * Who may talk to the server: HELLO over TCP (the token proof of
 * store/core/auth.h: the token itself never crosses the wire, and the
 * server proves it holds the key before the client sends anything), the
 * shm socket's UPGRADE (a one-time secret issued over TCP), and the
 * failed-auth throttle that bounds guessing, per source and in all.
 */
#include "store/server/server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"
#include "store/core/auth.h"
#include "store/core/log.h"
#include "store/core/net.h"
#include "store/core/sha256.h"
#include "store/server/acl.h"

/* One token's key in the namespace served. */
struct ecs__auth_key {
  uint8_t id[ECS_AUTH_ID_SIZE];   /* what a client names it by */
  uint8_t key[ECS_AUTH_KEY_SIZE]; /* the key both ends prove */
  unsigned rights;                /* in the namespace served (0: not allowed there) */
};

int ecs__auth_init(ecs_server_t *s) {
  size_t nacl = s->o.acl ? ecs__acl_count(s->o.acl) : 0;
  size_t n = nacl + (s->o.auth_token[0] ? 1 : 0);
  s->nauth_keys = 0;
  ecs_objstore_set_hard_max(s->os, s->o.hard_pin_max); /* before the tenants' shares of it */
  if (!n)
    return ECS_OK;
  s->auth_keys = calloc(n, sizeof *s->auth_keys);
  s->tenants = calloc(n, sizeof *s->tenants);
  uint64_t *stored = calloc(n, sizeof *stored);
  if (!s->auth_keys || !s->tenants || !stored) {
    free(stored);
    return ECS_ENOMEM;
  }
  /* the --auth-token-file token first: a token in both keeps every right */
  if (s->o.auth_token[0]) {
    struct ecs__auth_key *k = &s->auth_keys[s->nauth_keys++];
    ecs__auth_key(s->o.auth_token, strlen(s->o.auth_token), s->o.ns, k->key);
    ecs__auth_key_id(k->key, k->id);
    k->rights = ECS__RIGHT_ALL;
  }
  for (size_t i = 0; i < nacl; i++) {
    size_t len;
    unsigned rights;
    const char *tok = ecs__acl_entry(s->o.acl, i, s->o.ns, &len, &rights);
    struct ecs__auth_key *k = &s->auth_keys[s->nauth_keys++];
    ecs__auth_key(tok, len, s->o.ns, k->key);
    ecs__auth_key_id(k->key, k->id);
    k->rights = rights;
    ecs__acl_entry_quota(s->o.acl, i, &s->tenants[s->nauth_keys - 1].q);
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    s->tenants[i].id = (uint16_t)(i + 1);
    stored[i] = s->tenants[i].q.stored;
    sum += stored[i];
  }
  int rc = ecs_objstore_set_owners(s->os, (unsigned)n, stored);
  free(stored);
  if (rc == ECS_OK && sum > ecs_pool_size(s->pool))
    ECS_LOG_W("the --acl-file quotas (stored=) add up to %llu bytes, more than the pool's %llu: a tenant "
              "within its quota may find no room (ECS_ENOSPC), as others' objects are theirs to evict",
              (unsigned long long)sum, (unsigned long long)ecs_pool_size(s->pool));
  return rc;
}

void ecs__auth_free(ecs_server_t *s) {
  if (s->auth_keys)
    ecs__auth_wipe(s->auth_keys, s->nauth_keys * sizeof *s->auth_keys);
  free(s->auth_keys);
  free(s->tenants);
  s->tenants = NULL;
  s->auth_keys = NULL;
  s->nauth_keys = 0;
}

/* The key a client names by id: every entry is compared (constant time,
 * no early stop), the first match wins.  NULL when none. */
static const struct ecs__auth_key *key_by_id(const ecs_server_t *s, const uint8_t *id) {
  const struct ecs__auth_key *hit = NULL;
  for (size_t i = 0; i < s->nauth_keys; i++) {
    int eq = ecs_ct_equal(id, ECS_AUTH_ID_SIZE, s->auth_keys[i].id, ECS_AUTH_ID_SIZE);
    if (eq && !hit)
      hit = &s->auth_keys[i];
  }
  return hit;
}

/* A failed HELLO: one log line a second at most (a token guesser must not
 * flood the log), the rest counted into the next line. */
static void log_auth_failure(ecs_server_t *s, conn_t *c, const char *why) {
  uint64_t now = ecs_now_ms();
  if (s->auth_log_ms && now - s->auth_log_ms < 1000) {
    s->auth_unlogged++;
    return;
  }
  ECS_LOG_W("conn %llu: %s; closing (%llu more failed HELLOs since the last such line)",
            (unsigned long long)c->id, why, (unsigned long long)s->auth_unlogged);
  s->auth_log_ms = now;
  s->auth_unlogged = 0;
}

/* The failed-auth throttle.  Per source, a token bucket (GCRA): a source
 * (an IPv4 /24, an IPv6 /64: server_conn.c folds the address) may fail
 * AUTH_FAIL_BURST HELLOs at once, then one per --auth-fail-delay-ms; past
 * that its HELLOs are refused without their token being looked at.  A
 * source shares its slot with others that hash alike; a slot holds the
 * last one to fail.  In all, a bucket of AUTH_GLOBAL_BURST, then
 * AUTH_GLOBAL_PER_DELAY per delay, so that a guesser rotating through
 * many addresses gets no more than that; while it is empty only sources
 * that proved a token within AUTH_GOOD_MS are checked (so a guesser does
 * not lock the clients already known good out). */
static int good_source(const ecs_server_t *s, uint64_t src, uint64_t now) {
  size_t i = (size_t)(src % AUTH_GOOD_SLOTS);
  return src && s->auth_good[i] == src && now - s->auth_good_ms[i] < AUTH_GOOD_MS;
}

static int auth_throttled(ecs_server_t *s, const conn_t *c) {
  size_t i = (size_t)(c->src % AUTH_FAIL_SLOTS);
  uint64_t now = ecs_now_ms();
  uint64_t d = (uint64_t)s->o.auth_fail_delay_ms;
  uint64_t slack = (uint64_t)(AUTH_FAIL_BURST - 1) * d;
  if (s->auth_fail[i].src == c->src && s->auth_fail[i].tat_ms > now + slack)
    return 1;
  uint64_t gslack = (uint64_t)(AUTH_GLOBAL_BURST - 1) * d / AUTH_GLOBAL_PER_DELAY;
  return s->auth_global_tat_ms > now + gslack && !good_source(s, c->src, now);
}

static void auth_failed(ecs_server_t *s, const conn_t *c) {
  size_t i = (size_t)(c->src % AUTH_FAIL_SLOTS);
  uint64_t now = ecs_now_ms();
  if (s->auth_fail[i].src != c->src || s->auth_fail[i].tat_ms < now) {
    s->auth_fail[i].src = c->src;
    s->auth_fail[i].tat_ms = now;
  }
  s->auth_fail[i].tat_ms += (uint64_t)s->o.auth_fail_delay_ms;
  if (s->auth_global_tat_ms < now)
    s->auth_global_tat_ms = now;
  s->auth_global_tat_ms += (uint64_t)s->o.auth_fail_delay_ms / AUTH_GLOBAL_PER_DELAY;
}

static void auth_good(ecs_server_t *s, const conn_t *c) {
  size_t i = (size_t)(c->src % AUTH_GOOD_SLOTS);
  s->auth_good[i] = c->src;
  s->auth_good_ms[i] = ecs_now_ms();
}

/* The reply to a HELLO over TCP, and to an UPGRADE's PROVE on the shm
 * socket (which carries no secret).  A TCP client of a server with shm on
 * gets a fresh one-time secret, named by a random id, good for one UPGRADE
 * within UPGRADE_TTL_MS while this connection is open: the token itself is
 * never sent on the socket, whose holder the client can only check by uid.
 *
 * Only a client on this host gets one: its address is a loopback one or
 * one of this host's own (ecs_net_peer_is_local, the test the client makes
 * before it tries the socket).  A remote client cannot reach the Unix
 * socket, so a secret would be of no use to it, only a credential to leak
 * (to whoever can read its memory or its traffic, and then reach the
 * socket here).  A client in a container of its own network namespace is
 * remote by that test: it stays on TCP (docs/security.md). */
static void reply_hello(ecs_server_t *s, conn_t *c) {
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  snprintf(hr.node_id, sizeof hr.node_id, "%s", s->o.node_id);
  hr.epoch = s->epoch;
  hr.pool_size = ecs_pool_size(s->pool);
  hr.max_items = ECS_PROTO_MAX_ITEMS;
  hr.max_data = s->o.max_request;
  snprintf(hr.shm_path, sizeof hr.shm_path, "%s", s->shm_path);
  if (!c->local && s->shm_path[0] && ecs_net_peer_is_local(c->fd) &&
      ecs__auth_random(c->up_secret, sizeof c->up_secret) == 0 &&
      ecs__auth_random(&c->up_id, sizeof c->up_id) == 0) {
    c->up_id |= 1; /* never 0, "none" on the wire */
    c->up_expires_ms = ecs_now_ms() + UPGRADE_TTL_MS;
    hr.upgrade_id = c->up_id;
    memcpy(hr.upgrade_secret, c->up_secret, sizeof hr.upgrade_secret);
  }
  ecs__reply_begin(c);
  ecs_proto_hello_reply_write(&c->out, &hr);
  ecs__auth_wipe(&hr, sizeof hr);
  ecs__reply_finish(s, c, ECS_OK, 0, 0);
}

static int ns_served(const ecs_server_t *s, const ecs_hello_t *h) {
  return h->ns_len == strlen(s->o.ns) && memcmp(h->ns, s->o.ns, h->ns_len) == 0;
}

static void refuse(ecs_server_t *s, conn_t *c, int status, const char *why) {
  log_auth_failure(s, c, why);
  ecs__auth_wipe(c->auth_key, sizeof c->auth_key);
  c->auth_pending = 0;
  ecs__reply_error(s, c, status, 1);
}

/* CHALLENGE: the client names its key and sends a nonce; the server
 * answers with its own nonce and its proof, and waits for PROVE. */
static void hello_challenge(ecs_server_t *s, conn_t *c, const ecs_hello_t *h) {
  const struct ecs__auth_key *k = key_by_id(s, h->key_id);
  if (!k) {
    auth_failed(s, c);
    refuse(s, c, ECS_EAUTH, "bad auth token (no key of this server has the id its HELLO names)");
    return;
  }
  if (!k->rights) {
    refuse(s, c, ECS_EAUTH, "token not allowed in the namespace served (--acl-file)");
    return;
  }
  if (ecs__auth_random(c->auth_sn, sizeof c->auth_sn) != 0) {
    refuse(s, c, ECS_EIO, "HELLO refused: no random bytes from the kernel");
    return;
  }
  memcpy(c->auth_key, k->key, sizeof c->auth_key);
  memcpy(c->auth_cn, h->nonce, sizeof c->auth_cn);
  c->auth_rights = k->rights;
  c->auth_tenant = &s->tenants[k - s->auth_keys];
  c->auth_pending = 1;
  /* what the proof covers, and nothing more: the epoch and the limits
   * come with the full reply, once the client has proved the key too */
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  snprintf(hr.node_id, sizeof hr.node_id, "%s", s->o.node_id);
  hr.proof = 1;
  snprintf(hr.addr, sizeof hr.addr, "%s", s->o.advertise);
  memcpy(hr.snonce, c->auth_sn, sizeof hr.snonce);
  ecs__auth_mac(c->auth_key, 1, c->auth_cn, c->auth_sn, s->o.ns, hr.node_id, hr.addr, hr.smac);
  ecs__reply_begin(c);
  ecs_proto_hello_reply_write(&c->out, &hr);
  ecs__reply_finish(s, c, ECS_OK, 0, 0);
}

/* PROVE: the client's proof over the same handshake; on success the
 * connection holds the key's rights and gets the full HELLO reply. */
static void hello_prove(ecs_server_t *s, conn_t *c, const ecs_hello_t *h) {
  if (!c->auth_pending) {
    refuse(s, c, ECS_EAUTH, "HELLO proof without a challenge first");
    return;
  }
  uint8_t want[ECS_AUTH_MAC_SIZE];
  char node_id[64];
  snprintf(node_id, sizeof node_id, "%s", s->o.node_id);
  ecs__auth_mac(c->auth_key, 0, c->auth_cn, c->auth_sn, s->o.ns, node_id, s->o.advertise, want);
  int ok = ecs_ct_equal(want, sizeof want, h->mac, ECS_AUTH_MAC_SIZE);
  ecs__auth_wipe(want, sizeof want);
  if (!ok) {
    auth_failed(s, c);
    refuse(s, c, ECS_EAUTH, "bad auth token (wrong proof)");
    return;
  }
  c->rights = c->auth_rights;
  c->tenant = c->auth_tenant;
  c->auth_pending = 0;
  ecs__auth_wipe(c->auth_key, sizeof c->auth_key);
  auth_good(s, c);
  ecs__conn_authed(s, c);
  reply_hello(s, c);
}

void ecs__handle_hello(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_hello_t h;
  if (c->local) {
    /* Clients say HELLO over TCP and UPGRADE here. */
    refuse(s, c, ECS_EAUTH, "HELLO on the shm socket refused (say HELLO over TCP, then UPGRADE)");
    return;
  }
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  if (ecs_proto_hello_read(&r, &h) != ECS_OK || r.pos != r.len) {
    ecs__reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  int need_token = s->nauth_keys > 0;
  if (!ns_served(s, &h)) {
    ECS_LOG_W("conn %llu: namespace mismatch (server serves '%s')", (unsigned long long)c->id, s->o.ns);
    ecs__reply_error(s, c, ECS_EINVAL, 1);
    return;
  }
  uint32_t mode = h.client_flags & (ECS_HELLO_C_CHALLENGE | ECS_HELLO_C_PROVE);
  if (!mode) {
    /* A plain HELLO: welcome without a token; with one, refused whatever
     * it holds (a token sent in the clear is not looked at). */
    if (need_token) {
      refuse(s, c, ECS_EAUTH,
             h.token_len ? "HELLO with a token in the clear refused unchecked (the client predates the "
                           "token proof of protocol 2.1: upgrade it)"
                         : "HELLO without a token (this server requires one)");
      return;
    }
    c->rights = ECS__RIGHT_ALL;
    ecs__conn_authed(s, c);
    reply_hello(s, c);
    return;
  }
  if (!need_token) {
    refuse(s, c, ECS_EAUTH,
           "HELLO offers a token proof, but this server holds no token (start it with --auth-token-file "
           "or --acl-file, or give the client none)");
    return;
  }
  if (auth_throttled(s, c)) {
    refuse(s, c, ECS_EAUTH, "HELLO refused unchecked (too many bad tokens from this source, or in all)");
    return;
  }
  if (mode == ECS_HELLO_C_CHALLENGE)
    hello_challenge(s, c, &h);
  else
    hello_prove(s, c, &h);
}

/* The authenticated TCP connection that holds the live upgrade secret id
 * names, or NULL.  Linear, but upgrades are rare and conns bounded. */
static conn_t *upgrade_issuer(ecs_server_t *s, uint64_t id) {
  uint64_t now = ecs_now_ms();
  for (size_t i = 0; i < s->nconns; i++) {
    conn_t *t = s->conns[i];
    if (id && t->up_id == id && !t->local && t->authed && t->up_expires_ms)
      return t->up_expires_ms > now ? t : NULL;
  }
  return NULL;
}

/* UPGRADE (shm socket only, the one request allowed before it succeeds):
 * CHALLENGE hands out a fresh random nonce; PROVE must answer it with
 * HMAC-SHA256(secret, nonce) under the secret a HELLO over TCP issued.
 * The secret is named by a random 64-bit id, so another client cannot
 * name (and so spend) it; it is spent by the first PROVE that names it,
 * right or wrong, and a nonce by any PROVE, so a recorded proof is worth
 * nothing. */
void ecs__handle_upgrade(ecs_server_t *s, conn_t *c) {
  ecs_rbuf_t r;
  ecs_upgrade_t u;
  ecs_rbuf_init(&r, c->meta, c->hdr.meta_len);
  if (!c->local) {
    ecs__reply_error(s, c, ECS_ENOTSUP, 0);
    return;
  }
  if (c->authed || ecs_proto_upgrade_read(&r, &u) != ECS_OK || r.pos != r.len) {
    ecs__reply_error(s, c, ECS_EPROTO, 1);
    return;
  }
  if (u.phase == ECS_UPGRADE_CHALLENGE) {
    if (ecs__auth_random(c->up_nonce, sizeof c->up_nonce) != 0) {
      ecs__reply_error(s, c, ECS_EIO, 1);
      return;
    }
    c->up_nonce_set = 1;
    ecs__reply_begin(c);
    ecs_wbuf_put(&c->out, c->up_nonce, sizeof c->up_nonce);
    ecs__reply_finish(s, c, ECS_OK, 0, 0);
    return;
  }
  conn_t *t = c->up_nonce_set ? upgrade_issuer(s, u.upgrade_id) : NULL;
  int ok = 0;
  unsigned rights = 0;
  tenant_t *tenant = NULL;
  if (t) {
    rights = t->rights;
    tenant = t->tenant;
    uint8_t want[ECS_SHA256_SIZE];
    ecs__hmac_sha256(t->up_secret, sizeof t->up_secret, c->up_nonce, sizeof c->up_nonce, want);
    ok = ecs_ct_equal(want, sizeof want, u.mac, sizeof u.mac);
    ecs__auth_wipe(t->up_secret, sizeof t->up_secret);
    t->up_expires_ms = 0;
    t->up_id = 0;
  }
  ecs__auth_wipe(c->up_nonce, sizeof c->up_nonce);
  c->up_nonce_set = 0;
  if (!ok) {
    log_auth_failure(s, c,
                     t ? "shm upgrade refused: wrong proof"
                       : "shm upgrade refused: no challenge, or no live secret by that id (spent, expired, "
                         "or its TCP connection closed)");
    ecs__reply_error(s, c, ECS_EAUTH, 1);
    return;
  }
  /* c acts for t's client: it is admitted as t's HELLO was, with the
   * rights t's token holds (--acl-file), no more. */
  c->rights = rights;
  c->tenant = tenant;
  ecs__conn_authed(s, c);
  reply_hello(s, c);
}
