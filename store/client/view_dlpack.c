/*
 * DLPack tensors over views (ecs_dlbox_*), for bindings that hand a view's
 * bytes to a framework without a copy and must learn when the framework
 * let go of them.
 *
 * Python's torch.from_dlpack turns one DLManagedTensor into a tensor with
 * the view's dtype and shape in about half a microsecond, and calls the
 * tensor's deleter when the last tensor over the bytes dies (slices
 * included: they share the storage the deleter belongs to).  Building a
 * tensor through numpy costs ~15 us an item (an array-interface object,
 * numpy's parse of it, from_numpy, two views), which was most of a vLLM
 * load step's hold.
 *
 * The deleter may run on any thread, holding no Python lock, after the
 * binding's objects are gone: so it only queues the item's token in the
 * box (never allocating: wrap reserved the room), and the owner's thread
 * drains the tokens and releases the views (a view's pins belong to its
 * client's thread).  The box lives until its owner closed it and every
 * block's last deleter ran.
 *
 * The DLPack structs below are the unversioned ABI (DLPack 0.x, still
 * what every framework's from_dlpack takes as a "dltensor" capsule).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ecstore/ecstore.h>

/* DLPack's ABI (dlpack.h, v0.8): device, dtype, tensor, managed tensor. */
typedef struct {
  int32_t device_type; /* kDLCPU = 1 */
  int32_t device_id;
} ecs__dl_device_t;

typedef struct {
  uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4 */
  uint8_t bits;
  uint16_t lanes;
} ecs__dl_dtype_t;

typedef struct {
  void *data;
  ecs__dl_device_t device;
  int32_t ndim;
  ecs__dl_dtype_t dtype;
  int64_t *shape;
  int64_t *strides; /* NULL: compact, row-major */
  uint64_t byte_offset;
} ecs__dl_tensor_t;

typedef struct ecs__dl_managed {
  ecs__dl_tensor_t dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct ecs__dl_managed *self);
} ecs__dl_managed_t;

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_CPU = 1 };

struct dl_block;

/* One tensor of a wrap call. */
typedef struct {
  ecs__dl_managed_t m;         /* handed out; m.manager_ctx points here */
  int64_t shape[ECS_MAX_DIMS]; /* m.dl_tensor.shape */
  uint64_t token;              /* queued by the deleter */
  struct dl_block *blk;        /* the allocation this item lives in */
} dl_item_t;

/* The items of one wrap call: one allocation, freed with its last item. */
typedef struct dl_block {
  struct ecs_dlbox *box; /* the owner's box */
  size_t live;           /* items whose deleter has not run */
  dl_item_t items[];     /* the call's n items (those not made stay unused) */
} dl_block_t;

struct ecs_dlbox {
  pthread_mutex_t mu; /* guards everything below */
  uint64_t *q;        /* tokens of items whose deleter ran, not drained yet */
  size_t qlen;        /* tokens in q */
  size_t qcap;        /* room in q: always >= qlen + live, so a deleter never allocates */
  size_t live;        /* items made and not yet deleted, over all blocks */
  size_t refs;        /* 1 while the owner holds the box, + blocks with live items */
  int closed;         /* the owner let go: deleters queue nothing */
};

static void box_free(struct ecs_dlbox *box) {
  pthread_mutex_destroy(&box->mu);
  free(box->q);
  free(box);
}

int ecs_dlbox_new(ecs_dlbox_t **out) {
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  struct ecs_dlbox *box = calloc(1, sizeof(*box));
  if (!box)
    return ECS_ENOMEM;
  if (pthread_mutex_init(&box->mu, NULL) != 0) {
    free(box);
    return ECS_ENOMEM;
  }
  box->refs = 1;
  *out = box;
  return ECS_OK;
}

/* The type the framework imports a dtype as; a dtype frameworks may lack
 * (float8, unsigned wider than a byte, bool) travels as a carrier of the
 * same size, and the binding views it as the stored one. */
static int dl_dtype(int dtype, ecs__dl_dtype_t *out) {
  static const ecs__dl_dtype_t table[ECS_DTYPE__COUNT] = {
      [ECS_DTYPE_F32] = {DL_FLOAT, 32, 1},   [ECS_DTYPE_F16] = {DL_FLOAT, 16, 1},
      [ECS_DTYPE_BF16] = {DL_BFLOAT, 16, 1}, [ECS_DTYPE_F8E4M3] = {DL_UINT, 8, 1},
      [ECS_DTYPE_F8E5M2] = {DL_UINT, 8, 1},  [ECS_DTYPE_I8] = {DL_INT, 8, 1},
      [ECS_DTYPE_U8] = {DL_UINT, 8, 1},      [ECS_DTYPE_I32] = {DL_INT, 32, 1},
      [ECS_DTYPE_I64] = {DL_INT, 64, 1},     [ECS_DTYPE_F64] = {DL_FLOAT, 64, 1},
      [ECS_DTYPE_I16] = {DL_INT, 16, 1},     [ECS_DTYPE_U16] = {DL_INT, 16, 1},
      [ECS_DTYPE_U32] = {DL_INT, 32, 1},     [ECS_DTYPE_U64] = {DL_INT, 64, 1},
      [ECS_DTYPE_BOOL] = {DL_UINT, 8, 1},
  };
  if (dtype <= ECS_DTYPE_INVALID || dtype >= ECS_DTYPE__COUNT)
    return ECS_EDTYPE;
  *out = table[dtype];
  return ECS_OK;
}

/* Fills item from view v; ECS_OK when the view's description covers
 * exactly its bytes (else the item is not made). */
static int item_fill(dl_item_t *it, const ecs_view_t *v) {
  ecs__dl_dtype_t dt;
  if (dl_dtype(v->desc.dtype, &dt) != ECS_OK || v->desc.ndim > ECS_MAX_DIMS)
    return ECS_EDTYPE;
  uint64_t count = 1;
  for (int d = 0; d < v->desc.ndim; d++) {
    uint64_t s = v->desc.shape[d];
    if (s > INT64_MAX || (s && count > UINT64_MAX / s))
      return ECS_EDTYPE;
    count *= s;
    it->shape[d] = (int64_t)s;
  }
  if (count > UINT64_MAX / (dt.bits / 8) || count * (dt.bits / 8) != v->nbytes)
    return ECS_EDTYPE;
  memset(&it->m, 0, sizeof(it->m));
  it->m.dl_tensor.data = (void *)(uintptr_t)v->data; /* read-only by contract, as the view */
  it->m.dl_tensor.device.device_type = DL_CPU;
  it->m.dl_tensor.ndim = v->desc.ndim;
  it->m.dl_tensor.dtype = dt;
  it->m.dl_tensor.shape = it->shape;
  it->m.manager_ctx = it;
  return ECS_OK;
}

/* The framework's call when the last tensor over an item died. */
static void item_deleter(ecs__dl_managed_t *m) {
  if (!m || !m->manager_ctx)
    return;
  dl_item_t *it = m->manager_ctx;
  dl_block_t *blk = it->blk;
  struct ecs_dlbox *box = blk->box;
  int free_blk = 0, free_box = 0;
  pthread_mutex_lock(&box->mu);
  if (!box->closed)
    box->q[box->qlen++] = it->token; /* room reserved by wrap */
  box->live--;
  if (--blk->live == 0) {
    free_blk = 1;
    free_box = --box->refs == 0;
  }
  pthread_mutex_unlock(&box->mu);
  if (free_blk)
    free(blk);
  if (free_box)
    box_free(box);
}

int ecs_dlbox_wrap(ecs_dlbox_t *box, const ecs_view_t *views, size_t n, uint64_t first_token,
                   void **managed) {
  if (!box || (n && (!views || !managed)))
    return ECS_EINVAL;
  for (size_t i = 0; i < n; i++)
    managed[i] = NULL;
  if (n == 0)
    return ECS_OK;
  if (n > (SIZE_MAX - sizeof(dl_block_t)) / sizeof(dl_item_t))
    return ECS_EINVAL;
  dl_block_t *blk = malloc(sizeof(dl_block_t) + n * sizeof(dl_item_t));
  if (!blk)
    return ECS_ENOMEM;
  blk->box = box;
  blk->live = 0;
  for (size_t i = 0; i < n; i++) {
    dl_item_t *it = &blk->items[i];
    it->m.deleter = NULL; /* not made, unless filled below */
    if (views[i].status != ECS_OK || item_fill(it, &views[i]) != ECS_OK)
      continue;
    it->token = first_token + i;
    it->blk = blk;
    it->m.deleter = item_deleter;
    blk->live++;
  }
  if (blk->live == 0) {
    free(blk);
    return ECS_OK;
  }
  pthread_mutex_lock(&box->mu);
  if (box->closed) {
    pthread_mutex_unlock(&box->mu);
    free(blk);
    return ECS_EINVAL;
  }
  size_t need = box->qlen + box->live + blk->live;
  if (need > box->qcap) {
    size_t cap = box->qcap ? box->qcap : 64;
    while (cap < need)
      cap *= 2;
    uint64_t *q = realloc(box->q, cap * sizeof(*q));
    if (!q) {
      pthread_mutex_unlock(&box->mu);
      free(blk);
      return ECS_ENOMEM;
    }
    box->q = q;
    box->qcap = cap;
  }
  box->live += blk->live;
  box->refs++;
  pthread_mutex_unlock(&box->mu);
  for (size_t i = 0; i < n; i++)
    if (blk->items[i].m.deleter)
      managed[i] = &blk->items[i].m;
  return ECS_OK;
}

size_t ecs_dlbox_drain(ecs_dlbox_t *box, uint64_t *tokens, size_t cap) {
  if (!box || !tokens)
    return 0;
  pthread_mutex_lock(&box->mu);
  size_t k = box->qlen < cap ? box->qlen : cap;
  if (k) { /* q is NULL until the first wrap */
    memcpy(tokens, box->q, k * sizeof(*tokens));
    memmove(box->q, box->q + k, (box->qlen - k) * sizeof(*box->q));
    box->qlen -= k;
  }
  pthread_mutex_unlock(&box->mu);
  return k;
}

void ecs_dlbox_close(ecs_dlbox_t *box) {
  if (!box)
    return;
  pthread_mutex_lock(&box->mu);
  box->closed = 1;
  box->qlen = 0;
  int free_box = --box->refs == 0;
  pthread_mutex_unlock(&box->mu);
  if (free_box)
    box_free(box);
}
