/*
 * Redis metadata: clients' suspicion marks (store/redis/meta.h,
 * docs/redis-schema.md).
 *
 * A client that finds a node unreachable marks it, ecs:{ns}:suspect:{id}
 * = the node's epoch with a TTL of its back-off, so that other clients
 * stop waiting on it too (issue 24: a cut-off holder cost every client
 * its own timeout).  The writes never wait: they go out as the blocking
 * link's fire-and-forget commands.  The reads ride in the registry
 * listing's pipeline (ecs_meta_nodes), so a refresh costs no extra round
 * trip.  A mark only ever makes a reader skip a node for a while: it
 * carries no address and names an epoch, so a restarted node is not
 * covered by its old marks, and a mark without a TTL is ignored.
 */
#include "store/redis/meta_internal.h"

#include <stdio.h>
#include <string.h>

#include "ecstore/error.h"

/* "ecs:{ns}:suspect:{id}" into key (cap bytes); its length, 0 if too long. */
static size_t sus_key(const ecs_meta_t *m, const char *id, size_t id_len, char *key, size_t cap) {
  size_t pl = strlen(m->sus_pfx);
  if (id_len == 0 || pl + id_len >= cap)
    return 0;
  memcpy(key, m->sus_pfx, pl);
  memcpy(key + pl, id, id_len);
  key[pl + id_len] = '\0';
  return pl + id_len;
}

static int sus_send(ecs_meta_t *m, int argc, const char **argv, const size_t *lens) {
  int rc = ecs__rds_send_noreply(&m->link, argc, argv, lens);
  if (rc != ECS_OK && rc != ECS_ENOTCONN)
    ecs__meta_seterr(m, "%s", ecs__rds_errmsg(&m->link));
  return rc == ECS_ECONN ? ECS_ENOTCONN : rc;
}

int ecs_meta_mark_suspect(ecs_meta_t *m, const char *node_id, uint64_t epoch, int ttl_ms) {
  if (m == NULL || ecs__meta_check_name(node_id, 63) != 0 || ttl_ms <= 0)
    return ECS_EINVAL;
  char key[sizeof m->sus_pfx + 64], ep[24], px[16];
  size_t kl = sus_key(m, node_id, strlen(node_id), key, sizeof key);
  if (kl == 0)
    return ECS_EINVAL;
  snprintf(ep, sizeof ep, "%llu", (unsigned long long)epoch);
  snprintf(px, sizeof px, "%d", ttl_ms);
  const char *argv[] = {"SET", key, ep, "PX", px};
  size_t lens[] = {3, kl, strlen(ep), 2, strlen(px)};
  return sus_send(m, 5, argv, lens);
}

int ecs_meta_clear_suspect(ecs_meta_t *m, const char *node_id) {
  if (m == NULL || ecs__meta_check_name(node_id, 63) != 0)
    return ECS_EINVAL;
  char key[sizeof m->sus_pfx + 64];
  size_t kl = sus_key(m, node_id, strlen(node_id), key, sizeof key);
  if (kl == 0)
    return ECS_EINVAL;
  const char *argv[] = {"DEL", key};
  size_t lens[] = {3, kl};
  return sus_send(m, 2, argv, lens);
}

int ecs__meta_suspect_append(ecs_meta_t *m, const char *id, size_t id_len) {
  char key[sizeof m->sus_pfx + 64];
  size_t kl = sus_key(m, id, id_len, key, sizeof key);
  if (kl == 0)
    return ECS_EINVAL;
  const char *get[] = {"GET", key};
  const char *pttl[] = {"PTTL", key};
  size_t lens[] = {0, kl};
  lens[0] = 3;
  int rc = ecs__meta_append(m, 2, get, lens);
  lens[0] = 4;
  return rc == ECS_OK ? ecs__meta_append(m, 2, pttl, lens) : rc;
}

int ecs__meta_suspect_read(ecs_meta_t *m, uint64_t epoch, uint64_t deadline, uint64_t *ms) {
  redisReply *v, *t;
  *ms = 0;
  int rc = ecs__meta_reply(m, &v, deadline);
  if (rc != ECS_OK)
    return rc;
  rc = ecs__meta_reply(m, &t, deadline);
  if (rc != ECS_OK) {
    freeReplyObject(v);
    return rc;
  }
  /* anything but our own shape (another type, no TTL, another epoch) is
   * no mark: a mark can only ever be a short, checked "skip it a while" */
  uint64_t ep;
  if (v->type == REDIS_REPLY_STRING && ecs__rds_parse_u64(v->str, v->len, &ep) == 0 && ep == epoch &&
      t->type == REDIS_REPLY_INTEGER && t->integer > 0)
    *ms = (uint64_t)t->integer;
  freeReplyObject(v);
  freeReplyObject(t);
  return ECS_OK;
}
