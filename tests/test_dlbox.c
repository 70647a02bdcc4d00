/* ecs_dlbox_*: DLPack tensors over views, and the tokens their deleters
 * queue.  The views here are filled by hand over a local buffer (the
 * functions read only data, nbytes, desc and status); the Python suite
 * (test_vllm_view_lease.py) runs them through torch and a real server.
 * Under ASan every block and box must be freed by the last deleter or the
 * close, whichever comes last. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"

/* DLPack's unversioned ABI, as a framework reads it. */
typedef struct {
  void *data;
  int32_t device_type, device_id;
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} dl_tensor_t;

typedef struct dl_managed {
  dl_tensor_t t;
  void *ctx;
  void (*deleter)(struct dl_managed *);
} dl_managed_t;

static uint8_t bytes[4096];

static ecs_view_t view(size_t off, int dtype, uint64_t rows, uint64_t cols, uint64_t nbytes) {
  ecs_view_t v;
  memset(&v, 0, sizeof(v));
  v.data = bytes + off;
  v.nbytes = nbytes;
  v.desc.dtype = (uint8_t)dtype;
  v.desc.ndim = 2;
  v.desc.shape[0] = rows;
  v.desc.shape[1] = cols;
  v.status = ECS_OK;
  return v;
}

static void del(void *m) {
  dl_managed_t *d = m;
  d->deleter(d);
}

static void test_tensors_describe_the_views(void **state) {
  (void)state;
  ecs_dlbox_t *box;
  assert_int_equal(ecs_dlbox_new(&box), ECS_OK);
  ecs_view_t v[6] = {
      view(0, ECS_DTYPE_BF16, 4, 8, 64),
      view(64, ECS_DTYPE_F8E4M3, 2, 3, 6),
      view(128, ECS_DTYPE_U16, 1, 5, 10),
      view(256, ECS_DTYPE_F32, 4, 8, 64), /* too few bytes for its shape */
      view(512, ECS_DTYPE_BOOL, 3, 1, 3),
      view(0, ECS_DTYPE_F32, 1, 1, 4),
  };
  v[5].status = ECS_ENOTFOUND;
  void *m[6];
  assert_int_equal(ecs_dlbox_wrap(box, v, 6, 100, m), ECS_OK);
  assert_null(m[3]);
  assert_null(m[5]);
  dl_managed_t *a = m[0];
  assert_ptr_equal(a->t.data, bytes);
  assert_int_equal(a->t.device_type, 1);
  assert_int_equal(a->t.ndim, 2);
  assert_int_equal(a->t.shape[0], 4);
  assert_int_equal(a->t.shape[1], 8);
  assert_null(a->t.strides);
  assert_int_equal(a->t.code, 4); /* kDLBfloat */
  assert_int_equal(a->t.bits, 16);
  assert_int_equal(a->t.lanes, 1);
  dl_managed_t *f8 = m[1], *u16 = m[2], *b = m[4];
  assert_int_equal(f8->t.code, 1); /* uint8 carrier */
  assert_int_equal(f8->t.bits, 8);
  assert_int_equal(u16->t.code, 0); /* int16 carrier */
  assert_int_equal(u16->t.bits, 16);
  assert_int_equal(b->t.code, 1);
  assert_int_equal(b->t.bits, 8);
  uint64_t tok[8];
  assert_int_equal(ecs_dlbox_drain(box, tok, 8), 0);
  del(m[2]);
  del(m[0]);
  assert_int_equal(ecs_dlbox_drain(box, tok, 8), 2);
  assert_int_equal(tok[0], 102);
  assert_int_equal(tok[1], 100);
  del(m[4]);
  del(m[1]);
  assert_int_equal(ecs_dlbox_drain(box, tok, 1), 1);
  assert_int_equal(tok[0], 104);
  assert_int_equal(ecs_dlbox_drain(box, tok, 8), 1);
  assert_int_equal(tok[0], 101);
  assert_int_equal(ecs_dlbox_drain(box, tok, 8), 0);
  ecs_dlbox_close(box);
}

/* The tensors may outlive the box's owner: their deleters free the box. */
static void test_tensors_outlive_the_close(void **state) {
  (void)state;
  ecs_dlbox_t *box;
  assert_int_equal(ecs_dlbox_new(&box), ECS_OK);
  ecs_view_t v[2] = {view(0, ECS_DTYPE_U8, 2, 2, 4), view(8, ECS_DTYPE_I64, 1, 2, 16)};
  void *m1[2], *m2[2];
  assert_int_equal(ecs_dlbox_wrap(box, v, 2, 1, m1), ECS_OK);
  assert_int_equal(ecs_dlbox_wrap(box, v, 2, 3, m2), ECS_OK);
  del(m1[0]);
  ecs_dlbox_close(box); /* three tensors live on */
  del(m2[1]);
  del(m1[1]);
  del(m2[0]); /* the last: box and blocks freed (ASan checks) */
  ecs_dlbox_close(NULL);
}

static void test_bad_arguments_and_empty_batches(void **state) {
  (void)state;
  ecs_dlbox_t *box;
  assert_int_equal(ecs_dlbox_new(NULL), ECS_EINVAL);
  assert_int_equal(ecs_dlbox_new(&box), ECS_OK);
  assert_int_equal(ecs_dlbox_wrap(box, NULL, 0, 0, NULL), ECS_OK);
  ecs_view_t v = view(0, ECS_DTYPE_F32, 1, 1, 4);
  assert_int_equal(ecs_dlbox_wrap(box, &v, 1, 0, NULL), ECS_EINVAL);
  assert_int_equal(ecs_dlbox_wrap(NULL, &v, 1, 0, NULL), ECS_EINVAL);
  v.desc.dtype = 99;
  void *m = &v;
  assert_int_equal(ecs_dlbox_wrap(box, &v, 1, 0, &m), ECS_OK);
  assert_null(m); /* an unknown dtype: no tensor */
  v.desc.dtype = ECS_DTYPE_F32;
  v.desc.shape[0] = UINT64_MAX; /* a shape whose size overflows */
  assert_int_equal(ecs_dlbox_wrap(box, &v, 1, 0, &m), ECS_OK);
  assert_null(m);
  uint64_t tok;
  assert_int_equal(ecs_dlbox_drain(box, &tok, 1), 0);
  ecs_dlbox_close(box);
}

/* Deleters on other threads while the owner drains: every token comes
 * back exactly once. */
enum { THREADS = 4, PER = 500 };
static void *delete_all(void *arg) {
  void **m = arg;
  for (int i = 0; i < PER; i++)
    del(m[i]);
  return NULL;
}

static void test_deleters_on_other_threads(void **state) {
  (void)state;
  ecs_dlbox_t *box;
  assert_int_equal(ecs_dlbox_new(&box), ECS_OK);
  static ecs_view_t v[PER];
  static void *m[THREADS][PER];
  for (int i = 0; i < PER; i++)
    v[i] = view((size_t)i, ECS_DTYPE_U8, 1, 1, 1);
  for (int t = 0; t < THREADS; t++)
    assert_int_equal(ecs_dlbox_wrap(box, v, PER, (uint64_t)t * PER, m[t]), ECS_OK);
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++)
    assert_int_equal(pthread_create(&th[t], NULL, delete_all, m[t]), 0);
  static unsigned char seen[THREADS * PER];
  size_t got = 0;
  uint64_t tok[64];
  while (got < THREADS * PER) {
    size_t k = ecs_dlbox_drain(box, tok, 64);
    for (size_t i = 0; i < k; i++) {
      assert_true(tok[i] < THREADS * PER);
      assert_int_equal(seen[tok[i]], 0);
      seen[tok[i]] = 1;
    }
    got += k;
  }
  for (int t = 0; t < THREADS; t++)
    pthread_join(th[t], NULL);
  assert_int_equal(ecs_dlbox_drain(box, tok, 64), 0);
  ecs_dlbox_close(box);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensors_describe_the_views),
      cmocka_unit_test(test_tensors_outlive_the_close),
      cmocka_unit_test(test_bad_arguments_and_empty_batches),
      cmocka_unit_test(test_deleters_on_other_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
