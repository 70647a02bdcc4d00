/*
 * libecstore client: where objects are (ecs_locate_batch) and pulls into a
 * server (ecs_pull_batch): the server fetches each object from its holder
 * into its own pool, so a process on that server's host reads it there
 * (ecs_get_view_batch) without the bytes ever passing through a client.
 */
#include "ecstore/ecstore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/client/client_priv.h"
#include "store/core/net.h"
#include "store/core/proto.h"

/* ---- locate ---- */

static int loc_status(void *arg, size_t i) {
  return ((ecs_holder_t *)arg)[i].status;
}

static void loc_fail(void *arg, size_t i, int rc) {
  ((ecs_holder_t *)arg)[i].status = rc;
}

static const ecs_cli_batch_kind_t loc_kind = {NULL, loc_status, loc_fail, NULL, 0, ECS_CLI_GONE_MISS};

int ecs_locate_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, ecs_holder_t *out) {
  if (!c || (n && (!keys || !out)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].status = keys[i].data && ecs_key_check(keys[i].data, keys[i].len) == ECS_OK ? ECS_OK : ECS_EKEY;
  }
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  if (!where)
    return ECS_ENOMEM;
  ecs__cli_begin(c);
  int rc = ecs__cli_locate(c, keys, n, &loc_kind, out, where);
  for (size_t i = 0; i < n; i++) {
    if (out[i].status != ECS_OK)
      continue;
    const ecs_cli_srv_t *s = &c->srv[where[i * ECS_CLI_MAX_COPIES]];
    snprintf(out[i].node_id, sizeof out[i].node_id, "%s", s->reg_id[0] ? s->reg_id : s->node_id);
    snprintf(out[i].addr, sizeof out[i].addr, "%s", s->addr);
    out[i].local = s->local;
  }
  free(where);
  return ecs__cli_end(c, rc);
}

/* ---- pull ---- */

/* How much of the call's time the server's fetch may use: the rest is for
 * its reply to come back before the call gives up on it. */
static uint32_t fetch_budget(uint64_t deadline) {
  uint64_t now = ecs_now_ms();
  uint64_t left = deadline > now ? deadline - now : 1;
  uint64_t margin = left / 10 < 200 ? left / 10 : 200;
  left -= margin;
  return left > UINT32_MAX ? UINT32_MAX : (uint32_t)(left ? left : 1);
}

static int pull_some(ecs_client_t *c, ecs_cli_srv_t *s, const ecs_key_t *keys, const char *const *holders,
                     const size_t *idx, size_t m, int *status, uint64_t deadline) {
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  ecs_wbuf_reset(&c->w);
  uint32_t budget = fetch_budget(deadline);
  for (size_t j = 0; j < m; j++) {
    const ecs_key_t *k = &keys[idx[j]];
    ecs_pull_item_t it = {.key = k->data,
                          .key_len = (uint16_t)k->len,
                          .addr = holders[idx[j]],
                          .addr_len = (uint16_t)strlen(holders[idx[j]]),
                          .timeout_ms = budget};
    ecs_proto_pull_item_write(&c->w, &it);
  }
  if (c->w.err)
    return c->w.err;
  ecs_hdr_t h;
  rc = ecs__cli_call(c, s, ECS_OP_PULL, (uint32_t)m, NULL, 0, 0, ECS_CALL_COUNT, "pull", &h, deadline);
  if (rc != ECS_OK && h.status == ECS_EPROTO) {
    /* A server older than PULL takes the opcode for a framing error and
     * closes the connection. */
    ecs__cli_drop(s);
    ecs__cli_err(c, "%s does not know PULL (a server older than this client)", s->addr);
    return ECS_ENOTSUP;
  }
  if (rc != ECS_OK && h.status != ECS_OK)
    return rc; /* refused as a whole (ECS_ENOTSUP: no registry there; ECS_EPERM): the connection stays */
  if (rc != ECS_OK)
    return ecs__cli_fail(c, s, rc);
  rc = ecs__cli_read_statuses(c, &h, idx, m, status);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
}

int ecs_pull_batch(ecs_client_t *c, size_t server, const ecs_key_t *keys, const char *const *holders,
                   size_t n, int *status) {
  if (!c || server >= c->nsrv || (n && (!keys || !holders || !status)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  size_t *idx = malloc((n ? n : 1) * sizeof *idx);
  if (!idx)
    return ECS_ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    size_t al = holders[i] ? strnlen(holders[i], ECS_PULL_MAX_ADDR + 1) : 0;
    if (!keys[i].data || ecs_key_check(keys[i].data, keys[i].len) != ECS_OK)
      status[i] = ECS_EKEY;
    else if (al == 0 || al > ECS_PULL_MAX_ADDR)
      status[i] = ECS_EINVAL;
    else {
      status[i] = ECS_OK;
      idx[m++] = i;
    }
  }
  ecs__cli_begin(c);
  uint64_t deadline = ecs__cli_deadline(c);
  ecs_cli_srv_t *s = &c->srv[server];
  int ret = ECS_OK;
  for (size_t off = 0; off < m; off += ECS_PROTO_MAX_ITEMS) {
    size_t k = m - off < ECS_PROTO_MAX_ITEMS ? m - off : ECS_PROTO_MAX_ITEMS;
    int rc = pull_some(c, s, keys, holders, idx + off, k, status, deadline);
    if (rc != ECS_OK) {
      for (size_t j = off; j < m; j++)
        status[idx[j]] = rc;
      ret = rc;
      break;
    }
  }
  free(idx);
  return ecs__cli_end(c, ret);
}
