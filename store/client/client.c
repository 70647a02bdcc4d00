/*
 * libecstore client: the batch calls; see include/ecstore/ecstore.h.
 *
 * Each call (put, upsert, get, view, exists, remove) checks its items,
 * gives every item a status, and says in an ecs_cli_batch_kind_t what one
 * server's share of it does; client_route.c finds each item's server and
 * runs the shares.  A share hands its items to the data path its server is
 * on, through that path's operations table (store/client/client_priv.h):
 * the calls never know whether the bytes go over a socket, through shared
 * memory or by RDMA.  The requests that are the same on every path (exists,
 * remove, stat, ping) are built here.
 */
#include "ecstore/ecstore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/client/client_internal.h"
#include "store/client/client_priv.h"
#include "store/redis/meta.h"
#include "store/core/net.h"
#include "store/core/proto.h"

typedef ecs_cli_srv_t srv_t;
typedef ecs_cli_batch_kind_t batch_kind_t;

static int key_ok(const ecs_key_t *k) {
  return k->data && ecs_key_check(k->data, k->len) == ECS_OK;
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

typedef struct put_arg {
  const ecs_key_t *keys;
  const ecs_tensor_t *ts;
  int *status;
} put_arg_t;

static int put_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  put_arg_t *a = arg;
  int rc = ecs__cli_ensure(c, s, deadline);
  return rc ? rc : s->ops->put(c, s, a->keys, a->ts, idx, m, a->status, deadline);
}

static int put_status(void *arg, size_t i) {
  return ((put_arg_t *)arg)->status[i];
}

static void put_fail(void *arg, size_t i, int rc) {
  ((put_arg_t *)arg)->status[i] = rc;
}

static void put_again(void *arg, size_t i) {
  ((put_arg_t *)arg)->status[i] = ECS_OK;
}

static const batch_kind_t put_kind = {put_share, put_status, put_fail, put_again, 0, 0};
/* Replicas: the copies of a batch go to several servers at once. */
static const batch_kind_t put_copies_kind = {put_share, put_status, put_fail, put_again, 1, 0};

/* A put's item stored in a first round: not sent again (any nonzero
 * status keeps an item back; no ECS_* code is positive). */
#define PUT_DONE 1

/* Discovery: places the items still OK (where[i]); an item with no live
 * server anywhere gets ECS_ECONN. */
static void put_place(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *ts, size_t n, int *status,
                      size_t *where, uint64_t *load) {
  memset(load, 0, ECS_CLI_MAX_SERVERS * sizeof *load);
  int none = 0;
  for (size_t i = 0; i < n; i++) {
    where[i] =
        status[i] == ECS_OK ? ecs__place_put(c, &keys[i], ts[i].nbytes, load, NULL, 0) : ECS_CLI_NOWHERE;
    if (status[i] == ECS_OK && where[i] == ECS_CLI_NOWHERE) {
      status[i] = ECS_ECONN;
      none = 1;
    }
  }
  if (none)
    ecs__cli_err(c, "discovery: no live server in the registry of namespace '%s' (Redis %s)", c->ns_s,
                 c->redis_s);
}

/*
 * Replicas (discovery): item i's R copies are entries i*R .. i*R+R-1 of
 * one batch of n*R, each placed on a server none of the item's other
 * copies uses, and sent to every server at once (ecs__cli_run_batch, parallel).
 * A copy whose server could not be reached is placed again, once, on a
 * server left.  Item i is ECS_OK when at least one copy was stored (a
 * cache needs one copy to serve; fewer than R is counted in
 * copies_stored and said in errmsg), else the first copy's error.
 */
static int put_replicas(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *ts, size_t n, int *status,
                        size_t *wrote) {
  size_t R = (size_t)c->cfg.replicas, N = n * R;
  ecs_key_t *k2 = malloc((N ? N : 1) * sizeof *k2);
  ecs_tensor_t *t2 = malloc((N ? N : 1) * sizeof *t2);
  int *st2 = malloc((N ? N : 1) * sizeof *st2);
  size_t *w2 = malloc((N ? N : 1) * sizeof *w2);
  uint64_t load[ECS_CLI_MAX_SERVERS];
  int ret = ECS_ENOMEM;
  if (!k2 || !t2 || !st2 || !w2)
    goto out;
  ecs__place_refresh(c, 0);
  c->errmsg[0] = '\0';
  memset(load, 0, sizeof load);
  int none = 0;
  for (size_t i = 0; i < n; i++) {
    for (size_t r = 0; r < R; r++) {
      size_t e = i * R + r;
      k2[e] = keys[i];
      t2[e] = ts[i];
      st2[e] = status[i];
      w2[e] = status[i] == ECS_OK ? ecs__place_put(c, &keys[i], ts[i].nbytes, load, &w2[i * R], r)
                                  : ECS_CLI_NOWHERE;
      if (status[i] == ECS_OK && w2[e] == ECS_CLI_NOWHERE) {
        st2[e] = ECS_ECONN; /* fewer live servers than copies */
        none |= r == 0;
      }
    }
  }
  put_arg_t a = {k2, t2, st2};
  ret = ecs__cli_run_batch(c, k2, N, &put_copies_kind, &a, w2);
  for (size_t e = 0; e < N && ret == ECS_ENOMEM; e++)
    if (st2[e] == ECS_OK && w2[e] != ECS_CLI_NOWHERE)
      st2[e] = ECS_ENOMEM; /* never sent */
  /* Copies whose server could not be reached (it died and is still
   * listed until its registry entry expires): placed again, once. */
  int again = 0;
  for (size_t e = 0; e < N; e++) {
    if (wrote && (st2[e] == ECS_OK || st2[e] == ECS_EREDIS))
      wrote[(e / R) * ECS_CLI_MAX_COPIES + e % R] = w2[e];
    if (st2[e] == ECS_OK)
      st2[e] = PUT_DONE;
    else if (w2[e] != ECS_CLI_NOWHERE && (st2[e] == ECS_ECONN || st2[e] == ECS_ETIMEDOUT))
      again = 1;
  }
  if (again) {
    ecs__place_refresh(c, 1);
    c->errmsg[0] = '\0';
    memset(load, 0, sizeof load);
    for (size_t e = 0; e < N; e++) {
      if (w2[e] == ECS_CLI_NOWHERE || (st2[e] != ECS_ECONN && st2[e] != ECS_ETIMEDOUT)) {
        w2[e] = st2[e] == PUT_DONE ? w2[e] : ECS_CLI_NOWHERE;
        continue;
      }
      size_t i = e / R; /* not onto a server this item's copies already use or tried */
      size_t to = ecs__place_put(c, &keys[i], ts[i].nbytes, load, &w2[i * R], R);
      st2[e] = to == ECS_CLI_NOWHERE ? st2[e] : ECS_OK;
      w2[e] = to;
    }
    for (size_t e = 0; e < N; e++)
      if (st2[e] != ECS_OK)
        w2[e] = ECS_CLI_NOWHERE; /* kept for the exclusions above; not sent again */
    ret = ecs__cli_run_batch(c, k2, N, &put_copies_kind, &a, w2);
    for (size_t e = 0; e < N && ret == ECS_ENOMEM; e++)
      if (st2[e] == ECS_OK && w2[e] != ECS_CLI_NOWHERE)
        st2[e] = ECS_ENOMEM;
    for (size_t e = 0; e < N && wrote; e++)
      if (w2[e] != ECS_CLI_NOWHERE && (st2[e] == ECS_OK || st2[e] == ECS_EREDIS))
        wrote[(e / R) * ECS_CLI_MAX_COPIES + e % R] = w2[e];
  }
  size_t short_items = 0;
  c->copies_stored = 0;
  c->copies_wanted = 0;
  for (size_t i = 0; i < n; i++) {
    if (status[i] != ECS_OK)
      continue;
    size_t got = 0;
    int err = ECS_OK;
    for (size_t r = 0; r < R; r++) {
      int st = st2[i * R + r];
      if (st == ECS_OK || st == PUT_DONE)
        got++;
      else if (err == ECS_OK)
        err = st;
    }
    status[i] = got ? ECS_OK : err;
    c->copies_stored += got;
    c->copies_wanted += R;
    short_items += got < R;
  }
  int carried = 0; /* a share error that every item got past on other servers is no error */
  for (size_t i = 0; i < n && ret != ECS_OK; i++)
    carried |= status[i] == ret;
  if (!carried)
    ret = ECS_OK;
  if (none)
    ecs__cli_err(c, "discovery: no live server in the registry of namespace '%s' (Redis %s)", c->ns_s,
                 c->redis_s);
  else if (short_items && !c->errmsg[0])
    ecs__cli_err(c, "replicas: %zu of %zu items stored fewer than %zu copies (%zu of %zu copies stored)",
                 short_items, n, R, c->copies_stored, c->copies_wanted);
out:
  free(k2);
  free(t2);
  free(st2);
  free(w2);
  return ret;
}

/* wrote, when not NULL (n * ECS_CLI_MAX_COPIES entries, ECS_CLI_NOWHERE on
 * entry): with discovery, the servers each item's copies were stored on. */
static int put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                     int *status, size_t *wrote) {
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++)
    status[i] = put_validate(&keys[i], &tensors[i]);
  c->copies_stored = c->copies_wanted = 0;
  if (c->discover && c->cfg.replicas > 1)
    return put_replicas(c, keys, tensors, n, status, wrote);
  put_arg_t a = {keys, tensors, status};
  size_t *where = calloc(n ? n : 1, sizeof *where);
  uint64_t load[ECS_CLI_MAX_SERVERS];
  if (!where)
    return ECS_ENOMEM;
  int ret;
  size_t sent = 0;
  for (size_t i = 0; i < n; i++)
    sent += status[i] == ECS_OK;
  if (!c->discover) {
    for (size_t i = 0; i < n; i++)
      where[i] = ecs__cli_route(c, &keys[i]);
    ret = ecs__cli_run_batch(c, keys, n, &put_kind, &a, where);
  } else {
    ecs__place_refresh(c, 0);
    c->errmsg[0] = '\0';
    put_place(c, keys, tensors, n, status, where, load);
    ret = ecs__cli_run_batch(c, keys, n, &put_kind, &a, where);
    /* A server that could not be reached (it died, and the registry still
     * lists it until its entry expires): place its items again, once, on
     * the servers left (ecs__cli_run_batch marked it down). */
    int again = 0;
    for (size_t i = 0; i < n; i++) {
      if (wrote && where[i] != ECS_CLI_NOWHERE && (status[i] == ECS_OK || status[i] == ECS_EREDIS))
        wrote[i * ECS_CLI_MAX_COPIES] = where[i];
      if (where[i] != ECS_CLI_NOWHERE && (status[i] == ECS_ECONN || status[i] == ECS_ETIMEDOUT)) {
        status[i] = ECS_OK;
        again = 1;
      } else if (status[i] == ECS_OK) {
        status[i] = PUT_DONE;
      }
    }
    if (again) {
      ecs__place_refresh(c, 1);
      c->errmsg[0] = '\0';
      put_place(c, keys, tensors, n, status, where, load);
      ret = ecs__cli_run_batch(c, keys, n, &put_kind, &a, where);
      for (size_t i = 0; i < n && wrote; i++)
        if (where[i] != ECS_CLI_NOWHERE && (status[i] == ECS_OK || status[i] == ECS_EREDIS))
          wrote[i * ECS_CLI_MAX_COPIES] = where[i];
    }
    for (size_t i = 0; i < n; i++)
      if (status[i] == PUT_DONE)
        status[i] = ECS_OK;
  }
  for (size_t i = 0; i < n; i++)
    c->copies_stored += status[i] == ECS_OK;
  c->copies_wanted = sent;
  /* ECS_EREDIS on an item: the server stored it but Redis did not
   * acknowledge its record in time (docs/redis-schema.md, "Writes"). */
  size_t unpublished = 0;
  for (size_t i = 0; i < n; i++)
    unpublished += status[i] == ECS_EREDIS;
  if (unpublished && !c->errmsg[0])
    snprintf(c->errmsg, sizeof c->errmsg,
             "%zu of %zu items stored but not yet published to Redis (Redis slow or down): gets find them, "
             "exists through Redis says 0 until the server re-publishes them",
             unpublished, n);
  free(where);
  return ret;
}

int ecs_put_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                  int *status) {
  if (!c || (n && (!keys || !tensors || !status)))
    return ECS_EINVAL;
  c->put_flags = 0;
  ecs__cli_begin(c);
  return ecs__cli_end(c, put_batch(c, keys, tensors, n, status, NULL));
}

/* ------------------------------------------------------------------ */
/* get                                                                  */

typedef struct get_arg {
  const ecs_key_t *keys;
  ecs_get_buf_t *bufs;
  int alloc;
} get_arg_t;

static int get_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  get_arg_t *a = arg;
  int rc = ecs__cli_ensure(c, s, deadline);
  return rc ? rc : s->ops->get(c, s, a->keys, a->bufs, idx, m, a->alloc, deadline);
}

static int get_status(void *arg, size_t i) {
  return ((get_arg_t *)arg)->bufs[i].status;
}

static void get_fail(void *arg, size_t i, int rc) {
  get_arg_t *a = arg;
  ecs_get_buf_t *b = &a->bufs[i];
  if (a->alloc) {
    free(b->data);
    b->data = NULL;
  }
  b->status = rc;
  b->nbytes = 0;
}

static void get_again(void *arg, size_t i) {
  get_arg_t *a = arg;
  ecs_get_buf_t *b = &a->bufs[i];
  if (a->alloc) {
    free(b->data);
    b->data = NULL;
  }
  b->status = ECS_OK;
  b->nbytes = 0;
  memset(&b->desc, 0, sizeof b->desc);
}

static const batch_kind_t get_kind = {get_share, get_status, get_fail, get_again, 1, ECS_CLI_GONE_MISS};

static int get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n, int alloc) {
  if (!c || (n && (!keys || !bufs)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (alloc)
      bufs[i].data = NULL;
    bufs[i].nbytes = 0;
    memset(&bufs[i].desc, 0, sizeof bufs[i].desc);
    bufs[i].status = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
  }
  get_arg_t a = {keys, bufs, alloc};
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  if (!where)
    return ECS_ENOMEM;
  int ret = ecs__cli_locate(c, keys, n, &get_kind, &a, where);
  if (ret == ECS_OK)
    ret = ecs__cli_run_nearest(c, n, &get_kind, &a, where);
  free(where);
  if (alloc) { /* only OK items keep a buffer */
    for (size_t i = 0; i < n; i++) {
      if (bufs[i].status != ECS_OK && bufs[i].data) {
        free(bufs[i].data);
        bufs[i].data = NULL;
      }
    }
  }
  return ret;
}

int ecs_get_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  if (!c)
    return ECS_EINVAL;
  ecs__cli_begin(c);
  return ecs__cli_end(c, get_batch(c, keys, bufs, n, 0));
}

int ecs_get_batch_alloc(ecs_client_t *c, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  if (!c)
    return ECS_EINVAL;
  ecs__cli_begin(c);
  return ecs__cli_end(c, get_batch(c, keys, bufs, n, 1));
}

/* ------------------------------------------------------------------ */
/* views                                                                */

typedef struct view_arg {
  const ecs_key_t *keys;
  ecs_view_t *views;
} view_arg_t;

static int view_share(ecs_client_t *c, srv_t *s, const size_t *idx, size_t m, void *arg, uint64_t deadline) {
  view_arg_t *a = arg;
  int rc = ecs__cli_ensure(c, s, deadline);
  if (rc)
    return rc;
  if (!s->ops->view) { /* the bytes are not mapped here */
    for (size_t j = 0; j < m; j++)
      a->views[idx[j]].status = ECS_ENOTSUP;
    return ECS_OK;
  }
  return s->ops->view(c, s, a->keys, a->views, idx, m, deadline);
}

static int view_status(void *arg, size_t i) {
  return ((view_arg_t *)arg)->views[i].status;
}

static void view_fail(void *arg, size_t i, int rc) {
  ((view_arg_t *)arg)->views[i].status = rc;
}

static void view_again(void *arg, size_t i) {
  ecs_view_t *v = &((view_arg_t *)arg)->views[i];
  memset(v, 0, sizeof *v);
  v->status = ECS_OK;
}

static const batch_kind_t view_kind = {view_share, view_status, view_fail, view_again, 0, ECS_CLI_GONE_MISS};

static int get_view_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_view_t *views, size_t n);

int ecs_get_view_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_view_t *views, size_t n) {
  if (!c)
    return ECS_EINVAL;
  ecs__cli_begin(c);
  return ecs__cli_end(c, get_view_batch(c, keys, views, n));
}

static int get_view_batch(ecs_client_t *c, const ecs_key_t *keys, ecs_view_t *views, size_t n) {
  if (!c || (n && (!keys || !views)))
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    memset(&views[i], 0, sizeof views[i]);
    views[i].status = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
  }
  view_arg_t a = {keys, views};
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  if (!where)
    return ECS_ENOMEM;
  int ret = ecs__cli_locate(c, keys, n, &view_kind, &a, where);
  if (ret == ECS_OK)
    ret = ecs__cli_run_nearest(c, n, &view_kind, &a, where);
  free(where);
  return ret;
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
  ecs_hdr_t h;
  rc = ecs__cli_call(c, s, op, (uint32_t)m, NULL, 0, 0, ECS_CALL_COUNT, NULL, &h, deadline);
  if (rc)
    return ecs__cli_fail(c, s, rc);
  rc = ecs__cli_read_statuses(c, &h, idx, m, out);
  return rc ? ecs__cli_fail(c, s, rc) : ECS_OK;
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

static int keys_status(void *arg, size_t i) {
  return ((keys_arg_t *)arg)->out[i];
}

static void keys_fail(void *arg, size_t i, int rc) {
  ((keys_arg_t *)arg)->out[i] = rc;
}

static void keys_again(void *arg, size_t i) {
  ((keys_arg_t *)arg)->out[i] = ECS_OK;
}

/* A holder that cannot be reached answers its items alone (remove: a miss
 * when refused, ECS_ETIMEDOUT when timed out), never the whole call
 * (issue 24: remove batches failed with ECONN for 8-10 s after a holder's
 * kill -9, while gets counted the same keys as misses).  Shares run in
 * parallel, so one stopped holder costs the call one deadline. */
static const batch_kind_t keys_kind = {keys_share, keys_status, keys_fail, keys_again, 1, ECS_CLI_GONE_ITEM};

/* exists / remove on every copy (replicas): item i is sent to each of its
 * holders in turn, and is ECS_OK when any holder answered OK (it held the
 * key, or removed it), else the first holder's answer. */
static int keys_batch(ecs_client_t *c, uint8_t op, const ecs_key_t *keys, size_t n, int *out) {
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < n; i++)
    out[i] = key_ok(&keys[i]) ? ECS_OK : ECS_EKEY;
  keys_arg_t a = {keys, op, out};
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  size_t *cur = malloc((n ? n : 1) * sizeof *cur);
  int *st = malloc((n ? n : 1) * sizeof *st);
  int ret = ECS_ENOMEM;
  if (!where || !cur || !st)
    goto out;
  ret = ecs__cli_locate(c, keys, n, &keys_kind, &a, where);
  if (ret != ECS_OK)
    goto out;
  for (size_t i = 0; i < n; i++)
    cur[i] = where[i * ECS_CLI_MAX_COPIES];
  ret = ecs__cli_run_batch(c, keys, n, &keys_kind, &a, cur);
  keys_arg_t b = {keys, op, st};
  for (size_t r = 1; r < ECS_CLI_MAX_COPIES; r++) {
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
      cur[i] = where[i * ECS_CLI_MAX_COPIES + r];
      st[i] = cur[i] == ECS_CLI_NOWHERE ? ECS_ENOTFOUND : ECS_OK;
      more += cur[i] != ECS_CLI_NOWHERE;
    }
    if (!more)
      break;
    int rc = ecs__cli_run_batch(c, keys, n, &keys_kind, &b, cur);
    if (rc && !ret)
      ret = rc;
    for (size_t i = 0; i < n; i++)
      if (cur[i] != ECS_CLI_NOWHERE && st[i] == ECS_OK)
        out[i] = ECS_OK;
  }
  int carried = 0; /* an error every item got past on another copy is no error */
  for (size_t i = 0; i < n && ret != ECS_OK && ret != ECS_ENOMEM; i++)
    carried |= out[i] == ret;
  if (ret != ECS_OK && ret != ECS_ENOMEM && !carried)
    ret = ECS_OK;
out:
  free(where);
  free(cur);
  free(st);
  return ret;
}

/* ---- upsert: a put that replaces every copy ---- */

/* An upsert replaces an object, but with discovery Redis may list copies
 * on servers this upsert did not write: put there before a join or leave
 * moved the key's rank, or by a put with more replicas.  Those still hold
 * the old bytes and a get could read one, so they are removed (each
 * server then drops its own holder entry).  Best effort: one lookup round
 * trip and a REMOVE per such server; the upsert's statuses stand. */
static void upsert_drop_others(ecs_client_t *c, const ecs_key_t *keys, size_t n, const int *status,
                               const size_t *wrote) {
  size_t *where = malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *where);
  size_t *cur = malloc((n ? n : 1) * sizeof *cur);
  int *st = malloc((n ? n : 1) * sizeof *st);
  char saved[sizeof c->errmsg];
  snprintf(saved, sizeof saved, "%s", c->errmsg);
  if (!where || !cur || !st)
    goto out;
  for (size_t i = 0; i < n; i++)
    st[i] = status[i] == ECS_OK || status[i] == ECS_EREDIS ? ECS_OK : ECS_ENOTFOUND;
  keys_arg_t a = {keys, ECS_OP_REMOVE, st};
  if (ecs__cli_locate(c, keys, n, &keys_kind, &a, where) != ECS_OK)
    goto out;
  for (size_t r = 0; r < ECS_CLI_MAX_COPIES; r++) {
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
      size_t s = where[i * ECS_CLI_MAX_COPIES + r];
      int mine = s == ECS_CLI_NOWHERE || (status[i] != ECS_OK && status[i] != ECS_EREDIS);
      for (size_t w = 0; w < ECS_CLI_MAX_COPIES && !mine; w++)
        mine = wrote[i * ECS_CLI_MAX_COPIES + w] == s;
      cur[i] = mine ? ECS_CLI_NOWHERE : s;
      st[i] = mine ? ECS_ENOTFOUND : ECS_OK;
      more += !mine;
    }
    if (more)
      (void)ecs__cli_run_batch(c, keys, n, &keys_kind, &a, cur);
  }
out:
  snprintf(c->errmsg, sizeof c->errmsg, "%s", saved);
  free(where);
  free(cur);
  free(st);
}

/* The same path as a put with one flag on every item; the server does the
 * replacing (store/server/objstore.h, reserve_replace). */
int ecs_upsert_batch(ecs_client_t *c, const ecs_key_t *keys, const ecs_tensor_t *tensors, size_t n,
                     int *status) {
  if (!c || (n && (!keys || !tensors || !status)))
    return ECS_EINVAL;
  c->put_flags = ECS_PUT_F_UPSERT;
  size_t *wrote = c->discover ? malloc((n ? n : 1) * ECS_CLI_MAX_COPIES * sizeof *wrote) : NULL;
  if (c->discover && !wrote) {
    c->put_flags = 0;
    return ECS_ENOMEM;
  }
  for (size_t i = 0; wrote && i < n * ECS_CLI_MAX_COPIES; i++)
    wrote[i] = ECS_CLI_NOWHERE;
  ecs__cli_begin(c);
  int ret = put_batch(c, keys, tensors, n, status, wrote);
  c->put_flags = 0;
  if (wrote && ret == ECS_OK)
    upsert_drop_others(c, keys, n, status, wrote);
  free(wrote);
  return ecs__cli_end(c, ret);
}

int ecs_remove_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *status) {
  if (!c || (n && (!keys || !status)))
    return ECS_EINVAL;
  ecs__cli_begin(c);
  return ecs__cli_end(c, keys_batch(c, ECS_OP_REMOVE, keys, n, status));
}

static int exists_from_servers(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists);
static int exists_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists);

int ecs_exists_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  if (!c || (n && (!keys || !exists)))
    return ECS_EINVAL;
  ecs__cli_begin(c);
  return ecs__cli_end(c, exists_batch(c, keys, n, exists));
}

static int exists_batch(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
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
        ecs__cli_redis_budget(c); /* a frozen Redis: the servers answer after this */
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
    if (rc != ECS_ECONN && rc != ECS_ETIMEDOUT && rc != ECS_EREDIS)
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
/* Discovery with Redis unreachable: nothing says which server holds what,
 * so every server the client last saw in the registry is asked about every
 * key, all of them at once (a thread per server) and within the call's one
 * deadline; a key exists when any of them holds it.  Round r sends item i
 * to server (i + r) mod L, so each round spreads the keys over every
 * server.  A server that cannot be reached answers nothing for its items
 * (absent, as for a get: for a cache the copy went with its server); the
 * call fails only when no server is known.  (issue 24: exists failed
 * whole batches with ECONN while Redis was down.) */
static int exists_ask_all(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  size_t live[ECS_CLI_MAX_SERVERS], nl = 0;
  for (size_t s = 0; s < c->nsrv; s++)
    if (c->srv[s].live)
      live[nl++] = s;
  if (nl == 0) {
    ecs__cli_err(c, "no server known to ask (Redis unreachable: %s)", ecs_meta_errstr(c->meta));
    return ECS_ECONN;
  }
  int *st = malloc(n * sizeof *st);
  size_t *cur = malloc(n * sizeof *cur);
  if (!st || !cur) {
    free(st);
    free(cur);
    return ECS_ENOMEM;
  }
  uint64_t deadline = ecs__cli_deadline(c);
  for (size_t r = 0; r < nl && ecs_now_ms() < deadline; r++) {
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
      int ask = !exists[i] && key_ok(&keys[i]);
      st[i] = ask ? ECS_OK : ECS_ENOTFOUND;
      cur[i] = ask ? live[(i + r) % nl] : ECS_CLI_NOWHERE;
      more += ask;
    }
    if (!more)
      break;
    keys_arg_t a = {keys, ECS_OP_EXISTS, st};
    (void)ecs__cli_run_batch(c, keys, n, &keys_kind, &a, cur);
    for (size_t i = 0; i < n; i++)
      if (cur[i] != ECS_CLI_NOWHERE && st[i] == ECS_OK)
        exists[i] = 1;
  }
  c->errmsg[0] = '\0';
  free(st);
  free(cur);
  return ECS_OK;
}

static int exists_from_servers(ecs_client_t *c, const ecs_key_t *keys, size_t n, int *exists) {
  if (c->discover && c->meta)
    return exists_ask_all(c, keys, n, exists);
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
  rc = ecs__cli_call(c, s, op, 0, NULL, 0, 0, 0, NULL, h, deadline);
  if (rc != ECS_OK && h->status == ECS_OK) /* not the server's answer: the stream is lost */
    return ecs__cli_fail(c, s, rc);
  return rc;
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

_Static_assert(ECS_STAT_UNKNOWN == ECS_STAT_ABSENT, "a counter the reply lacks reads as unknown");

int ecs_stat(ecs_client_t *c, size_t server, ecs_server_stat_t *st) {
  return ecs_stat_ext(c, server, st, NULL);
}

int ecs_stat_ext(ecs_client_t *c, size_t server, ecs_server_stat_t *st, ecs_server_stat_ext_t *ext) {
  if (!c || !st || server >= c->nsrv)
    return ECS_EINVAL;
  c->errmsg[0] = '\0';
  srv_t *s = &c->srv[server];
  ecs_hdr_t h;
  ecs__cli_begin(c);
  int rc = ecs__cli_end(c, simple_rpc(c, s, ECS_OP_STAT, NULL, NULL, 0, &h));
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
  if (ext) {
    memset(ext, 0, sizeof *ext);
    ext->pool_cuda_registered = sr.pool_cuda_registered;
  }
  return ECS_OK;
}

static int ping(ecs_client_t *c);

int ecs_ping(ecs_client_t *c) {
  if (!c)
    return ECS_EINVAL;
  ecs__cli_begin(c);
  return ecs__cli_end(c, ping(c));
}

static int ping(ecs_client_t *c) {
  c->errmsg[0] = '\0';
  ecs__cli_redis_budget(c);
  ecs__place_refresh(c, 0);
  c->errmsg[0] = '\0';
  for (size_t i = 0; i < c->nsrv; i++) {
    ecs_hdr_t h;
    if (!c->srv[i].live) /* departed (discovery) */
      continue;
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
  int st = ECS_OK;
  size_t where[ECS_CLI_MAX_COPIES]; /* the nearest copy is the one corrupted */
  int rc = ecs__cli_locate(c, &k, 1, &keys_kind, &(keys_arg_t){&k, ECS_OP_DEBUG, &st}, where);
  if (rc || st)
    return rc ? rc : st;
  return simple_rpc(c, &c->srv[where[0]], ECS_OP_DEBUG, build_corrupt, key, key_len, &h);
}

int ecs__client_server_fd(ecs_client_t *c, size_t server) {
  return server < c->nsrv ? c->srv[server].fd : -1;
}

int ecs__client_reconnect(ecs_client_t *c, size_t server, int left_ms) {
  if (server >= c->nsrv || left_ms < 0)
    return ECS_EINVAL;
  ecs__cli_drop(&c->srv[server]);
  return ecs__cli_ensure(c, &c->srv[server], ecs_now_ms() + (uint64_t)left_ms);
}

const char *ecs_client_transport(const ecs_client_t *c) {
  /* a server not connected now counts as tcp: that is where it starts */
  const char *name = NULL;
  for (size_t i = 0; i < c->nsrv; i++) {
    if (c->discover && !c->srv[i].ops)
      continue; /* discovered servers are connected when used: only those count */
    const char *n = c->srv[i].ops ? c->srv[i].ops->name : ecs__cli_tcp_ops.name;
    if (name && strcmp(name, n) != 0)
      return "mixed";
    name = n;
  }
  return name ? name : "tcp";
}
