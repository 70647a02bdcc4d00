/*
 * ecstore-bench shmcopy: the distribution of shared-memory copy gets
 * against memcpy, run after run, against a server the user started.
 *
 * Each run is what a new client process sees: a fresh client (a fresh
 * mapping of the pool), fresh destination buffers, then for each size
 * timed slices that alternate
 *   get   ecs_get_batch over shm into the destination buffers (LEASE, copy
 *         and verify, RELEASE), as an application calls it;
 *   view  ecs_get_view_batch, memcpy out of the views into the same
 *         buffers, release: the copy without the checksum and with the
 *         library out of the way (tells a slow copy from a slow protocol);
 *   memcpy  private source buffers into the same destination buffers.
 * All three write the same destination buffers and are measured the same
 * way (wall time of whole calls over the slices), so a first-touch or page
 * size difference of the destination cannot favour one of them.  Minor
 * page faults per call (getrusage) are reported next to each, with the
 * load average, since the machine may be shared.  The summary is the
 * distribution of get/memcpy over the runs, not the best run.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ecstore/ecstore.h"

#define MAX_SIZES 8
#define MAX_RUNS 64
#define MAX_BATCH 64
#define SLICES 3 /* alternations of get / view / memcpy per run and size */

typedef struct phase {
  double seconds; /* time spent in whole calls */
  double bytes;   /* payload moved */
  long faults;    /* minor faults taken */
  long calls;     /* calls made */
  double copy_s;  /* view only: time in the memcpy out of the views */
} phase_t;

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static double load1(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1)
      l = -1;
    fclose(f);
  }
  return l;
}

enum { P_GET, P_VIEW, P_MEMCPY, NPHASES };

typedef struct job {
  ecs_client_t *c;
  ecs_key_t keys[MAX_BATCH];
  char names[MAX_BATCH][64];
  uint8_t *dst[MAX_BATCH];
  uint8_t *src[MAX_BATCH];
  ecs_get_buf_t gb[MAX_BATCH];
  ecs_view_t views[MAX_BATCH];
  size_t size;
  int batch;
} job_t;

/* One call of the given kind over the batch; 0 or an ECS_E* code. */
static int call(job_t *j, int kind, double *copy_s) {
  int b = j->batch, rc = 0;
  if (kind == P_GET) {
    for (int i = 0; i < b; i++)
      j->gb[i] = (ecs_get_buf_t){.data = j->dst[i], .capacity = j->size};
    rc = ecs_get_batch(j->c, j->keys, j->gb, (size_t)b);
    for (int i = 0; !rc && i < b; i++)
      rc = j->gb[i].status;
  } else if (kind == P_VIEW) {
    rc = ecs_get_view_batch(j->c, j->keys, j->views, (size_t)b);
    for (int i = 0; !rc && i < b; i++)
      rc = j->views[i].status;
    uint64_t t0 = ecs_bench_now_ns();
    for (int i = 0; !rc && i < b; i++)
      memcpy(j->dst[i], j->views[i].data, j->size);
    *copy_s += (double)(ecs_bench_now_ns() - t0) / 1e9;
    ecs_view_release(j->c, j->views, (size_t)b);
  } else {
    for (int i = 0; i < b; i++)
      memcpy(j->dst[i], j->src[i], j->size);
  }
  __asm__ __volatile__("" ::: "memory"); /* keep the copies */
  return rc;
}

static int slice(job_t *j, int kind, double seconds, phase_t *ph) {
  long f0 = minflt();
  uint64_t t0 = ecs_bench_now_ns(), end = t0 + (uint64_t)(seconds * 1e9), now;
  long n = 0;
  do {
    int rc = call(j, kind, &ph->copy_s);
    if (rc) {
      fprintf(stderr, "shmcopy: %s failed: %s\n", kind == P_GET ? "get" : "view", ecs_strerror(rc));
      return rc;
    }
    n++;
    now = ecs_bench_now_ns();
  } while (now < end);
  ph->seconds += (double)(now - t0) / 1e9;
  ph->bytes += (double)n * (double)j->batch * (double)j->size;
  ph->faults += minflt() - f0;
  ph->calls += n;
  return 0;
}

static double gbps(const phase_t *p) {
  return p->seconds > 0 ? p->bytes / p->seconds / 1e9 : 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ecstore-bench shmcopy --server H:P [--sizes 1M,4M,16M] [--batch 8] [--runs 10]\n"
             "                              [--seconds 0.6] [--no-verify]\n"
             "  --server   a running ecstore-server (namespace 'test'), started as a user starts it\n"
             "  --sizes    object sizes (default 1M,4M,16M)\n"
             "  --batch    objects per call (default 8)\n"
             "  --runs     runs, each with a fresh client and fresh buffers (default 10)\n"
             "  --seconds  time per size and run, split over get, view and memcpy (default 0.6)\n"
             "  --no-verify  the client skips checksum verification\n");
}

/* Puts the batch's objects (same bytes each run: a put of an existing key
 * with the same content is accepted). */
static int setup(job_t *j, ecs_client_t *c, size_t size, int batch) {
  memset(j, 0, sizeof *j);
  j->c = c;
  j->size = size;
  j->batch = batch;
  ecs_tensor_t ts[MAX_BATCH];
  int st[MAX_BATCH];
  for (int i = 0; i < batch; i++) {
    snprintf(j->names[i], sizeof j->names[i], "shmcopy-%zu-%d", size, i);
    j->keys[i] = (ecs_key_t){.data = j->names[i], .len = strlen(j->names[i])};
    j->dst[i] = malloc(size);
    j->src[i] = malloc(size);
    if (!j->dst[i] || !j->src[i])
      return ECS_ENOMEM;
    /* Both faulted in before timing, as a caller's buffers would be. */
    memset(j->dst[i], 0, size);
    memset(j->src[i], 0x3c + i, size);
    ts[i] = (ecs_tensor_t){.data = j->src[i], .nbytes = size};
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = size;
  }
  int rc = ecs_put_batch(c, j->keys, ts, (size_t)batch, st);
  for (int i = 0; !rc && i < batch; i++)
    rc = st[i];
  return rc;
}

static void teardown(job_t *j) {
  for (int i = 0; i < j->batch; i++) {
    free(j->dst[i]);
    free(j->src[i]);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int ecs_bench_shmcopy(int argc, char **argv) {
  const char *server = NULL;
  size_t sizes[MAX_SIZES] = {1u << 20, 4u << 20, 16u << 20};
  int nsizes = 3, batch = 8, runs = 10, verify = 1;
  double seconds = 0.6;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--server") && i + 1 < argc) {
      server = argv[++i];
    } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      if (ecs_bench_parse_size_list(argv[++i], sizes, &nsizes, MAX_SIZES) != 0) {
        fprintf(stderr, "shmcopy: bad --sizes\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = atoi(argv[++i]);
      if (batch < 1 || batch > MAX_BATCH) {
        fprintf(stderr, "shmcopy: --batch must be 1..%d\n", MAX_BATCH);
        return 2;
      }
    } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = atoi(argv[++i]);
      if (runs < 1 || runs > MAX_RUNS) {
        fprintf(stderr, "shmcopy: --runs must be 1..%d\n", MAX_RUNS);
        return 2;
      }
    } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = atof(argv[++i]);
      if (!(seconds >= 0.03 && seconds <= 60)) {
        fprintf(stderr, "shmcopy: --seconds must be 0.03..60\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--no-verify")) {
      verify = 0;
    } else {
      fprintf(stderr, "shmcopy: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!server) {
    fprintf(stderr, "shmcopy: --server H:P is required (start ecstore-server as a user would)\n");
    return 2;
  }
  printf("# ecstore-bench shmcopy: server %s, batch %d, %d runs, %.2f s per size and run, checksums %s\n",
         server, batch, runs, seconds, verify ? "verified" : "off");
  ecs_bench_print_machine();
  printf("%4s %6s %5s | %8s %8s %8s | %7s %7s %9s %8s | %9s %9s %9s\n", "run", "size", "load1", "get GB/s",
         "view+cp", "memcpy", "get/mc", "view/mc", "shm-cp/mc", "proto us", "get flt/c", "view flt",
         "mc flt/c");
  static double ratio[MAX_SIZES][MAX_RUNS];
  int rc = 0;
  for (int r = 0; r < runs && !rc; r++) {
    ecs_client_config_t cfg;
    ecs_client_config_init(&cfg);
    cfg.servers = server;
    cfg.transport = "shm";
    cfg.verify_checksum = verify;
    cfg.ns = "test";
    cfg.timeout_ms = 60000;
    ecs_client_t *c = NULL;
    char err[256];
    if (ecs_client_connect(&cfg, &c, err, sizeof err) != ECS_OK) {
      fprintf(stderr, "shmcopy: connect to %s over shm: %s\n", server, err);
      return 1;
    }
    for (int s = 0; s < nsizes && !rc; s++) {
      static job_t j;
      if ((rc = setup(&j, c, sizes[s], batch)) != 0) {
        fprintf(stderr, "shmcopy: put of %d x %zu bytes failed: %s\n", batch, sizes[s], ecs_strerror(rc));
      } else {
        phase_t ph[NPHASES] = {{0}};
        double unused = 0;
        for (int k = 0; k < NPHASES && !rc; k++) /* warm-up: one call each, not counted */
          rc = call(&j, k, &unused);
        for (int sl = 0; sl < SLICES && !rc; sl++)
          for (int k = 0; k < NPHASES && !rc; k++)
            rc = slice(&j, k, seconds / SLICES / NPHASES, &ph[k]);
        if (!rc) {
          double g = gbps(&ph[P_GET]), v = gbps(&ph[P_VIEW]), m = gbps(&ph[P_MEMCPY]);
          ratio[s][r] = m > 0 ? g / m : 0;
          const phase_t *pv = &ph[P_VIEW];
          double shm_cp = pv->copy_s > 0 ? pv->bytes / pv->copy_s / 1e9 : 0;
          printf("%4d %5zuM %5.2f | %8.2f %8.2f %8.2f | %6.0f%% %6.0f%% %8.0f%% %8.0f | %9.1f %9.1f %9.1f\n",
                 r + 1, sizes[s] >> 20, load1(), g, v, m, 100 * ratio[s][r], m > 0 ? 100 * v / m : 0,
                 m > 0 ? 100 * shm_cp / m : 0, 1e6 * (pv->seconds - pv->copy_s) / (double)pv->calls,
                 (double)ph[P_GET].faults / (double)ph[P_GET].calls,
                 (double)ph[P_VIEW].faults / (double)ph[P_VIEW].calls,
                 (double)ph[P_MEMCPY].faults / (double)ph[P_MEMCPY].calls);
          fflush(stdout);
        }
      }
      teardown(&j);
    }
    ecs_client_close(c);
  }
  if (rc)
    return 1;
  printf("\n# get/memcpy over %d runs: sorted, and how many runs reached 80%%\n", runs);
  for (int s = 0; s < nsizes; s++) {
    double v[MAX_RUNS];
    int ok = 0;
    memcpy(v, ratio[s], (size_t)runs * sizeof *v);
    qsort(v, (size_t)runs, sizeof *v, cmp_double);
    for (int r = 0; r < runs; r++)
      ok += v[r] >= 0.8;
    printf("%5zuM  min %3.0f%%  median %3.0f%%  max %3.0f%%  >= 80%%: %d of %d  [", sizes[s] >> 20,
           100 * v[0], 100 * ecs_bench_median(v, (size_t)runs), 100 * v[runs - 1], ok, runs);
    for (int r = 0; r < runs; r++)
      printf("%s%.0f", r ? " " : "", 100 * v[r]);
    printf("]\n");
  }
  return 0;
}
