/*
 * pool2t: the two-thread half of `ecstore-bench pool` (same sizes, seeds,
 * window and FIFO order), alone, with knobs to take it apart.  Not built by
 * CMake; see README.md next to it for the command line.
 *
 *   pool2t [THREADS] [REPS]     prints Mop/s (alloc+free pairs) per rep
 *   PIN=1   pin thread i to CPU i % 2, so the threads really run at once
 *   MODE=0  one shared pool (what the benchmark measures)
 *   MODE=1  one pool per thread: nothing shared (the ceiling)
 *   MODE=2  one pool per thread, every call also under one shared glibc
 *           adaptive mutex: the cost of handing a lock over, with no
 *           allocator lines to move
 *   LAT=1   also time every alloc call and print percentiles (ns)
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ecstore/pool.h"

#define NOPS 100000

static int mode, pin, lat;
static atomic_int pin_next;
static pthread_mutex_t big_lock;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

static int do_alloc(ecs_pool_t *p, size_t size, uint64_t *off) {
  if (mode == 2)
    pthread_mutex_lock(&big_lock);
  int rc = ecs_pool_alloc(p, size, off);
  if (mode == 2)
    pthread_mutex_unlock(&big_lock);
  return rc;
}

static void do_free(ecs_pool_t *p, uint64_t off, size_t size) {
  if (mode == 2)
    pthread_mutex_lock(&big_lock);
  ecs_pool_free(p, off, size);
  if (mode == 2)
    pthread_mutex_unlock(&big_lock);
}

typedef struct slot {
  uint64_t off;
  size_t size;
} slot_t;

typedef struct worker {
  ecs_pool_t *pool;
  const size_t *sizes;
  size_t window;
  pthread_barrier_t *start;
  uint64_t t0, t1;
  uint32_t *lat; /* per alloc call, ns */
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  if (pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atomic_fetch_add(&pin_next, 1) % 2, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  slot_t *ring = calloc(w->window, sizeof *ring);
  size_t head = 0, count = 0;
  pthread_barrier_wait(w->start);
  w->t0 = now_ns();
  for (size_t i = 0; i < NOPS; i++) {
    if (count == w->window) {
      do_free(w->pool, ring[head].off, ring[head].size);
      head = (head + 1) % w->window;
      count--;
    }
    slot_t *s = &ring[(head + count) % w->window];
    s->size = w->sizes[i];
    uint64_t q0 = lat ? now_ns() : 0;
    while (do_alloc(w->pool, s->size, &s->off) != 0) { /* evict the oldest */
      do_free(w->pool, ring[head].off, ring[head].size);
      head = (head + 1) % w->window;
      count--;
      s = &ring[(head + count) % w->window];
      s->size = w->sizes[i];
    }
    if (lat)
      w->lat[i] = (uint32_t)(now_ns() - q0);
    count++;
  }
  for (; count > 0; count--) {
    do_free(w->pool, ring[head].off, ring[head].size);
    head = (head + 1) % w->window;
  }
  w->t1 = now_ns();
  free(ring);
  return NULL;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int nt = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
  if (nt < 1 || nt > 8 || reps < 1)
    return 2;
  mode = getenv("MODE") ? atoi(getenv("MODE")) : 0;
  pin = getenv("PIN") != NULL;
  lat = getenv("LAT") != NULL;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&big_lock, &attr);
  ecs_pool_opts_t o;
  ecs_pool_opts_init(&o);
  o.size = (size_t)1 << 30;
  ecs_pool_t *pools[8] = {0};
  for (int i = 0; i < (mode ? nt : 1); i++)
    if (ecs_pool_create(&o, &pools[i]) != 0)
      return 1;
  /* As bench_pool.c: a third of the pool live, split between the threads. */
  double lo = 64 << 10, hi = 16 << 20, mean = (hi - lo) / log(hi / lo);
  size_t window = (size_t)((double)o.size / 3.0 / mean / nt);
  size_t *sizes[8];
  for (int i = 0; i < nt; i++) {
    uint64_t seed = 0x51ed270b27a3f1c9ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    sizes[i] = malloc(NOPS * sizeof(size_t));
    for (size_t k = 0; k < NOPS; k++)
      sizes[i][k] =
          (size_t)exp(log(lo) + (double)(rng_next(&seed) >> 11) / 9007199254740992.0 * log(hi / lo));
  }
  for (int r = 0; r < reps; r++) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nt);
    pthread_t th[8];
    worker_t w[8];
    for (int i = 0; i < nt; i++) {
      w[i] = (worker_t){.pool = pools[mode ? i : 0], .sizes = sizes[i], .window = window, .start = &start};
      w[i].lat = malloc(NOPS * sizeof(uint32_t));
      pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int i = 0; i < nt; i++) {
      pthread_join(th[i], NULL);
      t0 = w[i].t0 < t0 ? w[i].t0 : t0;
      t1 = w[i].t1 > t1 ? w[i].t1 : t1;
    }
    printf("%d threads: %.3f Mop/s", nt, (double)NOPS * nt / ((double)(t1 - t0) / 1e3));
    if (lat) {
      size_t n = (size_t)NOPS * nt;
      uint32_t *all = malloc(n * sizeof *all);
      for (int i = 0; i < nt; i++)
        memcpy(all + (size_t)i * NOPS, w[i].lat, NOPS * sizeof *all);
      qsort(all, n, sizeof *all, cmp_u32);
      printf("  alloc ns p50 %u p99 %u p99.9 %u p99.99 %u max %u", all[n / 2], all[n * 99 / 100],
             all[n * 999 / 1000], all[n * 9999 / 10000], all[n - 1]);
      free(all);
    }
    printf("\n");
    for (int i = 0; i < nt; i++)
      free(w[i].lat);
    pthread_barrier_destroy(&start);
  }
  int rc = 0;
  for (int i = 0; i < 8; i++) {
    if (pools[i] && ecs_pool_validate(pools[i]) != 0)
      rc = 1;
    ecs_pool_destroy(pools[i]);
  }
  return rc;
}
