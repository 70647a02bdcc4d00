/*
 * libecstore client: servers discovered from Redis, where a put goes, and
 * where a get finds its keys (docs/multihost.md).
 *
 * A client given a Redis URL and no servers list keeps one slot per node
 * it has seen in the namespace's registry (store/redis/meta.h: addr, epoch,
 * pool, free bytes, kept alive by the servers' heartbeats).  Slots are
 * never moved, so a view's server index stays valid; a node that leaves
 * the registry is marked not live and its connection dropped, one that
 * comes back (same id) takes its old slot.  A departed node's slot is
 * reused only when all ECS_CLI_MAX_SERVERS slots are taken.
 *
 * Placement is the client's choice, recorded by the server that stores
 * the object (its Redis record names the node and epoch), so a get never
 * needs to agree with the put about the server list:
 *   hash          rendezvous (highest random weight) hashing over the live
 *                 servers: a join takes about 1/N of the keys, a leave
 *                 moves only the leaver's
 *   local         a live server whose address is one of this host's
 *                 interfaces (rendezvous among several), else hash
 *   least-loaded  the most free bytes as last published with a heartbeat,
 *                 less what this batch already sent there
 * With replicas (config.replicas = N), each further copy goes to the best
 * server the policy offers among those not yet holding the item: the top N
 * by rendezvous weight (hash), local then hash (local), the N with most
 * free bytes (least-loaded).
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <xxhash.h>

#include "store/client/client_priv.h"
#include "store/redis/meta.h"
#include "store/core/net.h"

int ecs__place_parse(ecs_client_t *c, const char *name, char *errbuf, size_t errlen) {
  if (!name || !*name || !strcmp(name, "hash"))
    c->placement = ECS_PLACE_HASH;
  else if (!strcmp(name, "local"))
    c->placement = ECS_PLACE_LOCAL;
  else if (!strcmp(name, "least-loaded"))
    c->placement = ECS_PLACE_LEAST_LOADED;
  else {
    snprintf(errbuf, errlen, "unknown placement '%s' (expected hash, local or least-loaded)", name);
    return ECS_EINVAL;
  }
  return ECS_OK;
}

/* An address as 16 bytes (IPv4 as v4-mapped IPv6); 0 when not IP. */
static int addr16(const struct sockaddr *sa, uint8_t out[16]) {
  if (sa->sa_family == AF_INET) {
    memset(out, 0, 10);
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return 1;
  }
  if (sa->sa_family == AF_INET6) {
    memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    return 1;
  }
  return 0;
}

/* 1 when host is on this host: an address literal that is loopback or
 * one of this host's interface addresses (ifs: getifaddrs' list), or a
 * name that is "localhost" or this host's name.  Names are not resolved:
 * a registry read must not wait on DNS. */
static int host_is_local(const char *host, const struct ifaddrs *ifs) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) {
    char me[256] = "";
    if (gethostname(me, sizeof me - 1) != 0)
      me[0] = '\0';
    size_t ml = strcspn(me, ".");
    return !strcmp(host, "localhost") ||
           (me[0] && (!strcmp(host, me) || (strlen(host) == ml && !strncmp(host, me, ml))));
  }
  static const uint8_t v6_loop[16] = {[15] = 1};
  static const uint8_t v4_mapped[12] = {[10] = 0xff, [11] = 0xff};
  int local = 0;
  for (const struct addrinfo *a = res; a && !local; a = a->ai_next) {
    uint8_t want[16], mine[16];
    if (!addr16(a->ai_addr, want))
      continue;
    if (!memcmp(want, v6_loop, 16) || (!memcmp(want, v4_mapped, 12) && want[12] == 127))
      local = 1;
    for (const struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
      local = i->ifa_addr && addr16(i->ifa_addr, mine) && !memcmp(want, mine, 16);
  }
  freeaddrinfo(res);
  return local;
}

/* The slot of node id, or NULL. */
static ecs_cli_srv_t *slot_of(ecs_client_t *c, const char *id) {
  for (size_t i = 0; i < c->nsrv; i++)
    if (!strcmp(c->srv[i].reg_id, id))
      return &c->srv[i];
  return NULL;
}

/* Points slot s at node nd (a new slot, or a known node whose address or
 * epoch changed: the old connection goes, the next call connects). */
static int slot_set(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_meta_node_t *nd, const struct ifaddrs *ifs) {
  char host[128];
  int port;
  if (ecs_net_parse_hostport(nd->addr, host, sizeof host, &port) != ECS_OK || port <= 0)
    return ECS_EINVAL; /* a registry entry we cannot use: skipped */
  if (s->fd >= 0 && (strcmp(s->addr, nd->addr) != 0 || s->reg_epoch != nd->epoch))
    ecs__cli_drop(s);
  if (strcmp(s->addr, nd->addr) != 0 || !s->reg_id[0]) {
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    snprintf(s->addr, sizeof s->addr, "%s", nd->addr);
    s->local = host_is_local(host, ifs);
  }
  if (s->reg_epoch != nd->epoch) {
    s->down_until = 0; /* a restart: worth trying at once */
    s->fails = 0;
    s->mark_since = 0; /* (marks name the epoch: the old one's are not read) */
  }
  snprintf(s->reg_id, sizeof s->reg_id, "%s", nd->node_id);
  s->reg_epoch = nd->epoch;
  s->free_bytes = nd->free_bytes;
  ecs__cli_follow_mark(s, nd->suspect_ms, ecs_now_ms(), (uint64_t)c->cfg.registry_refresh_ms);
  s->live = 1;
  s->cli = c;
  return ECS_OK;
}

static int in_list(const ecs_meta_node_t *nodes, size_t n, const char *id) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(nodes[k].node_id, id))
      return 1;
  return 0;
}

int ecs__place_refresh(ecs_client_t *c, int force) {
  if (!c->discover)
    return ECS_OK;
  uint64_t now = ecs_now_ms();
  if (!force && now < c->next_refresh_ms)
    return ECS_OK;
  c->next_refresh_ms = now + (uint64_t)c->cfg.registry_refresh_ms;
  ecs_meta_node_t *nodes = calloc(ECS_CLI_MAX_SERVERS, sizeof *nodes);
  if (!nodes)
    return ECS_ENOMEM;
  size_t n = 0;
  ecs__cli_redis_budget(c);
  int rc = ecs_meta_nodes(c->meta, nodes, ECS_CLI_MAX_SERVERS, &n);
  if (rc != ECS_OK) {
    /* Keep what we knew: the servers may well be serving; try again soon. */
    ecs__cli_err(c, "discovery: cannot read the node registry from Redis %s: %s", c->redis_s,
                 ecs_meta_errstr(c->meta));
    c->next_refresh_ms = now + ECS_CLI_REDIS_RETRY_MS;
    free(nodes);
    return rc;
  }
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0)
    ifs = NULL;
  for (size_t i = 0; i < c->nsrv; i++)
    c->srv[i].live = 0;
  for (size_t k = 0; k < n; k++) {
    ecs_cli_srv_t *s = slot_of(c, nodes[k].node_id);
    if (!s) {
      int fresh = c->nsrv < ECS_CLI_MAX_SERVERS;
      if (fresh)
        s = &c->srv[c->nsrv];
      else /* all slots used: take one whose node left (and is not in this list) */
        for (size_t i = 0; i < c->nsrv && !s; i++)
          if (!c->srv[i].live && c->srv[i].fd < 0 && !in_list(nodes, n, c->srv[i].reg_id))
            s = &c->srv[i];
      if (!s)
        continue; /* more live nodes than slots: the rest are not used */
      memset(s, 0, sizeof *s);
      s->fd = -1;
      if (slot_set(c, s, &nodes[k], ifs) == ECS_OK && fresh)
        c->nsrv++;
      continue;
    }
    slot_set(c, s, &nodes[k], ifs);
  }
  for (size_t i = 0; i < c->nsrv; i++)
    if (!c->srv[i].live && c->srv[i].fd >= 0)
      ecs__cli_drop(&c->srv[i]); /* departed: its objects are misses now */
  if (ifs)
    freeifaddrs(ifs);
  free(nodes);
  return ECS_OK;
}

void ecs__place_down(ecs_client_t *c, ecs_cli_srv_t *s) {
  ecs__cli_suspect(s, ECS_ECONN);
  c->next_refresh_ms = 0;
}

/* Rendezvous weight of key k on slot s: the node id seeds the key's hash,
 * so each (key, node) pair draws independently. */
static uint64_t hrw(const ecs_key_t *k, const ecs_cli_srv_t *s) {
  return XXH3_64bits_withSeed(k->data, k->len, XXH3_64bits(s->reg_id, strlen(s->reg_id)));
}

static int usable(const ecs_cli_srv_t *s, uint64_t now) {
  return s->live && !ecs__cli_is_suspect(s, now); /* its own failures, or others' marks */
}

static int taken_by(const size_t *taken, size_t ntaken, size_t i) {
  for (size_t r = 0; r < ntaken; r++)
    if (taken[r] == i)
      return 1;
  return 0;
}

size_t ecs__place_put(ecs_client_t *c, const ecs_key_t *k, uint64_t nbytes, uint64_t *load,
                      const size_t *taken, size_t ntaken) {
  uint64_t now = ecs_now_ms();
  /* local: the first copy on a local server when one is usable; further
   * copies (replicas), or none local: hash over all the others */
  int want_local = c->placement == ECS_PLACE_LOCAL && ntaken == 0;
  if (want_local) {
    want_local = 0;
    for (size_t i = 0; i < c->nsrv && !want_local; i++)
      want_local = usable(&c->srv[i], now) && c->srv[i].local;
  }
  size_t best = ECS_CLI_NOWHERE;
  uint64_t best_w = 0, best_free = 0;
  for (size_t i = 0; i < c->nsrv; i++) {
    const ecs_cli_srv_t *s = &c->srv[i];
    if (!usable(s, now) || (want_local && !s->local) || taken_by(taken, ntaken, i))
      continue;
    uint64_t w = hrw(k, s);
    if (c->placement == ECS_PLACE_LEAST_LOADED) {
      uint64_t fr = s->free_bytes > load[i] ? s->free_bytes - load[i] : 0;
      if (best == ECS_CLI_NOWHERE || fr > best_free || (fr == best_free && w > best_w)) {
        best = i;
        best_w = w;
        best_free = fr;
      }
    } else if (best == ECS_CLI_NOWHERE || w > best_w) {
      best = i;
      best_w = w;
    }
  }
  if (best != ECS_CLI_NOWHERE)
    load[best] += nbytes;
  return best;
}

int ecs__place_locate(ecs_client_t *c, const ecs_key_t *keys, size_t n, const int *ok, size_t *where) {
  for (size_t i = 0; i < n * ECS_CLI_MAX_COPIES; i++)
    where[i] = ECS_CLI_NOWHERE;
  const uint8_t **kp = malloc((n ? n : 1) * sizeof *kp);
  uint16_t *kl = malloc((n ? n : 1) * sizeof *kl);
  size_t *map = malloc((n ? n : 1) * sizeof *map);
  ecs_meta_rec_t *recs = malloc((n ? n : 1) * sizeof *recs);
  int *st = malloc((n ? n : 1) * sizeof *st);
  int rc = ECS_ENOMEM;
  if (!kp || !kl || !map || !recs || !st)
    goto out;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (ok[i] != ECS_OK)
      continue;
    kp[m] = keys[i].data;
    kl[m] = (uint16_t)keys[i].len;
    map[m++] = i;
  }
  ecs__cli_redis_budget(c);
  rc = m ? ecs_meta_lookup_batch(c->meta, kp, kl, m, recs, st) : ECS_OK;
  if (rc != ECS_OK) {
    ecs__cli_err(c, "discovery: cannot locate the batch's objects: Redis %s: %s", c->redis_s,
                 ecs_meta_errstr(c->meta));
    goto out;
  }
  /* A live holder (the lookup checked its node and epoch against the
   * registry) on a node this client has not seen yet at that epoch: it
   * joined or restarted since the last refresh, so read the registry now,
   * once, rather than call the copy a miss. */
  for (int pass = 0; pass < 2; pass++) {
    int unseen = 0;
    for (size_t j = 0; j < m; j++) {
      if (st[j] != ECS_OK)
        continue; /* no record, or a stale one (its holders died or restarted): a miss */
      size_t *w = &where[map[j] * ECS_CLI_MAX_COPIES], nw = 0;
      for (size_t h = 0; h < recs[j].nholders && nw < ECS_CLI_MAX_COPIES; h++) {
        ecs_cli_srv_t *s = slot_of(c, recs[j].holders[h].node_id);
        if (s && s->live && s->reg_epoch == recs[j].holders[h].epoch)
          w[nw++] = (size_t)(s - c->srv);
        else
          unseen = 1;
      }
      /* nearest first: a holder on this host (shm), then the others */
      for (size_t a = 1; a < nw; a++)
        for (size_t b = a; b > 0 && c->srv[w[b]].local && !c->srv[w[b - 1]].local; b--) {
          size_t t = w[b];
          w[b] = w[b - 1];
          w[b - 1] = t;
        }
      for (size_t r = nw; r < ECS_CLI_MAX_COPIES; r++)
        w[r] = ECS_CLI_NOWHERE;
    }
    if (!unseen || pass == 1 || ecs__place_refresh(c, 1) != ECS_OK)
      break;
  }
  c->errmsg[0] = '\0'; /* a failed refresh here only leaves misses */
out:
  free(kp);
  free(kl);
  free(map);
  free(recs);
  free(st);
  return rc;
}
