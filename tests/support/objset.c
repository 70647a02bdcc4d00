#include "support/objset.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "support/fixture.h"
#include "support/raw.h"
#include "support/ts.h"

int ecs_mfx_setup(void **state) {
  ecs_mfx_t *f = calloc(1, sizeof *f);
  if (!f || ecs_ts_redis_start(&f->redis) != 0) {
    free(f);
    return -1;
  }
  f->r = ecs_ts_redis_at(f->redis.port);
  *state = f;
  return f->r ? 0 : -1;
}

int ecs_mfx_teardown(void **state) {
  ecs_mfx_t *f = *state;
  int bad = 0;
  for (int i = 0; i < ECS_MFX_MAX_SERVERS; i++)
    if (f->srv[i].pid > 0 && ecs_ts_stop(&f->srv[i], 5000) != 0)
      bad = 1; /* a crash or a sanitizer report in a server */
  if (f->r)
    redisFree(f->r);
  ecs_ts_stop(&f->redis, 5000);
  free(f);
  return bad ? -1 : 0;
}

void ecs_objset_key(char *out, size_t cap, const char *pfx, int i) {
  snprintf(out, cap, "%s-%04d", pfx, i);
}

void ecs_objset_fill(uint8_t *p, int i, uint32_t salt) {
  ecs_ts_fill(p, ECS_OBJSET_BYTES, (uint32_t)i * 7919u + salt);
}

int ecs_objset_put(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st, int upsert) {
  char(*names)[32] = calloc((size_t)n, 32);
  uint8_t *data = malloc((size_t)n * ECS_OBJSET_BYTES);
  ecs_key_t *keys = calloc((size_t)n, sizeof *keys);
  ecs_tensor_t *ts = calloc((size_t)n, sizeof *ts);
  assert_true(names && data && keys && ts);
  for (int i = 0; i < n; i++) {
    ecs_objset_key(names[i], 32, pfx, i);
    ecs_objset_fill(data + (size_t)i * ECS_OBJSET_BYTES, i, salt);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    ts[i].data = data + (size_t)i * ECS_OBJSET_BYTES;
    ts[i].nbytes = ECS_OBJSET_BYTES;
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = ECS_OBJSET_BYTES;
  }
  int rc = (upsert ? ecs_upsert_batch : ecs_put_batch)(c, keys, ts, (size_t)n, st);
  if (rc != ECS_OK)
    fprintf(stderr, "put: %s: %s\n", ecs_strerror(rc), ecs_client_errmsg(c));
  free(names);
  free(data);
  free(keys);
  free(ts);
  return rc;
}

int ecs_objset_get(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st) {
  char(*names)[32] = calloc((size_t)n, 32);
  uint8_t *data = malloc((size_t)n * ECS_OBJSET_BYTES);
  uint8_t *want = malloc(ECS_OBJSET_BYTES);
  ecs_key_t *keys = calloc((size_t)n, sizeof *keys);
  ecs_get_buf_t *b = calloc((size_t)n, sizeof *b);
  assert_true(names && data && want && keys && b);
  for (int i = 0; i < n; i++) {
    ecs_objset_key(names[i], 32, pfx, i);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    b[i].data = data + (size_t)i * ECS_OBJSET_BYTES;
    b[i].capacity = ECS_OBJSET_BYTES;
  }
  int rc = ecs_get_batch(c, keys, b, (size_t)n);
  for (int i = 0; i < n; i++) {
    st[i] = b[i].status;
    if (b[i].status == ECS_OK) {
      ecs_objset_fill(want, i, salt);
      assert_int_equal(b[i].nbytes, ECS_OBJSET_BYTES);
      assert_memory_equal(b[i].data, want, ECS_OBJSET_BYTES);
    }
  }
  free(names);
  free(data);
  free(want);
  free(keys);
  free(b);
  return rc;
}
