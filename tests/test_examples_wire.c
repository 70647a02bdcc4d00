/* The examples' wire codec (examples/ex_wire.c) and stand-in model
 * (examples/ex_model.c): round trips, bounds on every length, and the
 * determinism the token comparison relies on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/error.h"
#include "examples/ex_model.h"
#include "examples/ex_wire.h"

static ex_job_t *sample_job(void) {
  ex_job_t *j = calloc(1, sizeof *j);
  assert_non_null(j);
  strcpy(j->req_id, "req-000042");
  j->flags = EX_JOB_PUBLISH_KV;
  j->width = 700;
  j->height = 728;
  j->n_images = 3;
  for (uint32_t i = 0; i < j->n_images; i++) {
    j->seeds[i] = 1000 + i;
    memset(j->hashes[i], 'a' + (int)i, 32);
    j->cached[i] = i & 1;
  }
  j->n_prompt = 5;
  for (uint32_t i = 0; i < j->n_prompt; i++)
    j->prompt[i] = i * 7;
  j->n_output = 9;
  j->kv_timeout_ms = 1234;
  strcpy(j->prefill_instance, "prefill-1");
  return j;
}

static void test_job_round_trip_and_truncation(void **state) {
  (void)state;
  ex_job_t *j = sample_job(), *k = calloc(1, sizeof *k);
  ex_buf_t b = {0};
  ex_job_encode(&b, j);
  assert_false(b.oom);
  assert_int_equal(ex_job_decode(b.p, b.len, k), ECS_OK);
  assert_string_equal(k->req_id, j->req_id);
  assert_int_equal(k->n_images, 3);
  assert_memory_equal(k->seeds, j->seeds, 3 * sizeof(uint64_t));
  assert_string_equal(k->hashes[2], j->hashes[2]);
  assert_int_equal(k->cached[1], 1);
  assert_memory_equal(k->prompt, j->prompt, 5 * sizeof(uint32_t));
  assert_int_equal(k->kv_timeout_ms, 1234);
  assert_string_equal(k->prefill_instance, "prefill-1");
  /* every truncation, and a trailing byte, is EPROTO */
  for (size_t n = 0; n < b.len; n++)
    assert_int_equal(ex_job_decode(b.p, n, k), ECS_EPROTO);
  uint8_t *longer = malloc(b.len + 1);
  memcpy(longer, b.p, b.len);
  longer[b.len] = 0;
  assert_int_equal(ex_job_decode(longer, b.len + 1, k), ECS_EPROTO);
  free(longer);
  ex_buf_free(&b);
  free(j);
  free(k);
}

static void test_job_bounds(void **state) {
  (void)state;
  ex_job_t *j = sample_job(), *k = calloc(1, sizeof *k);
  ex_buf_t b = {0};
  /* an image count above the cap: the counter sits after id, flags, w, h */
  ex_job_encode(&b, j);
  size_t off = 4 + strlen(j->req_id) + 12;
  uint32_t big = EX_MAX_IMAGES + 1;
  memcpy(b.p + off, &big, 4);
  assert_int_equal(ex_job_decode(b.p, b.len, k), ECS_EPROTO);
  /* a string length past the payload */
  uint32_t huge = 0xfffffff0u;
  b.len = 0;
  ex_job_encode(&b, j);
  memcpy(b.p, &huge, 4);
  assert_int_equal(ex_job_decode(b.p, b.len, k), ECS_EPROTO);
  /* a zero image width, a token id past the vocabulary */
  j->width = 0;
  b.len = 0;
  ex_job_encode(&b, j);
  assert_int_equal(ex_job_decode(b.p, b.len, k), ECS_EPROTO);
  j->width = 700;
  j->prompt[0] = EX_VOCAB;
  b.len = 0;
  ex_job_encode(&b, j);
  assert_int_equal(ex_job_decode(b.p, b.len, k), ECS_EPROTO);
  ex_buf_free(&b);
  free(j);
  free(k);
}

static void test_done_and_token(void **state) {
  (void)state;
  ex_done_t d, e;
  memset(&d, 0, sizeof d);
  d.status = ECS_ETIMEDOUT;
  strcpy(d.reason, "KV fetch timed out");
  strcpy(d.path, "ecstore/tcp");
  d.st.load_us = 77;
  d.st.proxy_us = 5;
  ex_buf_t b = {0};
  ex_done_encode(&b, &d);
  assert_int_equal(ex_done_decode(b.p, b.len, &e), ECS_OK);
  assert_int_equal(e.status, ECS_ETIMEDOUT);
  assert_string_equal(e.reason, d.reason);
  assert_string_equal(e.path, d.path);
  assert_int_equal(e.st.load_us, 77);
  assert_int_equal(e.st.proxy_us, 5);
  for (size_t n = 0; n < b.len; n++)
    assert_int_equal(ex_done_decode(b.p, n, &e), ECS_EPROTO);
  ex_stats_add(&e.st, &d.st);
  assert_int_equal(e.st.load_us, 154);
  b.len = 0;
  ex_token_encode(&b, 3, 31999);
  uint32_t i, t;
  assert_int_equal(ex_token_decode(b.p, b.len, &i, &t), ECS_OK);
  assert_int_equal(i, 3);
  assert_int_equal(t, 31999);
  b.len = 0;
  ex_token_encode(&b, 3, EX_VOCAB);
  assert_int_equal(ex_token_decode(b.p, b.len, &i, &t), ECS_EPROTO);
  ex_buf_free(&b);
}

static void test_model_shapes_and_determinism(void **state) {
  (void)state;
  assert_int_equal(ex_image_tokens(700, 728), 650);
  assert_int_equal(ex_embed_nbytes(700, 728), 650ull * 2048 * 2);
  assert_int_equal(ex_image_tokens(112, 112), 16);
  assert_int_equal(ex_image_tokens(29, 1), 2); /* partial regions count */
  assert_int_equal(ex_f32_to_bf16(1.0f), 0x3f80);
  assert_true(ex_bf16_to_f32(ex_f32_to_bf16(-2.5f)) == -2.5f);
  ex_workload_t wl = {4, 2, 112, 84, 20, 12, 3, 7};
  uint32_t a[12], b2[12], c[12];
  assert_int_equal(ex_reference_request(&wl, 1, a), 0);
  assert_int_equal(ex_reference_request(&wl, 1, b2), 0);
  assert_memory_equal(a, b2, sizeof a);
  assert_int_equal(ex_reference_request(&wl, 2, c), 0);
  assert_memory_not_equal(a, c, sizeof a);
  /* images cycle through unique_images */
  assert_true(ex_wl_image_seed(&wl, 0, 0) == ex_wl_image_seed(&wl, 1, 1));
  assert_true(ex_wl_image_seed(&wl, 0, 0) != ex_wl_image_seed(&wl, 0, 1));
  /* a recomputed embedding is bit-identical to the encoder's */
  size_t nb = ex_embed_nbytes(112, 84);
  uint8_t *img = malloc(ex_image_nbytes(112, 84));
  uint16_t *e1 = malloc(nb), *e2 = malloc(nb);
  ex_image_generate(99, 112, 84, img);
  ex_encode(img, 112, 84, e1);
  ex_image_generate(99, 112, 84, img);
  ex_encode(img, 112, 84, e2);
  assert_memory_equal(e1, e2, nb);
  free(img);
  free(e1);
  free(e2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_job_round_trip_and_truncation),
      cmocka_unit_test(test_job_bounds),
      cmocka_unit_test(test_done_and_token),
      cmocka_unit_test(test_model_shapes_and_determinism),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
