/*
 * ecstore-bench pool: the buddy pool against glibc malloc/free, and the
 * FIFO eviction workload the store puts on it.
 *
 * 1. Throughput.  Each thread runs the pool's real use: objects of 64 KiB
 *    to 16 MiB (log-uniform, arbitrary byte counts, never powers of two on
 *    purpose), kept in a FIFO window and freed oldest first.  One op is one
 *    alloc plus one free.  The pool and glibc get the same size sequence in
 *    the same run; neither touches the memory, so this is the allocator's
 *    own cost.  Median of --reps runs; the ratio is pool/glibc throughput.
 * 2. FIFO utilization.  Objects uniform in 0.25..16 MiB (encoder outputs)
 *    fill the pool; whenever an allocation fails the oldest object is
 *    evicted and the allocation retried.  After a warm-up we report the
 *    mean of live requested bytes / pool bytes, and how many objects an
 *    allocation that had to evict evicted.  The default placement runs
 *    through the public API; the other placements run on the buddy core
 *    (same code, no lock, no memory) for comparison: the classic buddy
 *    placements, which need a whole free block of order ceil(log2 n).
 */
#include "bench.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ecstore/pool.h"
#include "mempool/buddy.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

static double rng_unit(uint64_t *s) {
  return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* ---- 1. alloc+free throughput ------------------------------------------- */

#define MIX_LO (64 * KiB)
#define MIX_HI (16 * MiB)

typedef struct tput {
  ecs_pool_t *pool;         /* NULL: glibc malloc/free */
  const size_t *sizes;      /* the size sequence of this thread */
  size_t nops;              /* allocs (and frees) to run */
  size_t window;            /* live objects kept */
  pthread_barrier_t *start; /* all threads start together */
  uint64_t t0, t1;          /* this thread's start and end (ns) */
  uint64_t evicted;         /* pool only: extra frees because the pool was full */
  int failed;               /* an allocation failed with nothing left to free */
} tput_t;

typedef struct slot {
  void *ptr;    /* glibc */
  uint64_t off; /* pool */
  size_t size;
} slot_t;

static void slot_free(tput_t *t, slot_t *s) {
  if (t->pool)
    ecs_pool_free(t->pool, s->off, s->size);
  else
    free(s->ptr);
}

static void *tput_main(void *arg) {
  tput_t *t = arg;
  slot_t *ring = calloc(t->window, sizeof *ring);
  size_t head = 0, count = 0;
  pthread_barrier_wait(t->start);
  t->t0 = ecs_bench_now_ns();
  for (size_t i = 0; i < t->nops && ring; i++) {
    if (count == t->window) {
      slot_free(t, &ring[head]);
      head = (head + 1) % t->window;
      count--;
    }
    slot_t *s = &ring[(head + count) % t->window];
    s->size = t->sizes[i];
    if (t->pool) {
      while (ecs_pool_alloc(t->pool, s->size, &s->off) != 0) {
        if (count == 0) { /* cannot happen with the windows we pick */
          t->failed = 1;
          goto out;
        }
        slot_free(t, &ring[head]);
        head = (head + 1) % t->window;
        count--;
        t->evicted++;
        s = &ring[(head + count) % t->window];
        s->size = t->sizes[i];
      }
    } else if (!(s->ptr = malloc(s->size))) {
      t->failed = 1;
      goto out;
    }
    count++;
  }
out:
  for (; count > 0; count--) {
    slot_free(t, &ring[head]);
    head = (head + 1) % t->window;
  }
  t->t1 = ecs_bench_now_ns();
  free(ring);
  return NULL;
}

/* Runs nthreads threads once; returns ops (alloc+free pairs) per second. */
static double tput_run(ecs_pool_t *pool, size_t **sizes, size_t nops, size_t window, int nthreads,
                       uint64_t *evicted, int *failed) {
  pthread_t th[64];
  tput_t t[64];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
  for (int i = 0; i < nthreads; i++) {
    t[i] = (tput_t){.pool = pool, .sizes = sizes[i], .nops = nops, .window = window, .start = &bar};
    pthread_create(&th[i], NULL, tput_main, &t[i]);
  }
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(th[i], NULL);
    t0 = t[i].t0 < t0 ? t[i].t0 : t0;
    t1 = t[i].t1 > t1 ? t[i].t1 : t1;
    *evicted += t[i].evicted;
    *failed |= t[i].failed;
  }
  pthread_barrier_destroy(&bar);
  return (double)nops * nthreads / ((double)(t1 - t0) / 1e9);
}

static int bench_throughput(ecs_pool_t *pool, size_t pool_size, int maxthreads, size_t nops, int reps) {
  /* log-uniform mean of [lo, hi] is (hi - lo) / ln(hi / lo); keep about a
   * third of the pool live so that the pool rarely has to evict. */
  double mean = (double)(MIX_HI - MIX_LO) / log((double)MIX_HI / MIX_LO);
  printf("\n## alloc+free throughput: pool vs glibc malloc/free, same sizes, same run\n");
  printf("# mix: sizes log-uniform %zu KiB..%zu MiB (arbitrary byte counts, mean %.1f MiB), freed in FIFO "
         "order;\n",
         MIX_LO / KiB, MIX_HI / MiB, mean / MiB);
  printf("#      one op = one alloc + one free; nobody touches the memory; median of %d runs of %zu ops per "
         "thread\n",
         reps, nops);
  printf(
      "# glibc: above M_MMAP_THRESHOLD (128 KiB at start) malloc uses mmap, but the threshold rises to the\n"
      "#        size of each mmapped chunk freed (up to 32 MiB), so after warm-up these sizes mostly come\n"
      "#        from the heap/arenas; its trimming may still make syscalls.  Measured as is.\n");
  printf("%-8s %-8s %12s %12s %12s %12s %9s %s\n", "threads", "window", "pool ns/op", "pool Mop/s",
         "glibc ns/op", "glibc Mop/s", "ratio", "pool evictions");
  int rc = 0, counts[8], ncounts = 0; /* 1, 2, 4, ... and maxthreads */
  for (int nt = 1; nt < maxthreads && ncounts < 7; nt *= 2)
    counts[ncounts++] = nt;
  counts[ncounts++] = maxthreads;
  for (int c = 0; c < ncounts; c++) {
    int nt = counts[c];
    size_t window = (size_t)((double)pool_size / 3.0 / mean / nt);
    if (window < 2)
      window = 2;
    size_t *sizes[64];
    for (int i = 0; i < nt; i++) {
      uint64_t seed = 0x51ed270b27a3f1c9ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
      sizes[i] = malloc(nops * sizeof(size_t));
      for (size_t k = 0; k < nops; k++)
        sizes[i][k] = (size_t)exp(log((double)MIX_LO) + rng_unit(&seed) * log((double)MIX_HI / MIX_LO));
    }
    double pv[32], gv[32];
    uint64_t evicted = 0;
    int failed = 0;
    /* Interleave the two so that drift (frequency, other load) hits both. */
    for (int r = 0; r < reps; r++) {
      pv[r] = tput_run(pool, sizes, nops, window, nt, &evicted, &failed);
      gv[r] = tput_run(NULL, sizes, nops, window, nt, &(uint64_t){0}, &failed);
    }
    double p = ecs_bench_median(pv, (size_t)reps), g = ecs_bench_median(gv, (size_t)reps);
    printf("%-8d %-8zu %12.1f %12.3f %12.1f %12.3f %8.2fx %llu\n", nt, window, 1e9 / p * nt, p / 1e6,
           1e9 / g * nt, g / 1e6, p / g, (unsigned long long)evicted);
    if (failed) {
      fprintf(stderr, "pool: an allocation failed with nothing left to free\n");
      rc = 1;
    }
    for (int i = 0; i < nt; i++)
      free(sizes[i]);
  }
  printf("# ns/op is per thread (wall time x threads / ops); Mop/s is the total\n");
  return rc;
}

/* ---- 2. FIFO eviction workload ------------------------------------------ */

#define FIFO_LO (256 * KiB)
#define FIFO_HI (16 * MiB)

/* The allocator under test: the public pool, or a bare buddy core. */
typedef struct fifo_alloc {
  ecs_pool_t *pool;
  ecs__buddy_t *core;
} fifo_alloc_t;

static int fa_alloc(fifo_alloc_t *a, size_t size, uint64_t *off) {
  return a->pool ? ecs_pool_alloc(a->pool, size, off) : ecs__buddy_alloc(a->core, size, off);
}

static int fa_free(fifo_alloc_t *a, uint64_t off, size_t size) {
  return a->pool ? ecs_pool_free(a->pool, off, size) : ecs__buddy_free(a->core, off, size);
}

typedef struct fifo_result {
  double util_mean, util_p5, granted_mean; /* fractions of the pool */
  double evict_per_fail;                   /* evictions per allocation that had to evict */
  double fail_rate;                        /* allocations that had to evict / allocations */
  double live_objects;                     /* mean live objects */
} fifo_result_t;

static int fifo_run(fifo_alloc_t *a, size_t pool_size, size_t warm, size_t measure, fifo_result_t *res) {
  size_t cap = pool_size / FIFO_LO + 2, head = 0, count = 0;
  slot_t *ring = calloc(cap, sizeof *ring);
  double *util = malloc(measure * sizeof *util);
  if (!ring || !util) {
    free(ring);
    free(util);
    return -1;
  }
  uint64_t seed = 0x2545f4914f6cdd1dull, live_req = 0, live_granted = 0, evictions = 0, fails = 0;
  double granted_sum = 0, objects_sum = 0;
  int rc = 0;
  for (size_t i = 0; i < warm + measure; i++) {
    size_t size = FIFO_LO + (size_t)(rng_unit(&seed) * (double)(FIFO_HI - FIFO_LO));
    uint64_t off;
    int failed_once = 0;
    while (fa_alloc(a, size, &off) != 0) {
      if (count == 0) {
        rc = -1;
        goto out;
      }
      failed_once = 1;
      slot_t *old = &ring[head];
      fa_free(a, old->off, old->size);
      live_req -= old->size;
      live_granted -= (old->size + 4095) / 4096 * 4096;
      head = (head + 1) % cap;
      count--;
      if (i >= warm)
        evictions++;
    }
    ring[(head + count) % cap] = (slot_t){.off = off, .size = size};
    count++;
    live_req += size;
    live_granted += (size + 4095) / 4096 * 4096;
    if (i >= warm) {
      fails += (uint64_t)failed_once;
      util[i - warm] = (double)live_req / (double)pool_size;
      granted_sum += (double)live_granted / (double)pool_size;
      objects_sum += (double)count;
    }
  }
  double sum = 0;
  for (size_t i = 0; i < measure; i++)
    sum += util[i];
  res->util_mean = sum / (double)measure;
  res->util_p5 = ecs_bench_percentile(util, measure, 5);
  res->granted_mean = granted_sum / (double)measure;
  res->evict_per_fail = fails ? (double)evictions / (double)fails : 0;
  res->fail_rate = (double)fails / (double)measure;
  res->live_objects = objects_sum / (double)measure;
out:
  for (; count > 0; count--) {
    fa_free(a, ring[head].off, ring[head].size);
    head = (head + 1) % cap;
  }
  free(ring);
  free(util);
  return rc;
}

static void fifo_print(const char *name, const fifo_result_t *r) {
  printf("%-25s %9.1f%% %9.1f%% %10.1f%% %9.1f %15.2f %9.2f\n", name, 100 * r->util_mean, 100 * r->util_p5,
         100 * r->granted_mean, r->live_objects, r->evict_per_fail, r->fail_rate);
}

static int bench_fifo(ecs_pool_t *pool, size_t pool_size, size_t measure) {
  double mean = (double)(FIFO_LO + FIFO_HI) / 2;
  size_t warm = (size_t)(3.0 * (double)pool_size / mean) + 100;
  printf("\n## FIFO eviction workload\n");
  printf("# objects uniform %zu KiB..%zu MiB (arbitrary byte counts); fill the pool, then evict the oldest\n"
         "# object whenever an allocation fails and retry; %zu objects warm-up, %zu measured\n",
         FIFO_LO / KiB, FIFO_HI / MiB, warm, measure);
  printf("# utilization = live requested bytes / pool bytes after each allocation (target >= 90%%)\n");
  printf("%-25s %10s %10s %11s %9s %15s %9s\n", "placement", "util mean", "util p5", "granted", "objects",
         "evict/fail-alloc", "fail rate");
  fifo_result_t r;
  fifo_alloc_t a = {.pool = pool};
  if (fifo_run(&a, pool_size, warm, measure, &r) != 0)
    return 1;
  fifo_print("runs, shortest (default)", &r);
  /* The placements that need a whole free block of order ceil(log2 n). */
  static const struct {
    ecs__buddy_policy_t policy;
    const char *name;
  } alt[] = {{ECS__BUDDY_BEST_FIT, "block best-fit (classic)"},
             {ECS__BUDDY_FIRST_FIT, "block first-fit"},
             {ECS__BUDDY_NEXT_FIT, "block next-fit"}};
  for (size_t i = 0; i < sizeof alt / sizeof alt[0]; i++) {
    ecs__buddy_t core;
    if (ecs__buddy_init(&core, pool_size, 4096) != 0)
      return 1;
    (void)ecs__buddy_set_policy(&core, alt[i].policy); /* fresh: cannot fail */
    fifo_alloc_t c = {.core = &core};
    int rc = fifo_run(&c, pool_size, warm, measure, &r);
    ecs__buddy_fini(&core);
    if (rc != 0)
      return 1;
    fifo_print(alt[i].name, &r);
  }
  printf("# granted = live granted (min-block rounded) bytes / pool; evict/fail-alloc = objects evicted per\n"
         "# allocation that had to evict; fail rate = allocations that had to evict / allocations\n");
  return 0;
}

/* ---- main --------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: ecstore-bench pool [--size 1G] [--threads N] [--reps R] [--objects N] [--quick] [--help]\n"
          "  --size     pool bytes (default 1G; K/M/G suffixes)\n"
          "  --threads  most threads for the throughput test (default: online CPUs, at least 2)\n"
          "  --reps     repetitions per throughput figure, median reported (default 5, quick 3)\n"
          "  --objects  FIFO objects measured after the warm-up (default 200000, quick 20000)\n"
          "  --quick    fewer ops and objects (< 10 s)\n");
}

int ecs_bench_pool(int argc, char **argv) {
  size_t size = (size_t)1 << 30;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cpus < 2 ? 2 : (int)cpus, quick = 0, reps = 0;
  size_t objects = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
      if (ecs_bench_parse_size(argv[++i], &size) != 0 || size < 32 * MiB) {
        fprintf(stderr, "pool: --size must be a size of at least 32M\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = atoi(argv[++i]);
      if (threads < 1 || threads > 64) {
        fprintf(stderr, "pool: --threads must be 1..64\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--objects") && i + 1 < argc) {
      objects = strtoul(argv[++i], NULL, 10);
      if (objects < 100) {
        fprintf(stderr, "pool: --objects must be at least 100\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1 || reps > 31) {
        fprintf(stderr, "pool: --reps must be 1..31\n");
        return 2;
      }
    } else {
      fprintf(stderr, "pool: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!reps)
    reps = quick ? 3 : 5;
  size_t nops = quick ? 20000 : 100000, measure = objects ? objects : quick ? 20000 : 200000;

  ecs_pool_opts_t o;
  ecs_pool_opts_init(&o);
  o.size = size;
  ecs_pool_t *pool = NULL;
  uint64_t t0 = ecs_bench_now_ns();
  int rc = ecs_pool_create(&o, &pool);
  if (rc != 0) {
    fprintf(stderr, "pool: create of %zu bytes failed: %s\n", size, ecs_strerror(rc));
    return 1;
  }
  double create_s = (double)(ecs_bench_now_ns() - t0) / 1e9;
  ecs_pool_stats_t st;
  ecs_pool_stats(pool, &st);
  printf("# ecstore-bench pool: %zu MiB pool, min block %llu KiB, up to %d threads%s\n", size / MiB,
         (unsigned long long)st.min_block / 1024, threads, quick ? ", quick" : "");
  ecs_bench_print_machine();
  printf("# region: create %.2f s (memfd, MAP_POPULATE), locked=%d hugepages=%d\n", create_s, st.locked,
         st.hugepages);
  rc = bench_throughput(pool, (size_t)st.size, threads, nops, reps);
  if (bench_fifo(pool, (size_t)st.size, measure) != 0)
    rc = 1;
  if (ecs_pool_validate(pool) != 0)
    rc = 1;
  ecs_pool_destroy(pool);
  return rc;
}
