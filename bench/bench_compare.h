/*
 * Internal to `ecstore-bench compare`: its configuration, the run's state,
 * and what bench_compare.c (main table, setup, command line) and
 * bench_scale.c (scaling sections) share.  Single-threaded: the sections
 * run one after another on the main thread.
 */
#ifndef ECS_BENCH_COMPARE_H
#define ECS_BENCH_COMPARE_H

#include <stdio.h>

#include "bench_work.h"

#define MAX_LIST 8
#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)
#define MEM_HEADROOM (4 * GIB) /* what a pool must leave free on the machine */

typedef struct ccfg {
  size_t sizes[MAX_LIST]; /* object sizes of the main table */
  int nsizes;
  int batches[MAX_LIST]; /* batch sizes of the main table */
  int nbatches;
  int reps;            /* timed repetitions per cell */
  double seconds;      /* time per repetition */
  int conns[MAX_LIST]; /* scaling: client connections */
  int nconns;
  size_t pools[MAX_LIST]; /* scaling: pool sizes */
  int npools;
  size_t objs[MAX_LIST]; /* scaling: stored objects */
  int nobjs;
  const char *out;                                 /* output directory */
  const char *disk_dir;                            /* parent of the on-disk file directory */
  int verify;                                      /* ecstore clients verify checksums */
  int do_main, do_conns, do_pool, do_objs, do_sum; /* sections */
} ccfg_t;

enum { NET, LOCAL }; /* which physical baseline a path is held to */

typedef struct path {
  const char *name;      /* in tables and CSV */
  ecs_bench_mode_t mode; /* what its workers do */
  const char *transport; /* ecstore paths */
  int kind;              /* NET: raw TCP; LOCAL: memcpy */
  int which;             /* file paths: 0 tmpfs, 1 disk */
  int fsync;             /* file put: fsync each file */
} path_t;

/* What the run has: which peers came up, where the files go. */
typedef struct run {
  ecs_bench_env_t env; /* where the peers are */
  int have_rdma;       /* an RDMA device answered */
  int have_mc;         /* memcached is running */
  char tmpfs_dir[256]; /* file-tmpfs directory */
  char disk_dir[256];  /* file-disk directory */
  char disk_fs[64];    /* its filesystem, in words */
  char rdma_note[160]; /* why there is no rdma path */
  int redis_port;      /* for servers started per section */
  FILE *csv;           /* DIR/compare.csv */
  FILE *md;            /* DIR/compare.md */
} run_t;

/* The get paths, in table order: raw-tcp, ecstore-tcp, ecstore-rdma, redis,
 * memcached, memcpy, ecstore-shm-copy, ecstore-shm-view, file-tmpfs,
 * file-disk (the put table has the same shape). */
extern const path_t ecs__cmp_get_paths[];
enum { P_RAW, P_TCP, P_RDMA, P_REDIS, P_MC, P_MEMCPY, P_SHM, P_VIEW, P_FTMP, P_FDISK, NPATHS };

/* Cells measured so far (for the progress line). */
extern int ecs__cmp_cells_done;

/* printf to stdout and to DIR/compare.txt. */
void ecs__cmp_outf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The progress line on stderr, and its clearing. */
void ecs__cmp_progress(const char *what);
void ecs__cmp_progress_end(void);

/* One cell of path p (reps and seconds from cfg); counts it as done. */
int ecs__cmp_measure(const ccfg_t *cfg, const run_t *r, const path_t *p, size_t size, int batch, int conns,
                     ecs_bench_result_t *res);

/* A client of servers over transport (namespace "test"), or NULL (the
 * reason on stderr). */
struct ecs_client *ecs__cmp_client(const char *servers, const char *transport);

/* 1 when a pool of this size is over RLIMIT_MEMLOCK (--no-mlock then). */
int ecs__cmp_need_no_mlock(size_t pool);

/* The scaling sections (bench_scale.c); 0 or -1. */
int ecs__cmp_conns_table(const ccfg_t *cfg, run_t *r, FILE *csv);
int ecs__cmp_pool_table(const ccfg_t *cfg, run_t *r, FILE *csv);
int ecs__cmp_objs_table(const ccfg_t *cfg, run_t *r, FILE *csv);

#endif
