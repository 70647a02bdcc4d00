/*
 * ecstore-bench codec: compression ratio and single-thread speed of the
 * codecs (store/core/codec.h) on encoder-like tensors and on random bytes, with
 * memcpy of the same bytes measured in the same run as the baseline.
 *
 * The tensors are normal values (mean 0, std 1, Box-Muller from a fixed
 * seed) stored as f16, bf16 and f32, as an encoder's output roughly is.
 * Each figure is the median of --reps runs over the whole buffer; MB/s are
 * raw (uncompressed) bytes, 10^6 per second, one thread.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>

#include "store/core/codec.h"
#include "support/tensors.h"

/* ---- Data ---------------------------------------------------------------- */

/* A data set: what the bytes are and which dtype they are stored as. */
typedef struct dataset {
  const char *name; /* printed */
  int dtype;        /* the dtype (decides the shuffle) */
} dataset_t;

static const dataset_t datasets[] = {
    {"f16", ECS_DTYPE_F16},
    {"bf16", ECS_DTYPE_BF16},
    {"f32", ECS_DTYPE_F32},
    {"random", ECS_DTYPE_F32}, /* random bytes, shuffled as f32 in the +shuffle rows */
};

static void fill(uint8_t *p, size_t n, const dataset_t *ds) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  size_t i = 0;
  if (!strcmp(ds->name, "random")) {
    for (; i < n; i++)
      p[i] = (uint8_t)(ecs_ts_rng_next(&s) >> 56);
    return;
  }
  size_t e = ds->dtype == ECS_DTYPE_F32 ? 4 : 2;
  for (; i + e <= n; i += e) {
    float f = ecs_ts_normal(&s);
    if (ds->dtype == ECS_DTYPE_F32) {
      memcpy(p + i, &f, 4);
    } else {
      uint16_t h = ds->dtype == ECS_DTYPE_BF16 ? ecs_ts_f32_to_bf16(f) : ecs_ts_f32_to_f16(f);
      memcpy(p + i, &h, 2);
    }
  }
  for (; i < n; i++)
    p[i] = 0;
}

/* ---- Measurement -------------------------------------------------------- */

/* A row of the table: one codec configuration. */
typedef struct config {
  const char *label; /* printed */
  int codec;         /* request codec */
  int level;         /* zstd level (0: default) */
  int shuffle;       /* 1: the data set's dtype, 0: ECS_DTYPE_U8 (no shuffle) */
} config_t;

static const config_t configs[] = {
    {"lz4", ECS_CODEC_LZ4, 0, 0},
    {"lz4+shuffle", ECS_CODEC_LZ4, 0, 1},
    {"zstd-1", ECS_CODEC_ZSTD, 1, 0},
    {"zstd-1+shuffle", ECS_CODEC_ZSTD, 1, 1},
    {"zstd-3", ECS_CODEC_ZSTD, 3, 0},
    {"zstd-3+shuffle", ECS_CODEC_ZSTD, 3, 1},
    {"auto (zstd-1)", ECS_CODEC_AUTO | ECS_CODEC_ZSTD, 1, 1},
};

typedef struct bufs {
  uint8_t *src, *comp, *back; /* raw input, compressed, decompressed */
  size_t n, comp_cap;
} bufs_t;

static double mbps(size_t n, double ns) {
  return ns > 0 ? (double)n / ns * 1e3 : 0.0;
}

/* Median MB/s of memcpy, or of shuffle and unshuffle when elem > 0.  These
 * are short and the machine may be shared, so they run three times as
 * often as the codecs (up to 64). */
static void time_copy(const bufs_t *b, int reps, size_t elem, double *fwd, double *inv) {
  double tf[64], ti[64];
  reps = reps * 3 > 64 ? 64 : reps * 3;
  for (int r = 0; r < reps; r++) {
    uint64_t t0 = ecs_bench_now_ns();
    if (elem)
      ecs_codec_shuffle(b->comp, b->src, b->n, elem);
    else
      memcpy(b->comp, b->src, b->n);
    uint64_t t1 = ecs_bench_now_ns();
    if (elem)
      ecs_codec_unshuffle(b->back, b->comp, b->n, elem);
    else
      memcpy(b->back, b->comp, b->n);
    uint64_t t2 = ecs_bench_now_ns();
    tf[r] = (double)(t1 - t0);
    ti[r] = (double)(t2 - t1);
  }
  *fwd = mbps(b->n, ecs_bench_median(tf, (size_t)reps));
  *inv = mbps(b->n, ecs_bench_median(ti, (size_t)reps));
}

/* Runs one configuration; returns 0, or -1 if a call failed or the round
 * trip did not give the input back. */
static int time_codec(const bufs_t *b, const dataset_t *ds, const config_t *c, int reps, double *ratio,
                      double *cmb, double *dmb, uint8_t *used) {
  double tc[64], td[64];
  int dtype = c->shuffle ? ds->dtype : ECS_DTYPE_U8;
  size_t len = 0;
  for (int r = -1; r < reps; r++) { /* r == -1: warm-up (contexts, page faults) */
    uint64_t t0 = ecs_bench_now_ns();
    int rc = ecs_codec_compress(c->codec, dtype, b->src, b->n, b->comp, b->comp_cap, &len, used, c->level);
    uint64_t t1 = ecs_bench_now_ns();
    if (rc != ECS_OK) {
      fprintf(stderr, "bench codec: compress %s: %s\n", c->label, ecs_strerror(rc));
      return -1;
    }
    rc = ecs_codec_decompress(*used, dtype, b->comp, len, b->back, b->n);
    uint64_t t2 = ecs_bench_now_ns();
    if (rc != ECS_OK || memcmp(b->src, b->back, b->n) != 0) {
      fprintf(stderr, "bench codec: %s did not round-trip (%s)\n", c->label, ecs_strerror(rc));
      return -1;
    }
    if (r >= 0) {
      tc[r] = (double)(t1 - t0);
      td[r] = (double)(t2 - t1);
    }
  }
  *ratio = len ? (double)b->n / (double)len : 0.0;
  *cmb = mbps(b->n, ecs_bench_median(tc, (size_t)reps));
  *dmb = mbps(b->n, ecs_bench_median(td, (size_t)reps));
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ecstore-bench codec [--size BYTES] [--reps N] [--quick] [--help]\n"
             "  --size BYTES  tensor bytes per run (default 4M; 1M with --quick)\n"
             "  --reps N      runs per figure, median printed (default 15; 5 with --quick; max 64)\n"
             "  --quick       the small, fast version (< 10 s)\n"
             "Ratio = raw/compressed; MB/s = raw 10^6 bytes per second, one thread;\n"
             "%%cpy = speed as a percentage of memcpy of the same bytes in the same run.\n");
}

int ecs_bench_codec(int argc, char **argv) {
  size_t size = 0;
  int reps = 0, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
      if (ecs_bench_parse_size(argv[++i], &size) != 0 || size == 0) {
        fprintf(stderr, "bench codec: bad --size '%s'\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1 || reps > 64) {
        fprintf(stderr, "bench codec: --reps must be 1..64\n");
        return 2;
      }
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (!size)
    size = quick ? (1u << 20) : (4u << 20);
  if (!reps)
    reps = quick ? 5 : 15;

  bufs_t b = {.n = size, .comp_cap = ecs_codec_bound(ECS_CODEC_LZ4, size)};
  size_t zb = ecs_codec_bound(ECS_CODEC_ZSTD, size);
  if (zb > b.comp_cap)
    b.comp_cap = zb;
  b.src = malloc(size);
  b.back = malloc(size);
  b.comp = b.comp_cap ? malloc(b.comp_cap) : NULL;
  if (!b.src || !b.back || !b.comp) {
    fprintf(stderr, "bench codec: out of memory for %zu bytes\n", size);
    free(b.src);
    free(b.back);
    free(b.comp);
    return 1;
  }
  memset(b.back, 0, size); /* fault the pages in before timing */
  memset(b.comp, 0, b.comp_cap);

  ecs_bench_print_machine();
  printf("# codec: %zu bytes per tensor, median of %d runs, one thread; lz4 %s, zstd %s\n", size, reps,
         LZ4_versionString(), ZSTD_versionString());
  printf("%-7s %-18s %7s %10s %6s %10s %6s\n", "data", "codec", "ratio", "comp MB/s", "%cpy", "dec MB/s",
         "%cpy");

  int rc = 0;
  for (size_t d = 0; d < sizeof datasets / sizeof datasets[0] && rc == 0; d++) {
    const dataset_t *ds = &datasets[d];
    fill(b.src, size, ds);
    double cpy_f, cpy_i, sh_f, sh_i;
    time_copy(&b, reps, 0, &cpy_f, &cpy_i);
    double cpy = (cpy_f + cpy_i) / 2; /* both directions copy the same bytes */
    printf("%-7s %-18s %7.3f %10.0f %6s %10.0f %6s\n", ds->name, "memcpy", 1.0, cpy_f, "", cpy_i, "");
    size_t elem = ecs_codec_shuffle_elem(ds->dtype);
    time_copy(&b, reps, elem, &sh_f, &sh_i);
    char label[32];
    snprintf(label, sizeof label, "shuffle%zu only", elem);
    printf("%-7s %-18s %7.3f %10.0f %5.0f%% %10.0f %5.0f%%\n", ds->name, label, 1.0, sh_f, 100 * sh_f / cpy,
           sh_i, 100 * sh_i / cpy);
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
      double ratio, cmb, dmb;
      uint8_t used = 0;
      if (time_codec(&b, ds, &configs[c], reps, &ratio, &cmb, &dmb, &used) != 0) {
        rc = 1;
        break;
      }
      const char *lab = configs[c].label;
      if (configs[c].codec & ECS_CODEC_AUTO) {
        snprintf(label, sizeof label, "auto->%s", ecs_codec_name(used));
        lab = label;
      }
      printf("%-7s %-18s %7.3f %10.0f %5.0f%% %10.0f %5.0f%%\n", ds->name, lab, ratio, cmb, 100 * cmb / cpy,
             dmb, 100 * dmb / cpy);
    }
  }
  ecs_codec_thread_release();
  free(b.src);
  free(b.back);
  free(b.comp);
  return rc;
}
