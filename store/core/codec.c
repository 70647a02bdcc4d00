/*
 * Compression codecs (store/core/codec.h): lz4 and zstd block compression over
 * whole objects, with an optional byte shuffle first.  docs/codec.md has the
 * design and the measurements behind the defaults.
 */
#include "store/core/codec.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

/* ---- Per-thread state ---------------------------------------------------- */

/* What one thread keeps between calls, so that the hot path neither
 * allocates nor creates zstd contexts. */
typedef struct ecs__codec_tls {
  ZSTD_CCtx *cctx;       /* zstd compression context (lazily created) */
  ZSTD_DCtx *dctx;       /* zstd decompression context (lazily created) */
  uint8_t *scratch;      /* shuffle buffer: shuffled input or output */
  size_t scratch_cap;    /* bytes at scratch */
  uint8_t *sample;       /* ecs_codec_choose(): the (shuffled) sample */
  uint8_t *sample_out;   /* ecs_codec_choose(): the sample compressed */
  size_t sample_out_cap; /* bytes at sample_out */
} ecs__codec_tls_t;

static _Thread_local ecs__codec_tls_t *tls_state;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_key_ok;

static void tls_free(ecs__codec_tls_t *t) {
  if (!t)
    return;
  ZSTD_freeCCtx(t->cctx);
  ZSTD_freeDCtx(t->dctx);
  free(t->scratch);
  free(t->sample);
  free(t->sample_out);
  free(t);
}

/* pthread key destructor: runs when a thread that used a codec exits. */
static void tls_destructor(void *p) {
  tls_free(p);
  tls_state = NULL;
}

static void tls_key_init(void) {
  tls_key_ok = pthread_key_create(&tls_key, tls_destructor) == 0;
}

static ecs__codec_tls_t *tls_get(void) {
  if (tls_state)
    return tls_state;
  pthread_once(&tls_once, tls_key_init);
  ecs__codec_tls_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  if (tls_key_ok)
    pthread_setspecific(tls_key, t);
  tls_state = t;
  return t;
}

void ecs_codec_thread_release(void) {
  ecs__codec_tls_t *t = tls_state;
  if (!t)
    return;
  if (tls_key_ok)
    pthread_setspecific(tls_key, NULL);
  tls_state = NULL;
  tls_free(t);
}

/* Returns the thread's scratch with room for n bytes, or NULL. */
static uint8_t *scratch_get(ecs__codec_tls_t *t, size_t n) {
  if (t->scratch_cap >= n)
    return t->scratch;
  free(t->scratch);
  t->scratch = malloc(n);
  t->scratch_cap = t->scratch ? n : 0;
  return t->scratch;
}

/* A huge scratch is not kept: the next huge object pays one malloc, which is
 * small next to compressing it, and an idle thread does not pin memory. */
static void scratch_trim(ecs__codec_tls_t *t) {
  if (t->scratch_cap > ECS_CODEC_SCRATCH_KEEP) {
    free(t->scratch);
    t->scratch = NULL;
    t->scratch_cap = 0;
  }
}

/* ---- Names ---------------------------------------------------------------- */

int ecs_codec_valid(int codec) {
  int id = codec & ECS_CODEC_ID_MASK;
  if (codec < 0 || (codec & ~(ECS_CODEC_ID_MASK | ECS_CODEC_SHUFFLE)))
    return 0;
  if (id == ECS_CODEC_NONE)
    return codec == ECS_CODEC_NONE; /* raw bytes are never shuffled */
  return id == ECS_CODEC_LZ4 || id == ECS_CODEC_ZSTD;
}

int ecs_codec_frame_ok(int codec, uint64_t nbytes, uint64_t raw_nbytes) {
  int id = codec & ECS_CODEC_ID_MASK;
  if (!ecs_codec_valid(codec) || id == ECS_CODEC_NONE || raw_nbytes > SIZE_MAX)
    return 0;
  size_t bound = ecs_codec_bound(id, (size_t)raw_nbytes); /* the bound is the base codec's */
  /* nbytes 0: no compressor emits an empty frame (and with no compressed
   * bytes there is no scratch buffer to point the decoder into) */
  return bound != 0 && nbytes != 0 && nbytes <= bound;
}

/* A request codec: a base id, optionally with ECS_CODEC_AUTO. */
static int request_valid(int codec) {
  if (codec < 0 || (codec & ~(ECS_CODEC_ID_MASK | ECS_CODEC_AUTO)))
    return 0;
  int id = codec & ECS_CODEC_ID_MASK;
  return id == ECS_CODEC_NONE || id == ECS_CODEC_LZ4 || id == ECS_CODEC_ZSTD;
}

int ecs_codec_parse(const char *name, int *out) {
  static const struct {
    const char *name;
    int codec;
  } names[] = {
      {"none", ECS_CODEC_NONE},
      {"lz4", ECS_CODEC_LZ4},
      {"zstd", ECS_CODEC_ZSTD},
      {"auto", ECS_CODEC_AUTO | ECS_CODEC_AUTO_DEFAULT},
      {"auto:lz4", ECS_CODEC_AUTO | ECS_CODEC_LZ4},
      {"auto:zstd", ECS_CODEC_AUTO | ECS_CODEC_ZSTD},
  };
  if (!name || !out)
    return ECS_EINVAL;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!strcmp(name, names[i].name)) {
      *out = names[i].codec;
      return ECS_OK;
    }
  }
  return ECS_EINVAL;
}

const char *ecs_codec_name(int codec) {
  switch (codec) {
  case ECS_CODEC_NONE: return "none";
  case ECS_CODEC_LZ4: return "lz4";
  case ECS_CODEC_ZSTD: return "zstd";
  case ECS_CODEC_LZ4 | ECS_CODEC_SHUFFLE: return "lz4+shuffle";
  case ECS_CODEC_ZSTD | ECS_CODEC_SHUFFLE: return "zstd+shuffle";
  case ECS_CODEC_AUTO | ECS_CODEC_NONE: return "none"; /* auto over none is none */
  case ECS_CODEC_AUTO | ECS_CODEC_LZ4: return "auto:lz4";
  case ECS_CODEC_AUTO | ECS_CODEC_ZSTD: return "auto:zstd";
  default: return "invalid";
  }
}

size_t ecs_codec_shuffle_elem(int dtype) {
  switch (dtype) {
  case ECS_DTYPE_F16:
  case ECS_DTYPE_BF16: return 2;
  case ECS_DTYPE_F32:
  case ECS_DTYPE_I32: return 4;
  default: return 0;
  }
}

/* ---- Byte shuffle ------------------------------------------------------- */

/* The 2- and 4-byte cases are plain loops with a constant stride that the
 * compiler turns into vector shuffles; optimize("O3") asks for that in
 * -O2 builds too (GCC's -O2 cost model leaves interleaved accesses scalar).
 * bench/bench_codec.c measures them against memcpy. */
#if defined(__GNUC__) && !defined(__clang__)
#define ECS__VECTORIZE __attribute__((optimize("O3")))
#else
#define ECS__VECTORIZE
#endif

ECS__VECTORIZE static void shuffle2(uint8_t *restrict d, const uint8_t *restrict s, size_t ne) {
  for (size_t i = 0; i < ne; i++) {
    d[i] = s[2 * i];
    d[ne + i] = s[2 * i + 1];
  }
}

ECS__VECTORIZE static void unshuffle2(uint8_t *restrict d, const uint8_t *restrict s, size_t ne) {
  for (size_t i = 0; i < ne; i++) {
    d[2 * i] = s[i];
    d[2 * i + 1] = s[ne + i];
  }
}

ECS__VECTORIZE static void shuffle4(uint8_t *restrict d, const uint8_t *restrict s, size_t ne) {
  for (size_t i = 0; i < ne; i++) {
    d[i] = s[4 * i];
    d[ne + i] = s[4 * i + 1];
    d[2 * ne + i] = s[4 * i + 2];
    d[3 * ne + i] = s[4 * i + 3];
  }
}

ECS__VECTORIZE static void unshuffle4(uint8_t *restrict d, const uint8_t *restrict s, size_t ne) {
  for (size_t i = 0; i < ne; i++) {
    d[4 * i] = s[i];
    d[4 * i + 1] = s[ne + i];
    d[4 * i + 2] = s[2 * ne + i];
    d[4 * i + 3] = s[3 * ne + i];
  }
}

void ecs_codec_shuffle(void *dst, const void *src, size_t n, size_t elem) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t ne = elem ? n / elem : 0;
  if (elem <= 1 || ne == 0) {
    if (n)
      memcpy(d, s, n);
    return;
  }
  if (elem == 2)
    shuffle2(d, s, ne);
  else if (elem == 4)
    shuffle4(d, s, ne);
  else
    for (size_t b = 0; b < elem; b++)
      for (size_t i = 0; i < ne; i++)
        d[b * ne + i] = s[i * elem + b];
  memcpy(d + ne * elem, s + ne * elem, n - ne * elem);
}

void ecs_codec_unshuffle(void *dst, const void *src, size_t n, size_t elem) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t ne = elem ? n / elem : 0;
  if (elem <= 1 || ne == 0) {
    if (n)
      memcpy(d, s, n);
    return;
  }
  if (elem == 2)
    unshuffle2(d, s, ne);
  else if (elem == 4)
    unshuffle4(d, s, ne);
  else
    for (size_t b = 0; b < elem; b++)
      for (size_t i = 0; i < ne; i++)
        d[i * elem + b] = s[b * ne + i];
  memcpy(d + ne * elem, s + ne * elem, n - ne * elem);
}

/* ---- Block codecs ------------------------------------------------------- */

/* zstd's largest block (ZSTD_BLOCKSIZE_MAX, behind ZSTD_STATIC_LINKING_ONLY). */
#define ECS__ZSTD_BLOCK (128u * 1024)

static int zstd_level(int level) {
  if (level == 0)
    return ECS_CODEC_ZSTD_DEFAULT_LEVEL;
  if (level < ZSTD_minCLevel())
    return ZSTD_minCLevel();
  if (level > ZSTD_maxCLevel())
    return ZSTD_maxCLevel();
  return level;
}

size_t ecs_codec_bound(int codec, size_t n) {
  if (!request_valid(codec))
    return 0;
  size_t b;
  switch (codec & ECS_CODEC_ID_MASK) {
  case ECS_CODEC_LZ4:
    if (n > LZ4_MAX_INPUT_SIZE)
      return 0;
    b = (size_t)LZ4_compressBound((int)n);
    break;
  case ECS_CODEC_ZSTD:
    b = ZSTD_compressBound(n);
    if (ZSTD_isError(b))
      return 0;
    break;
  default: b = n; break;
  }
  /* Auto may fall back to a raw copy, which needs n. */
  return b > n ? b : n;
}

/* Compresses n bytes with base codec id (lz4 or zstd) into at most cap bytes.
 * Returns ECS_OK, ECS_EBUFSMALL when the output does not fit cap, or another
 * error. */
static int block_compress(ecs__codec_tls_t *t, int id, const uint8_t *src, size_t n, uint8_t *dst, size_t cap,
                          size_t *out_len, int level) {
  static const uint8_t empty[1];
  if (!n)
    src = empty; /* the libraries want a pointer even for no bytes */
  if (cap == 0)
    return ECS_EBUFSMALL; /* both formats need at least one byte */
  if (id == ECS_CODEC_LZ4) {
    if (n > LZ4_MAX_INPUT_SIZE)
      return ECS_EOVERFLOW;
    int c = cap > INT_MAX ? INT_MAX : (int)cap;
    int r = LZ4_compress_default((const char *)src, (char *)dst, (int)n, c);
    if (r <= 0)
      return ECS_EBUFSMALL; /* lz4's only failure with a valid input size */
    *out_len = (size_t)r;
    return ECS_OK;
  }
  if (!t->cctx && !(t->cctx = ZSTD_createCCtx()))
    return ECS_ENOMEM;
  size_t r = ZSTD_compressCCtx(t->cctx, dst, cap, src, n, zstd_level(level));
  if (ZSTD_isError(r))
    return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? ECS_EBUFSMALL : ECS_ECODEC;
  *out_len = r;
  return ECS_OK;
}

/* Decompresses into exactly raw_len bytes.  ECS_OK or ECS_ECODEC. */
static int block_decompress(ecs__codec_tls_t *t, int id, const uint8_t *src, size_t n, uint8_t *dst,
                            size_t raw_len) {
  if (id == ECS_CODEC_LZ4) {
    if (n > INT_MAX || raw_len > INT_MAX || n == 0)
      return ECS_ECODEC;
    uint8_t one;
    /* lz4 needs somewhere to point for an empty output; nothing is written. */
    int r = LZ4_decompress_safe((const char *)src, (char *)(raw_len ? dst : &one), (int)n, (int)raw_len);
    return r >= 0 && (size_t)r == raw_len ? ECS_OK : ECS_ECODEC;
  }
  /* The frame header says its size; refuse a mismatch before any work. */
  unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
  if (fcs == ZSTD_CONTENTSIZE_ERROR || (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != raw_len))
    return ECS_ECODEC;
  if (!t->dctx && !(t->dctx = ZSTD_createDCtx()))
    return ECS_ENOMEM;
  size_t r = ZSTD_decompressDCtx(t->dctx, dst, raw_len, src, n);
  return !ZSTD_isError(r) && r == raw_len ? ECS_OK : ECS_ECODEC;
}

/* ---- Public entry points ------------------------------------------------ */

int ecs_codec_choose(int codec, int dtype, const void *src, size_t n, int level) {
  if (!request_valid(codec) || (!src && n))
    return ECS_EINVAL;
  int id = codec & ECS_CODEC_ID_MASK;
  if (id == ECS_CODEC_NONE || n == 0)
    return ECS_CODEC_NONE;
  if (id == ECS_CODEC_LZ4 && n > LZ4_MAX_INPUT_SIZE)
    return ECS_CODEC_NONE;
  ecs__codec_tls_t *t = tls_get();
  if (!t)
    return ECS_ENOMEM;
  if (!t->sample && !(t->sample = malloc(ECS_CODEC_SAMPLE_BYTES)))
    return ECS_ENOMEM;
  size_t bound = ecs_codec_bound(id, ECS_CODEC_SAMPLE_BYTES);
  if (t->sample_out_cap < bound) {
    free(t->sample_out);
    if (!(t->sample_out = malloc(bound)))
      return t->sample_out_cap = 0, ECS_ENOMEM;
    t->sample_out_cap = bound;
  }

  /* The sample: all of a small input, else equal runs of whole elements
   * spread over it, gathered (into sample_out, free until the compress
   * below) and shuffled together as compress would shuffle them. */
  const uint8_t *s = src;
  size_t elem = ecs_codec_shuffle_elem(dtype);
  size_t unit = elem ? elem : 1;
  size_t len = 0;
  if (n <= ECS_CODEC_SAMPLE_BYTES) {
    len = n;
    ecs_codec_shuffle(t->sample, s, n, elem);
  } else {
    size_t part = ECS_CODEC_SAMPLE_BYTES / ECS_CODEC_SAMPLE_PARTS / unit * unit;
    size_t stride = (n - part) / (ECS_CODEC_SAMPLE_PARTS - 1) / unit * unit;
    for (size_t i = 0; i < ECS_CODEC_SAMPLE_PARTS; i++, len += part)
      memcpy(t->sample_out + len, s + i * stride, part);
    ecs_codec_shuffle(t->sample, t->sample_out, len, elem);
  }

  /* zstd codes the literals of each 128 KiB block with one Huffman table.
   * When the object's byte planes are a block or longer, each block holds
   * mostly one plane (the exponent bytes, say, apart from the noisy low
   * mantissa bytes), so the sample's planes are compressed apart too;
   * compressed together they would share one table and predict far less
   * than the object gets.  A shorter object mixes its planes in a block,
   * and so does its sample. */
  size_t planes = elem && n / elem >= ECS__ZSTD_BLOCK ? elem : 1;
  size_t plane = len / planes;
  /* Asking for no more room than len / ratio makes the codec stop as soon
   * as the sample cannot reach the ratio. */
  size_t budget = (size_t)((double)len / ECS_CODEC_AUTO_MIN_RATIO), used = 0;
  for (size_t p = 0; p < planes; p++) {
    size_t in = p + 1 < planes ? plane : len - p * plane, out = 0;
    int rc = block_compress(t, id, t->sample + p * plane, in, t->sample_out, budget - used, &out, level);
    if (rc == ECS_EBUFSMALL)
      return ECS_CODEC_NONE;
    if (rc < 0)
      return rc;
    used += out;
  }
  return id;
}

/* The stored form when compression is off or does not pay: a copy. */
static int store_raw(const void *src, size_t n, void *dst, size_t dst_cap, size_t *out_len,
                     uint8_t *codec_used) {
  if (dst_cap < n)
    return ECS_EBUFSMALL;
  if (n)
    memcpy(dst, src, n);
  *out_len = n;
  *codec_used = ECS_CODEC_NONE;
  return ECS_OK;
}

int ecs_codec_compress(int codec, int dtype, const void *src, size_t n, void *dst, size_t dst_cap,
                       size_t *out_len, uint8_t *codec_used, int level) {
  if (!request_valid(codec) || !out_len || !codec_used || (!src && n) || (!dst && (n || dst_cap)))
    return ECS_EINVAL;
  int id = codec & ECS_CODEC_ID_MASK;
  int is_auto = (codec & ECS_CODEC_AUTO) != 0;
  if (is_auto) {
    int c = ecs_codec_choose(codec, dtype, src, n, level);
    if (c < 0)
      return c;
    id = c;
  }
  if (id == ECS_CODEC_NONE)
    return store_raw(src, n, dst, dst_cap, out_len, codec_used);

  ecs__codec_tls_t *t = tls_get();
  if (!t)
    return ECS_ENOMEM;
  const uint8_t *in = src;
  size_t elem = ecs_codec_shuffle_elem(dtype);
  if (elem && n >= elem) {
    uint8_t *sc = scratch_get(t, n);
    if (!sc)
      return ECS_ENOMEM;
    ecs_codec_shuffle(sc, src, n, elem);
    in = sc;
  } else {
    elem = 0; /* less than one element: nothing to shuffle */
  }
  /* Auto keeps the result only if it reaches the ratio over the whole
   * object too; asking for that little room stops the codec early. */
  size_t cap = dst_cap;
  if (is_auto) {
    size_t want = (size_t)((double)n / ECS_CODEC_AUTO_MIN_RATIO);
    cap = want < cap ? want : cap;
  }
  int rc = block_compress(t, id, in, n, dst, cap, out_len, level);
  scratch_trim(t);
  if (rc == ECS_EBUFSMALL && is_auto)
    return store_raw(src, n, dst, dst_cap, out_len, codec_used);
  if (rc < 0)
    return rc;
  *codec_used = (uint8_t)(id | (elem ? ECS_CODEC_SHUFFLE : 0));
  return ECS_OK;
}

int ecs_codec_decompress(uint8_t codec_used, int dtype, const void *src, size_t n, void *dst,
                         size_t raw_len) {
  if ((!src && n) || (!dst && raw_len))
    return ECS_EINVAL;
  if (!ecs_codec_valid(codec_used))
    return ECS_ECODEC;
  int id = codec_used & ECS_CODEC_ID_MASK;
  if (id == ECS_CODEC_NONE) {
    if (n != raw_len)
      return ECS_ECODEC;
    if (n && dst != src)
      memcpy(dst, src, n);
    return ECS_OK;
  }
  size_t elem = 0;
  if (codec_used & ECS_CODEC_SHUFFLE) {
    elem = ecs_codec_shuffle_elem(dtype);
    if (!elem || raw_len < elem) /* compress never shuffles these */
      return ECS_ECODEC;
  }
  ecs__codec_tls_t *t = tls_get();
  if (!t)
    return ECS_ENOMEM;
  if (!elem)
    return block_decompress(t, id, src, n, dst, raw_len);
  uint8_t *sc = scratch_get(t, raw_len);
  if (!sc)
    return ECS_ENOMEM;
  int rc = block_decompress(t, id, src, n, sc, raw_len);
  if (rc == ECS_OK)
    ecs_codec_unshuffle(dst, sc, raw_len, elem);
  scratch_trim(t);
  return rc;
}
