/* Codecs: round trips for every dtype, codec and awkward size; the shuffle;
 * auto mode; corrupt input and wrong sizes are ECS_ECODEC without a write
 * outside the buffer (run under ASan); several threads at once. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <lz4.h>
#include <stdio.h>
#include <xxhash.h>
#include <zstd.h>

#include "store/core/codec.h"
#include "support/tensors.h"

static const int all_dtypes[] = {ECS_DTYPE_F32,    ECS_DTYPE_F16, ECS_DTYPE_BF16, ECS_DTYPE_F8E4M3,
                                 ECS_DTYPE_F8E5M2, ECS_DTYPE_I8,  ECS_DTYPE_U8,   ECS_DTYPE_I32,
                                 ECS_DTYPE_I64,    ECS_DTYPE_F64, ECS_DTYPE_I16,  ECS_DTYPE_U16,
                                 ECS_DTYPE_U32,    ECS_DTYPE_U64, ECS_DTYPE_BOOL};
static const int all_codecs[] = {ECS_CODEC_NONE, ECS_CODEC_LZ4, ECS_CODEC_ZSTD,
                                 ECS_CODEC_AUTO | ECS_CODEC_LZ4, ECS_CODEC_AUTO | ECS_CODEC_ZSTD};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- Data ---------------------------------------------------------------- */

static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(ecs_ts_rng_next(&s) >> 56);
}

/* n bytes of normal-like values in the dtype (whole elements, then a tail of
 * random bytes); other dtypes get small integers, which compress too. */
static void fill_tensor(uint8_t *p, size_t n, int dtype, uint64_t seed) {
  uint64_t s = seed | 1;
  size_t i = 0;
  switch (dtype) {
  case ECS_DTYPE_F32:
    for (; i + 4 <= n; i += 4) {
      float f = ecs_ts_normal(&s);
      memcpy(p + i, &f, 4);
    }
    break;
  case ECS_DTYPE_BF16:
  case ECS_DTYPE_F16:
    for (; i + 2 <= n; i += 2) {
      float f = ecs_ts_normal(&s);
      uint16_t h = dtype == ECS_DTYPE_BF16 ? ecs_ts_f32_to_bf16(f) : ecs_ts_f32_to_f16(f);
      memcpy(p + i, &h, 2);
    }
    break;
  default:
    for (; i < n; i++)
      p[i] = (uint8_t)((int)(ecs_ts_normal(&s) * 8.0f));
    break;
  }
  fill_random(p + i, n - i, seed + 1);
}

/* ---- Names and shuffle ------------------------------------------------- */

static void test_parse_and_names(void **state) {
  (void)state;
  int c = -1;
  assert_int_equal(ecs_codec_parse("none", &c), ECS_OK);
  assert_int_equal(c, ECS_CODEC_NONE);
  assert_int_equal(ecs_codec_parse("lz4", &c), ECS_OK);
  assert_int_equal(c, ECS_CODEC_LZ4);
  assert_int_equal(ecs_codec_parse("zstd", &c), ECS_OK);
  assert_int_equal(c, ECS_CODEC_ZSTD);
  assert_int_equal(ecs_codec_parse("auto", &c), ECS_OK);
  assert_int_equal(c, ECS_CODEC_AUTO | ECS_CODEC_AUTO_DEFAULT);
  assert_int_equal(ecs_codec_parse("auto:zstd", &c), ECS_OK);
  assert_int_equal(c, ECS_CODEC_AUTO | ECS_CODEC_ZSTD);
  assert_int_equal(ecs_codec_parse("gzip", &c), ECS_EINVAL);
  assert_int_equal(ecs_codec_parse("", &c), ECS_EINVAL);
  assert_int_equal(ecs_codec_parse(NULL, &c), ECS_EINVAL);

  assert_string_equal(ecs_codec_name(ECS_CODEC_LZ4 | ECS_CODEC_SHUFFLE), "lz4+shuffle");
  assert_string_equal(ecs_codec_name(ECS_CODEC_AUTO | ECS_CODEC_ZSTD), "auto:zstd");
  assert_string_equal(ecs_codec_name(7), "invalid");

  /* Wire values: stable. */
  assert_int_equal(ECS_CODEC_NONE, 0);
  assert_int_equal(ECS_CODEC_LZ4, 1);
  assert_int_equal(ECS_CODEC_ZSTD, 2);
  assert_int_equal(ECS_CODEC_SHUFFLE, 0x80);
  assert_true(ecs_codec_valid(0) && ecs_codec_valid(1) && ecs_codec_valid(2));
  assert_true(ecs_codec_valid(0x81) && ecs_codec_valid(0x82));
  assert_false(ecs_codec_valid(0x80) || ecs_codec_valid(3) || ecs_codec_valid(0x41) || ecs_codec_valid(-1));

  assert_int_equal(ecs_codec_shuffle_elem(ECS_DTYPE_F32), 4);
  assert_int_equal(ecs_codec_shuffle_elem(ECS_DTYPE_I32), 4);
  assert_int_equal(ecs_codec_shuffle_elem(ECS_DTYPE_F16), 2);
  assert_int_equal(ecs_codec_shuffle_elem(ECS_DTYPE_BF16), 2);
  assert_int_equal(ecs_codec_shuffle_elem(ECS_DTYPE_F8E4M3), 0);
  assert_int_equal(ecs_codec_shuffle_elem(ECS_DTYPE_I64), 0);
  assert_int_equal(ecs_codec_shuffle_elem(99), 0);
}

static void test_shuffle_layout(void **state) {
  (void)state;
  /* Three 4-byte elements and a 2-byte tail. */
  const uint8_t in[14] = {0x10, 0x11, 0x12, 0x13, 0x20, 0x21, 0x22, 0x23, 0x30, 0x31, 0x32, 0x33, 0xa, 0xb};
  const uint8_t want4[14] = {0x10, 0x20, 0x30, 0x11, 0x21, 0x31, 0x12,
                             0x22, 0x32, 0x13, 0x23, 0x33, 0xa,  0xb};
  const uint8_t want2[14] = {0x10, 0x12, 0x20, 0x22, 0x30, 0x32, 0xa,
                             0x11, 0x13, 0x21, 0x23, 0x31, 0x33, 0xb};
  uint8_t out[14], back[14];
  ecs_codec_shuffle(out, in, sizeof in, 4);
  assert_memory_equal(out, want4, sizeof want4);
  ecs_codec_unshuffle(back, out, sizeof in, 4);
  assert_memory_equal(back, in, sizeof in);
  ecs_codec_shuffle(out, in, sizeof in, 2);
  assert_memory_equal(out, want2, sizeof want2);
  ecs_codec_unshuffle(back, out, sizeof in, 2);
  assert_memory_equal(back, in, sizeof in);
}

static void test_shuffle_inverse(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 4099, 65537};
  static const size_t elems[] = {1, 2, 3, 4, 8, 16};
  size_t max = 65537;
  uint8_t *in = malloc(max), *sh = malloc(max), *back = malloc(max);
  assert_non_null(in);
  assert_non_null(sh);
  assert_non_null(back);
  fill_random(in, max, 42);
  for (size_t e = 0; e < NELEM(elems); e++) {
    for (size_t i = 0; i < NELEM(sizes); i++) {
      size_t n = sizes[i], el = elems[e], ne = n / el;
      ecs_codec_shuffle(sh, in, n, el);
      /* Byte b of element k lands at b * ne + k; the tail stays put. */
      for (size_t k = 0; k < ne; k += 1 + ne / 7)
        for (size_t b = 0; b < el; b++)
          assert_int_equal(sh[b * ne + k], in[k * el + b]);
      if (n)
        assert_memory_equal(sh + ne * el, in + ne * el, n - ne * el);
      memset(back, 0xee, max);
      ecs_codec_unshuffle(back, sh, n, el);
      if (n)
        assert_memory_equal(back, in, n);
      assert_int_equal(back[n < max ? n : max - 1], n < max ? 0xee : in[max - 1]);
    }
  }
  free(in);
  free(sh);
  free(back);
}

/* ---- Round trips -------------------------------------------------------- */

/* Compresses and decompresses n bytes; checks sizes, codec byte and bytes.
 * Buffers are exactly the sizes the contract allows, so ASan sees overruns. */
static void round_trip(int codec, int dtype, const uint8_t *src, size_t n, uint8_t *codec_used_out) {
  size_t bound = ecs_codec_bound(codec, n);
  if (codec != ECS_CODEC_NONE)
    assert_true(bound > 0 && bound >= n);
  uint8_t *cbuf = malloc(bound ? bound : 1);
  uint8_t *back = malloc(n ? n : 1);
  assert_non_null(cbuf);
  assert_non_null(back);
  size_t clen = SIZE_MAX;
  uint8_t used = 0xff;
  assert_int_equal(ecs_codec_compress(codec, dtype, src, n, cbuf, bound, &clen, &used, 0), ECS_OK);
  assert_true(clen <= bound);
  assert_true(ecs_codec_valid(used));
  int id = codec & ECS_CODEC_ID_MASK;
  if (!(codec & ECS_CODEC_AUTO))
    assert_int_equal(used & ECS_CODEC_ID_MASK, id);
  else
    assert_true((used & ECS_CODEC_ID_MASK) == id || used == ECS_CODEC_NONE);
  /* Shuffled exactly when there is a whole element of a 16/32-bit dtype. */
  size_t elem = ecs_codec_shuffle_elem(dtype);
  if (used != ECS_CODEC_NONE)
    assert_int_equal(!!(used & ECS_CODEC_SHUFFLE), elem && n >= elem);
  if (used == ECS_CODEC_NONE) {
    assert_int_equal(clen, n);
    if (n)
      assert_memory_equal(cbuf, src, n);
  }
  memset(back, 0xa5, n ? n : 1);
  assert_int_equal(ecs_codec_decompress(used, dtype, cbuf, clen, back, n), ECS_OK);
  if (n)
    assert_memory_equal(back, src, n);
  if (codec_used_out)
    *codec_used_out = used;
  free(cbuf);
  free(back);
}

static void test_round_trip_all(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 2, 3, 5, 7, 13, 1023, 4097, 65537, 1u << 20};
  size_t max = 1u << 20;
  uint8_t *src = malloc(max);
  assert_non_null(src);
  for (size_t d = 0; d < NELEM(all_dtypes); d++) {
    fill_tensor(src, max, all_dtypes[d], 7 + d);
    for (size_t c = 0; c < NELEM(all_codecs); c++)
      for (size_t s = 0; s < NELEM(sizes); s++) {
        uint8_t used;
        /* An exact-size copy, so a read past n is an ASan error. */
        uint8_t *exact = malloc(sizes[s] ? sizes[s] : 1);
        assert_non_null(exact);
        memcpy(exact, src, sizes[s]);
        round_trip(all_codecs[c], all_dtypes[d], exact, sizes[s], &used);
        free(exact);
      }
  }
  free(src);
}

static void test_empty_input(void **state) {
  (void)state;
  for (size_t c = 0; c < NELEM(all_codecs); c++) {
    uint8_t buf[64], used = 0xff;
    size_t len = 99;
    /* NULL src with n == 0 is allowed. */
    assert_int_equal(
        ecs_codec_compress(all_codecs[c], ECS_DTYPE_F32, NULL, 0, buf, sizeof buf, &len, &used, 0), ECS_OK);
    assert_int_equal(ecs_codec_decompress(used, ECS_DTYPE_F32, buf, len, NULL, 0), ECS_OK);
    /* An empty object cannot claim one byte, nor the reverse. */
    uint8_t one[1];
    if (used != ECS_CODEC_NONE)
      assert_int_equal(ecs_codec_decompress(used, ECS_DTYPE_F32, buf, len, one, 1), ECS_ECODEC);
  }
  uint8_t used;
  size_t len;
  assert_int_equal(ecs_codec_compress(ECS_CODEC_NONE, ECS_DTYPE_U8, NULL, 0, NULL, 0, &len, &used, 0),
                   ECS_OK);
  assert_int_equal(len, 0);
  assert_int_equal(ecs_codec_compress(ECS_CODEC_LZ4, ECS_DTYPE_U8, NULL, 0, NULL, 0, &len, &used, 0),
                   ECS_EBUFSMALL);
}

/* ---- Auto, ratios ------------------------------------------------------- */

static void test_random_data(void **state) {
  (void)state;
  size_t n = 1u << 20;
  uint8_t *src = malloc(n), *dst = malloc(n);
  assert_non_null(src);
  assert_non_null(dst);
  fill_random(src, n, 99);
  static const int dts[] = {ECS_DTYPE_U8, ECS_DTYPE_BF16, ECS_DTYPE_F32};
  for (size_t d = 0; d < NELEM(dts); d++) {
    assert_int_equal(ecs_codec_choose(ECS_CODEC_LZ4, dts[d], src, n, 0), ECS_CODEC_NONE);
    assert_int_equal(ecs_codec_choose(ECS_CODEC_ZSTD, dts[d], src, n, 0), ECS_CODEC_NONE);
    /* Auto stores random bytes raw, and dst_cap == n is enough for that. */
    size_t len;
    uint8_t used;
    assert_int_equal(
        ecs_codec_compress(ECS_CODEC_AUTO | ECS_CODEC_ZSTD, dts[d], src, n, dst, n, &len, &used, 0), ECS_OK);
    assert_int_equal(used, ECS_CODEC_NONE);
    assert_int_equal(len, n);
    assert_memory_equal(dst, src, n);
    /* Explicit codecs still round-trip incompressible bytes. */
    round_trip(ECS_CODEC_LZ4, dts[d], src, n, NULL);
    round_trip(ECS_CODEC_ZSTD, dts[d], src, n, NULL);
    /* ... but not into a buffer of n bytes. */
    assert_int_equal(ecs_codec_compress(ECS_CODEC_LZ4, dts[d], src, n, dst, n, &len, &used, 0),
                     ECS_EBUFSMALL);
    assert_int_equal(ecs_codec_compress(ECS_CODEC_ZSTD, dts[d], src, n, dst, n, &len, &used, 0),
                     ECS_EBUFSMALL);
  }
  /* Zeros compress, so auto compresses them. */
  memset(src, 0, n);
  assert_int_equal(ecs_codec_choose(ECS_CODEC_AUTO | ECS_CODEC_LZ4, ECS_DTYPE_F32, src, n, 0), ECS_CODEC_LZ4);
  assert_int_equal(ecs_codec_choose(ECS_CODEC_NONE, ECS_DTYPE_F32, src, n, 0), ECS_CODEC_NONE);
  free(src);
  free(dst);
}

/* Compressed size of n bytes, or SIZE_MAX on error. */
static size_t csize(int codec, int dtype, const uint8_t *src, size_t n, int level) {
  size_t bound = ecs_codec_bound(codec, n), len = SIZE_MAX;
  uint8_t *dst = malloc(bound), used;
  if (!dst || ecs_codec_compress(codec, dtype, src, n, dst, bound, &len, &used, level) != ECS_OK)
    len = SIZE_MAX;
  free(dst);
  return len;
}

static void test_realistic_ratio(void **state) {
  (void)state;
  size_t n = 1u << 20;
  uint8_t *src = malloc(n);
  assert_non_null(src);
  static const int dts[] = {ECS_DTYPE_BF16, ECS_DTYPE_F16, ECS_DTYPE_F32};
  for (size_t d = 0; d < NELEM(dts); d++) {
    fill_tensor(src, n, dts[d], 1234);
    /* ECS_DTYPE_U8 compresses the same bytes without the shuffle. */
    size_t z_sh = csize(ECS_CODEC_ZSTD, dts[d], src, n, 0);
    size_t z_raw = csize(ECS_CODEC_ZSTD, ECS_DTYPE_U8, src, n, 0);
    size_t l_sh = csize(ECS_CODEC_LZ4, dts[d], src, n, 0);
    size_t l_raw = csize(ECS_CODEC_LZ4, ECS_DTYPE_U8, src, n, 0);
    print_message("  %-5s n=%zu zstd %.3fx (unshuffled %.3fx), lz4 %.3fx (unshuffled %.3fx)\n",
                  dts[d] == ECS_DTYPE_BF16  ? "bf16"
                  : dts[d] == ECS_DTYPE_F16 ? "f16"
                                            : "f32",
                  n, (double)n / (double)z_sh, (double)n / (double)z_raw, (double)n / (double)l_sh,
                  (double)n / (double)l_raw);
    assert_true(z_sh < z_raw);
    assert_true(l_sh <= l_raw);
  }
  /* bf16 encoder-like values: worth compressing, and auto agrees. */
  fill_tensor(src, n, ECS_DTYPE_BF16, 1234);
  assert_true((double)n / (double)csize(ECS_CODEC_ZSTD, ECS_DTYPE_BF16, src, n, 0) >
              ECS_CODEC_AUTO_MIN_RATIO);
  assert_int_equal(ecs_codec_choose(ECS_CODEC_ZSTD, ECS_DTYPE_BF16, src, n, 0), ECS_CODEC_ZSTD);
  /* f32 gains less (~1.19x, all of it from the sign/exponent plane); the
   * sample must still see that gain, not hide it under the noisy planes. */
  fill_tensor(src, n, ECS_DTYPE_F32, 1234);
  assert_int_equal(ecs_codec_choose(ECS_CODEC_ZSTD, ECS_DTYPE_F32, src, n, 0), ECS_CODEC_ZSTD);
  /* A short f32 object mixes its planes in one zstd block: auto's result,
   * whichever it is, round-trips. */
  round_trip(ECS_CODEC_AUTO | ECS_CODEC_ZSTD, ECS_DTYPE_F32, src, 100 * 1024, NULL);
  free(src);
}

/* ---- Bad input ---------------------------------------------------------- */

static void test_bad_arguments(void **state) {
  (void)state;
  uint8_t src[16] = {0}, dst[64], used;
  size_t len;
  assert_int_equal(ecs_codec_compress(3, ECS_DTYPE_U8, src, 16, dst, 64, &len, &used, 0), ECS_EINVAL);
  assert_int_equal(
      ecs_codec_compress(ECS_CODEC_LZ4 | ECS_CODEC_SHUFFLE, ECS_DTYPE_U8, src, 16, dst, 64, &len, &used, 0),
      ECS_EINVAL);
  assert_int_equal(ecs_codec_compress(ECS_CODEC_LZ4, ECS_DTYPE_U8, NULL, 16, dst, 64, &len, &used, 0),
                   ECS_EINVAL);
  assert_int_equal(ecs_codec_compress(ECS_CODEC_LZ4, ECS_DTYPE_U8, src, 16, NULL, 64, &len, &used, 0),
                   ECS_EINVAL);
  assert_int_equal(ecs_codec_compress(ECS_CODEC_LZ4, ECS_DTYPE_U8, src, 16, dst, 64, NULL, &used, 0),
                   ECS_EINVAL);
  assert_int_equal(ecs_codec_compress(ECS_CODEC_NONE, ECS_DTYPE_U8, src, 16, dst, 15, &len, &used, 0),
                   ECS_EBUFSMALL);
  assert_int_equal(ecs_codec_bound(3, 10), 0);
  assert_int_equal(ecs_codec_bound(ECS_CODEC_NONE, 10), 10);
  assert_int_equal(ecs_codec_choose(5, ECS_DTYPE_U8, src, 16, 0), ECS_EINVAL);
  /* Levels out of zstd's range are clamped, not refused. */
  assert_int_equal(ecs_codec_compress(ECS_CODEC_ZSTD, ECS_DTYPE_U8, src, 16, dst, 64, &len, &used, 1000),
                   ECS_OK);
  assert_int_equal(ecs_codec_compress(ECS_CODEC_ZSTD, ECS_DTYPE_U8, src, 16, dst, 64, &len, &used, -1000000),
                   ECS_OK);
  assert_int_equal(ecs_codec_decompress(ECS_CODEC_NONE, ECS_DTYPE_U8, NULL, 4, dst, 4), ECS_EINVAL);
}

static void test_corrupt_input(void **state) {
  (void)state;
  size_t n = 64 * 1024 + 3; /* odd: a bf16 tensor with a 1-byte tail */
  uint8_t *src = malloc(n);
  assert_non_null(src);
  fill_tensor(src, n, ECS_DTYPE_BF16, 5);
  static const int codecs[] = {ECS_CODEC_LZ4, ECS_CODEC_ZSTD};
  uint64_t rs = 77;
  for (size_t c = 0; c < NELEM(codecs); c++) {
    size_t bound = ecs_codec_bound(codecs[c], n), clen;
    uint8_t *cbuf = malloc(bound), used;
    assert_non_null(cbuf);
    assert_int_equal(ecs_codec_compress(codecs[c], ECS_DTYPE_BF16, src, n, cbuf, bound, &clen, &used, 0),
                     ECS_OK);
    assert_int_equal(used, codecs[c] | ECS_CODEC_SHUFFLE);

    /* Wrong raw length, either way: an error, never a short or long write. */
    static const long deltas[] = {-1000, -2, -1, 1, 2, 1000};
    for (size_t k = 0; k < NELEM(deltas); k++) {
      size_t rl = (size_t)((long)n + deltas[k]);
      uint8_t *out = malloc(rl);
      assert_non_null(out);
      assert_int_equal(ecs_codec_decompress(used, ECS_DTYPE_BF16, cbuf, clen, out, rl), ECS_ECODEC);
      free(out);
    }
    uint8_t *out = malloc(n); /* exactly raw_len: ASan sees any overrun */
    assert_non_null(out);
    /* Truncated input. */
    static const size_t cuts[] = {0, 1, 4, 8, 100};
    for (size_t k = 0; k < NELEM(cuts); k++) {
      size_t keep = cuts[k] < clen ? cuts[k] : clen - 1;
      assert_int_equal(ecs_codec_decompress(used, ECS_DTYPE_BF16, cbuf, keep, out, n), ECS_ECODEC);
    }
    assert_int_equal(ecs_codec_decompress(used, ECS_DTYPE_BF16, cbuf, clen - 1, out, n), ECS_ECODEC);
    /* Codec bytes that are not wire values, and a shuffle on a dtype that is
     * never shuffled. */
    assert_int_equal(ecs_codec_decompress(3, ECS_DTYPE_BF16, cbuf, clen, out, n), ECS_ECODEC);
    assert_int_equal(ecs_codec_decompress(0x80, ECS_DTYPE_BF16, cbuf, clen, out, n), ECS_ECODEC);
    assert_int_equal(
        ecs_codec_decompress((uint8_t)(used | ECS_CODEC_AUTO), ECS_DTYPE_BF16, cbuf, clen, out, n),
        ECS_ECODEC);
    assert_int_equal(ecs_codec_decompress(used, ECS_DTYPE_U8, cbuf, clen, out, n), ECS_ECODEC);
    assert_int_equal(ecs_codec_decompress(used, 99, cbuf, clen, out, n), ECS_ECODEC);
    /* The other codec's decoder on these bytes. */
    assert_int_equal(ecs_codec_decompress((uint8_t)(used ^ 3), ECS_DTYPE_BF16, cbuf, clen, out, n),
                     ECS_ECODEC);

    /* Flipped bytes: an error or (lz4 has no checksum) some bytes, but
     * never a crash or a write outside out. */
    uint8_t *bad = malloc(clen);
    assert_non_null(bad);
    for (int it = 0; it < 300; it++) {
      memcpy(bad, cbuf, clen);
      int flips = 1 + (int)(ecs_ts_rng_next(&rs) % 8);
      for (int f = 0; f < flips; f++)
        bad[ecs_ts_rng_next(&rs) % clen] ^= (uint8_t)(1u << (ecs_ts_rng_next(&rs) % 8));
      int rc = ecs_codec_decompress(used, ECS_DTYPE_BF16, bad, clen, out, n);
      assert_true(rc == ECS_OK || rc == ECS_ECODEC);
    }
    /* Garbage of many lengths. */
    for (int it = 0; it < 300; it++) {
      size_t gl = 1 + (size_t)(ecs_ts_rng_next(&rs) % (clen < 4096 ? clen : 4096));
      fill_random(bad, gl, ecs_ts_rng_next(&rs));
      int rc = ecs_codec_decompress(used, ECS_DTYPE_BF16, bad, gl, out, n);
      assert_true(rc == ECS_OK || rc == ECS_ECODEC);
    }
    free(bad);
    free(out);
    free(cbuf);
  }
  /* none: the stored length is the raw length. */
  uint8_t out[8];
  assert_int_equal(ecs_codec_decompress(ECS_CODEC_NONE, ECS_DTYPE_U8, src, 7, out, 8), ECS_ECODEC);
  assert_int_equal(ecs_codec_decompress(ECS_CODEC_NONE, ECS_DTYPE_U8, src, 8, out, 8), ECS_OK);
  free(src);
}

/* ---- Threads ------------------------------------------------------------ */

typedef struct {
  int codec; /* request codec */
  uint64_t seed;
  int failures; /* round trips that did not give the input back */
} thread_arg_t;

static void *thread_main(void *p) {
  thread_arg_t *a = p;
  size_t n = 200 * 1024 + 1;
  uint8_t *src = malloc(n), *c = malloc(ecs_codec_bound(a->codec, n)), *back = malloc(n);
  if (!src || !c || !back) {
    a->failures++;
    goto out;
  }
  for (int it = 0; it < 20; it++) {
    int dt = it % 2 ? ECS_DTYPE_BF16 : ECS_DTYPE_F32;
    fill_tensor(src, n, dt, a->seed + (uint64_t)it);
    size_t len;
    uint8_t used;
    if (ecs_codec_compress(a->codec, dt, src, n, c, ecs_codec_bound(a->codec, n), &len, &used, 0) != ECS_OK ||
        ecs_codec_decompress(used, dt, c, len, back, n) != ECS_OK || memcmp(src, back, n) != 0)
      a->failures++;
  }
out:
  free(src);
  free(c);
  free(back);
  return NULL; /* the thread's codec state is freed at exit (leak-checked) */
}

static void test_threads(void **state) {
  (void)state;
  enum { NT = 4 };
  pthread_t th[NT];
  thread_arg_t args[NT];
  for (int i = 0; i < NT; i++) {
    args[i] = (thread_arg_t){.codec = i % 2 ? ECS_CODEC_ZSTD : ECS_CODEC_AUTO | ECS_CODEC_LZ4,
                             .seed = 1000u * (unsigned)i};
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < NT; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(args[i].failures, 0);
  }
}

/* ---- Golden vectors ----------------------------------------------------- */

/*
 * The stored format of compressed objects is pinned by golden vectors
 * (tests/codec_golden.h): for each dtype and codec, the bytes a known build
 * stored for a small deterministic input.  A reader must decode them into
 * that input (its xxh3 is recorded), whatever the build: objects outlive
 * the process that wrote them (a record in Redis, a peer on another
 * version), so a change of the shuffle map, the codec flags or the framing
 * fails here, which a round trip through one build cannot notice.
 *
 * The compressed bytes themselves are also compared with what this build
 * writes, but only when liblz4 and libzstd are the versions the vectors
 * were made with: another library version may legitimately pick other
 * matches for the same format.  The test says so when it cannot compare.
 *
 * Regenerate (only for an intended format change, with a new codec byte):
 *   build/bin/test_codec --gen-golden > tests/codec_golden.h
 */
#define GOLDEN_BYTES 256 /* input bytes per dtype */
#define GOLDEN_SEED 20261125

static void golden_input(uint8_t *p, int dtype) {
  fill_tensor(p, GOLDEN_BYTES, dtype, GOLDEN_SEED + (uint64_t)dtype);
}

static const int golden_codecs[] = {ECS_CODEC_LZ4, ECS_CODEC_ZSTD};

static int gen_golden(void) {
  uint8_t in[GOLDEN_BYTES], out[2 * GOLDEN_BYTES + 64];
  printf("/* Generated by `test_codec --gen-golden` (tests/test_codec.c says why and\n"
         " * when to regenerate); liblz4 %s, libzstd %s.  Do not edit. */\n",
         LZ4_versionString(), ZSTD_versionString());
  printf("#define GOLDEN_LZ4_VERSION %d\n#define GOLDEN_ZSTD_VERSION %u\n", LZ4_versionNumber(),
         ZSTD_versionNumber());
  printf("static const struct golden {\n  int dtype, codec;\n  uint8_t used; /* the codec byte stored */\n"
         "  uint64_t raw_xxh3; /* of the raw input */\n  const char *hex; /* the stored bytes */\n"
         "} goldens[] = {\n");
  for (size_t d = 0; d < NELEM(all_dtypes); d++) {
    golden_input(in, all_dtypes[d]);
    for (size_t c = 0; c < NELEM(golden_codecs); c++) {
      size_t len = 0;
      uint8_t used = 0;
      if (ecs_codec_compress(golden_codecs[c], all_dtypes[d], in, sizeof in, out, sizeof out, &len, &used, 0))
        return 1;
      printf("    {%d, %d, 0x%02x, 0x%016llxull,\n     \"", all_dtypes[d], golden_codecs[c], used,
             (unsigned long long)XXH3_64bits(in, sizeof in));
      for (size_t i = 0; i < len; i++)
        printf("%02x%s", out[i], i + 1 < len && (i + 1) % 48 == 0 ? "\"\n     \"" : "");
      printf("\"},\n");
    }
  }
  printf("};\n");
  return 0;
}

#include "codec_golden.h"

static size_t unhex(const char *h, uint8_t *out, size_t cap) {
  size_t n = 0;
  for (; h[0] && h[1] && n < cap; h += 2) {
    unsigned v;
    if (sscanf(h, "%2x", &v) != 1)
      break;
    out[n++] = (uint8_t)v;
  }
  return n;
}

static void test_golden_vectors(void **state) {
  (void)state;
  int same_libs = LZ4_versionNumber() == GOLDEN_LZ4_VERSION && ZSTD_versionNumber() == GOLDEN_ZSTD_VERSION;
  if (!same_libs)
    printf("note: golden vectors made with lz4 %d / zstd %d, here %d / %u: stored bytes are checked by "
           "decoding only\n",
           GOLDEN_LZ4_VERSION, GOLDEN_ZSTD_VERSION, LZ4_versionNumber(), ZSTD_versionNumber());
  assert_int_equal(NELEM(goldens), NELEM(all_dtypes) * NELEM(golden_codecs));
  for (size_t g = 0; g < NELEM(goldens); g++) {
    const struct golden *gv = &goldens[g];
    uint8_t stored[2 * GOLDEN_BYTES + 64], raw[GOLDEN_BYTES], in[GOLDEN_BYTES], mine[2 * GOLDEN_BYTES + 64];
    size_t n = unhex(gv->hex, stored, sizeof stored);
    assert_true(n > 0);
    /* 16- and 32-bit dtypes were shuffled, with their element size */
    int shuffled = ecs_codec_shuffle_elem(gv->dtype) != 0;
    assert_int_equal(gv->used, gv->codec | (shuffled ? ECS_CODEC_SHUFFLE : 0));
    /* what an earlier build stored decodes to the same tensor here */
    assert_int_equal(ecs_codec_decompress(gv->used, gv->dtype, stored, n, raw, sizeof raw), ECS_OK);
    if (XXH3_64bits(raw, sizeof raw) != gv->raw_xxh3)
      fail_msg("golden %s/%s: stored bytes decode to another tensor", ecs_dtype_name(gv->dtype),
               ecs_codec_name(gv->used));
    /* the input is the one the vectors were made from */
    golden_input(in, gv->dtype);
    assert_memory_equal(in, raw, sizeof raw);
    /* and this build stores what the known build stored */
    size_t len = 0;
    uint8_t used = 0;
    assert_int_equal(
        ecs_codec_compress(gv->codec, gv->dtype, in, sizeof in, mine, sizeof mine, &len, &used, 0), ECS_OK);
    assert_int_equal(used, gv->used);
    if (same_libs) {
      assert_int_equal(len, n);
      assert_memory_equal(mine, stored, n);
    }
  }
}

static int teardown(void **state) {
  (void)state;
  ecs_codec_thread_release(); /* the main thread's contexts, before LSan looks */
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--gen-golden") == 0)
    return gen_golden();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_and_names), cmocka_unit_test(test_shuffle_layout),
      cmocka_unit_test(test_shuffle_inverse), cmocka_unit_test(test_round_trip_all),
      cmocka_unit_test(test_empty_input),     cmocka_unit_test(test_random_data),
      cmocka_unit_test(test_realistic_ratio), cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_corrupt_input),   cmocka_unit_test(test_threads),
      cmocka_unit_test(test_golden_vectors),
  };
  return cmocka_run_group_tests(tests, NULL, teardown);
}
