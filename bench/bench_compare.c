/*
 * ecstore-bench compare: every ecstore data path side by side with what
 * users would pick instead and with the physical limits, in one run on one
 * machine (docs/benchmarks.md shows a run and discusses it):
 *
 *   ecstore   tcp, shm copy (into a caller buffer), shm view (zero-copy),
 *             rdma where a device exists;
 *   peers     Redis SET/GET pipelined per batch, memcached (multi-get,
 *             pipelined sets), one file per object on tmpfs and on disk;
 *   limits    a raw TCP stream of the same bytes, memcpy of the same bytes.
 *
 * Each cell: a warm-up, then N timed repetitions; the median GB/s with its
 * min-max spread, objects/s, p50/p99 per call, and ratios to the physical
 * baseline (raw TCP for network paths, memcpy for local ones) and to Redis.
 * Then scaling: get throughput against client connections; put/get latency
 * and the cost of eviction as the pool grows; latency as the number of
 * stored objects grows.  Everything goes to stdout, DIR/compare.txt, a
 * markdown table DIR/compare.md and CSV files in DIR; plots are drawn from
 * the CSV by bench/plot.gp (scripts/bench-compare.sh runs it all).
 *
 * It measures and reports; it never asserts a figure (tests/bench_check.cmake
 * only checks that the table and CSV were written).
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "bench.h"
#include "bench_compare.h"
#include "bench_work.h"
#include "ecstore/ecstore.h"
#include "support/ts.h"

/* ------------------------------------------------------------------ */
/* output: stdout and DIR/compare.txt alike                             */

static FILE *txt;

void ecs__cmp_outf(const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  vprintf(fmt, ap);
  if (txt)
    vfprintf(txt, fmt, ap2);
  va_end(ap2);
  va_end(ap);
  fflush(stdout);
}

/* Progress on stderr: one rewritten line on a terminal, else a line per
 * call (the caller calls it per group there). */
static uint64_t t_start;
int ecs__cmp_cells_done;
static int cells_total;

void ecs__cmp_progress(const char *what) {
  double el = (double)(ecs_bench_now_ns() - t_start) / 1e9;
  if (isatty(2))
    fprintf(stderr, "\r\033[K[%3d/%3d %4.0fs] %s", ecs__cmp_cells_done, cells_total, el, what);
  else
    fprintf(stderr, "[%3d/%3d %4.0fs] %s\n", ecs__cmp_cells_done, cells_total, el, what);
}

void ecs__cmp_progress_end(void) {
  if (isatty(2))
    fprintf(stderr, "\r\033[K");
}

/* ------------------------------------------------------------------ */
/* paths                                                                */

const path_t ecs__cmp_get_paths[] = {
    {"raw-tcp", ECS_BM_RAW_GET, NULL, NET, 0, 0},
    {"ecstore-tcp", ECS_BM_ECS_GET, "tcp", NET, 0, 0},
    {"ecstore-rdma", ECS_BM_ECS_GET, "rdma", NET, 0, 0},
    {"redis", ECS_BM_REDIS_GET, NULL, NET, 0, 0},
    {"memcached", ECS_BM_MC_GET, NULL, NET, 0, 0},
    {"memcpy", ECS_BM_MEMCPY, NULL, LOCAL, 0, 0},
    {"ecstore-shm-copy", ECS_BM_ECS_GET, "shm", LOCAL, 0, 0},
    {"ecstore-shm-view", ECS_BM_ECS_VIEW, "shm", LOCAL, 0, 0},
    {"file-tmpfs", ECS_BM_FILE_GET, NULL, LOCAL, 0, 0},
    {"file-disk", ECS_BM_FILE_GET, NULL, LOCAL, 1, 0},
};
static const path_t put_paths[] = {
    {"raw-tcp", ECS_BM_RAW_PUT, NULL, NET, 0, 0},
    {"ecstore-tcp", ECS_BM_ECS_PUT, "tcp", NET, 0, 0},
    {"ecstore-rdma", ECS_BM_ECS_PUT, "rdma", NET, 0, 0},
    {"redis", ECS_BM_REDIS_SET, NULL, NET, 0, 0},
    {"memcached", ECS_BM_MC_SET, NULL, NET, 0, 0},
    {"memcpy", ECS_BM_MEMCPY, NULL, LOCAL, 0, 0},
    {"ecstore-shm", ECS_BM_ECS_PUT, "shm", LOCAL, 0, 0},
    {"file-tmpfs", ECS_BM_FILE_PUT, NULL, LOCAL, 0, 0},
    {"file-disk", ECS_BM_FILE_PUT, NULL, LOCAL, 1, 0},
    {"file-disk-fsync", ECS_BM_FILE_PUT, NULL, LOCAL, 1, 1},
};
_Static_assert(sizeof ecs__cmp_get_paths / sizeof ecs__cmp_get_paths[0] == NPATHS, "get paths vs P_*");
_Static_assert(sizeof put_paths / sizeof put_paths[0] == NPATHS, "put paths vs P_*");

static int path_on(const run_t *r, const path_t *p) {
  if (p->mode == ECS_BM_MC_GET || p->mode == ECS_BM_MC_SET)
    return r->have_mc;
  if (p->transport && !strcmp(p->transport, "rdma"))
    return r->have_rdma;
  return 1;
}

int ecs__cmp_measure(const ccfg_t *cfg, const run_t *r, const path_t *p, size_t size, int batch, int conns,
                     ecs_bench_result_t *res) {
  ecs_bench_job_t job = {.mode = p->mode,
                         .transport = p->transport,
                         .size = size,
                         .batch = batch,
                         .conns = conns,
                         .dir = p->which ? r->disk_dir : r->tmpfs_dir,
                         .fsync = p->fsync};
  int rc = ecs_bench_measure(&r->env, &job, cfg->reps, cfg->seconds, res);
  ecs__cmp_cells_done++;
  return rc;
}

/* ------------------------------------------------------------------ */
/* the main table                                                       */

/* Results of one (op, size, batch) group, by path index. */
typedef struct group {
  ecs_bench_result_t res[NPATHS];
  int ok[NPATHS];
} group_t;

static double ratio(double a, double b) {
  return b > 0 ? a / b : 0;
}

static void fmt_ratio(char *out, size_t cap, double r, int pct) {
  if (r <= 0)
    snprintf(out, cap, "-");
  else if (pct)
    snprintf(out, cap, "%.0f%%", 100 * r);
  else
    snprintf(out, cap, "%.2fx", r);
}

static void print_group(const run_t *r, const char *op, const path_t *paths, const group_t *g, size_t size,
                        int batch) {
  char sz[16];
  ecs_bench_size_label(sz, sizeof sz, size);
  const ecs_bench_result_t *raw = g->ok[P_RAW] ? &g->res[P_RAW] : NULL,
                           *cpy = g->ok[P_MEMCPY] ? &g->res[P_MEMCPY] : NULL,
                           *red = g->ok[P_REDIS] ? &g->res[P_REDIS] : NULL;
  for (size_t i = 0; i < NPATHS; i++) {
    if (!g->ok[i])
      continue;
    const ecs_bench_result_t *x = &g->res[i];
    const ecs_bench_result_t *phys = paths[i].kind == NET ? raw : cpy;
    int is_phys = i == P_RAW || i == P_MEMCPY, view = paths[i].mode == ECS_BM_ECS_VIEW;
    char vp[16], vr[16];
    fmt_ratio(vp, sizeof vp, is_phys || !phys ? 0 : ratio(x->gbps, phys->gbps), 1);
    fmt_ratio(vr, sizeof vr, i == P_REDIS || !red ? 0 : ratio(x->gbps, red->gbps), 0);
    ecs__cmp_outf("%-4s %4s %3d  %-17s %7.2f [%6.2f-%6.2f] %9.0f %9.0f %9.0f %8s %8s%s\n", op, sz, batch,
                  paths[i].name, x->gbps, x->gbps_min, x->gbps_max, x->mops * 1e6, x->p50_us, x->p99_us, vp,
                  vr, view ? "  (no bytes move)" : "");
    if (r->csv)
      fprintf(r->csv, "%s,%zu,%d,1,%s,%.4f,%.4f,%.4f,%.1f,%.2f,%.2f,%zu,%d,%.4f,%.4f\n", op, size, batch,
              paths[i].name, x->gbps, x->gbps_min, x->gbps_max, x->mops * 1e6, x->p50_us, x->p99_us, x->calls,
              x->reps, is_phys || !phys ? 0 : ratio(x->gbps, phys->gbps),
              i == P_REDIS || !red ? 0 : ratio(x->gbps, red->gbps));
    if (r->md)
      fprintf(r->md, "| %s | %s | %d | %s | %.2f (%.2f–%.2f) | %.0f | %.0f | %.0f | %s | %s |\n", op, sz,
              batch, paths[i].name, x->gbps, x->gbps_min, x->gbps_max, x->mops * 1e6, x->p50_us, x->p99_us,
              vp, vr);
  }
  ecs__cmp_outf("\n");
}

/* Headline figures the targets are judged by, gathered as the table runs. */
typedef struct targets {
  double tcp_raw_min, tcp_raw_max;    /* ecstore-tcp / raw-tcp, get, size >= 1 MiB */
  double tcp_red_min, tcp_red_max;    /* ecstore-tcp / redis, same cells */
  double shm_mc_min, shm_mc_max;      /* ecstore-shm-copy / memcpy, get, every cell */
  double small_tcp, small_shm;        /* objects/s vs redis, get 64K x32 */
  int have_tcp, have_shm, have_small; /* the cells ran */
} targets_t;

static void minmax(double v, double *mn, double *mx, int *have) {
  if (!*have || v < *mn)
    *mn = v;
  if (!*have || v > *mx)
    *mx = v;
  *have = 1;
}

static int main_table(const ccfg_t *cfg, run_t *r, targets_t *t) {
  ecs__cmp_outf(
      "## ecstore next to its peers and the physical limits (1 connection)\n"
      "# GB/s = 1e9 payload bytes/s, median of %d reps x %.2fs after a warm-up [min-max over reps];\n"
      "# obj/s = objects/s; p50/p99 = per batch call, over every timed call; vs phys = path / raw-tcp\n"
      "# (network paths) or path / memcpy (local paths); vs redis = path / Redis, same op, size, batch.\n"
      "# checksums %s on ecstore gets.  Files: one per object; a put writes a temp file and renames it\n"
      "# (fsync only in file-disk-fsync); a get opens, reads, closes (from the page cache: the files were\n"
      "# just written).  file-tmpfs: %s; file-disk: %s (%s).\n",
      cfg->reps, cfg->seconds, cfg->verify ? "verified" : "NOT verified", r->tmpfs_dir, r->disk_dir,
      r->disk_fs);
  ecs__cmp_outf("# rdma: %s.  memcached: %s.\n", r->have_rdma ? "measured" : r->rdma_note,
                r->have_mc ? "measured (own text-protocol client: multi-get, pipelined sets)"
                           : "not installed, skipped");
  ecs__cmp_outf("%-4s %4s %3s  %-17s %7s %15s %9s %9s %9s %8s %8s\n", "op", "size", "b", "path", "GB/s",
                "[min-max]", "obj/s", "p50 us", "p99 us", "vs phys", "vs redis");
  if (r->md) {
    fprintf(r->md,
            "| op | size | batch | path | GB/s median (min–max) | objects/s | p50 µs | p99 µs | vs phys | "
            "vs Redis |\n|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (int op = 0; op < 2; op++) {
    const path_t *paths = op == 0 ? ecs__cmp_get_paths : put_paths;
    const char *opn = op == 0 ? "get" : "put";
    for (int i = 0; i < cfg->nsizes; i++) {
      for (int j = 0; j < cfg->nbatches; j++) {
        size_t size = cfg->sizes[i];
        int b = cfg->batches[j];
        group_t g;
        memset(&g, 0, sizeof g);
        char what[96], sz[16];
        ecs_bench_size_label(sz, sizeof sz, size);
        snprintf(what, sizeof what, "main table: %s %s x%d", opn, sz, b);
        ecs__cmp_progress(what);
        for (size_t k = 0; k < NPATHS; k++) {
          if (!path_on(r, &paths[k]))
            continue;
          if (ecs__cmp_measure(cfg, r, &paths[k], size, b, 1, &g.res[k])) {
            ecs__cmp_progress_end();
            fprintf(stderr, "ecstore-bench compare: %s %s %s x%d failed\n", paths[k].name, opn, sz, b);
            return -1;
          }
          g.ok[k] = 1;
        }
        ecs__cmp_progress_end();
        print_group(r, opn, paths, &g, size, b);
        if (op == 0) {
          if (size >= MIB && g.ok[P_RAW] && g.ok[P_TCP] && g.ok[P_REDIS]) {
            int h = t->have_tcp;
            minmax(ratio(g.res[P_TCP].gbps, g.res[P_RAW].gbps), &t->tcp_raw_min, &t->tcp_raw_max, &h);
            h = t->have_tcp;
            minmax(ratio(g.res[P_TCP].gbps, g.res[P_REDIS].gbps), &t->tcp_red_min, &t->tcp_red_max, &h);
            t->have_tcp = 1;
          }
          if (g.ok[P_MEMCPY] && g.ok[P_SHM])
            minmax(ratio(g.res[P_SHM].gbps, g.res[P_MEMCPY].gbps), &t->shm_mc_min, &t->shm_mc_max,
                   &t->have_shm);
          if (size == 64 * 1024 && b == 32 && g.ok[P_REDIS]) {
            t->small_tcp = ratio(g.res[P_TCP].mops, g.res[P_REDIS].mops);
            t->small_shm = ratio(g.res[P_SHM].mops, g.res[P_REDIS].mops);
            t->have_small = 1;
          }
        }
      }
    }
  }
  return 0;
}

static void print_targets(const targets_t *t) {
  ecs__cmp_outf("## targets (docs/benchmarks.md discusses them; figures from this run only)\n");
  if (t->have_tcp) {
    ecs__cmp_outf("tcp get >= 1 MiB vs raw TCP:  %3.0f%% .. %3.0f%%  (target >= 90%%: %s)\n",
                  100 * t->tcp_raw_min, 100 * t->tcp_raw_max,
                  t->tcp_raw_min >= 0.9   ? "met"
                  : t->tcp_raw_max >= 0.9 ? "met in part"
                                          : "missed");
    ecs__cmp_outf("tcp get >= 1 MiB vs Redis:    %.2fx .. %.2fx (target >= 1.5x: %s)\n", t->tcp_red_min,
                  t->tcp_red_max,
                  t->tcp_red_min >= 1.5   ? "met"
                  : t->tcp_red_max >= 1.5 ? "met in part"
                                          : "missed");
  }
  if (t->have_shm)
    ecs__cmp_outf("shm copy get vs memcpy:       %3.0f%% .. %3.0f%%  (target >= 90%%: %s)\n",
                  100 * t->shm_mc_min, 100 * t->shm_mc_max,
                  t->shm_mc_min >= 0.9   ? "met"
                  : t->shm_mc_max >= 0.9 ? "met in part"
                                         : "missed");
  if (t->have_small)
    ecs__cmp_outf(
        "64K x32 get objects/s vs Redis pipelined GET: tcp %.2fx, shm copy %.2fx (target >= 2x: %s)\n",
        t->small_tcp, t->small_shm, t->small_tcp >= 2 ? "met" : "missed over tcp");
  ecs__cmp_outf("\n");
}

/* What checksum verification costs on gets: the same cells, verify off. */
static int checksum_table(const ccfg_t *cfg, run_t *r) {
  ecs__cmp_outf("## checksum cost: ecstore gets with and without xxh3 verification (1 connection)\n");
  ecs__cmp_outf("%-17s %4s %3s %10s %10s %8s\n", "path", "size", "b", "GB/s on", "GB/s off", "on/off");
  size_t sizes[2] = {cfg->sizes[0], cfg->sizes[cfg->nsizes - 1]};
  for (int s = 0; s < 2; s++) {
    for (int k = 0; k < 2; k++) {
      const path_t *p = &ecs__cmp_get_paths[k == 0 ? P_TCP : P_SHM];
      ecs_bench_result_t on, off;
      ecs__cmp_progress("checksum cost");
      r->env.verify = 1;
      int rc = ecs__cmp_measure(cfg, r, p, sizes[s], 1, 1, &on);
      r->env.verify = 0;
      rc = rc || ecs__cmp_measure(cfg, r, p, sizes[s], 1, 1, &off);
      r->env.verify = cfg->verify;
      ecs__cmp_progress_end();
      if (rc)
        return -1;
      char sz[16];
      ecs_bench_size_label(sz, sizeof sz, sizes[s]);
      ecs__cmp_outf("%-17s %4s %3d %10.2f %10.2f %7.0f%%\n", p->name, sz, 1, on.gbps, off.gbps,
                    100 * ratio(on.gbps, off.gbps));
      FILE *f = r->csv;
      if (f)
        fprintf(f, "get,%zu,1,1,%s-noverify,%.4f,%.4f,%.4f,%.4f,%.1f,%.2f,%zu,%d,0,0\n", sizes[s], p->name,
                off.gbps, off.gbps_min, off.gbps_max, off.mops * 1e6, off.p50_us, off.p99_us, off.calls,
                off.reps);
    }
  }
  ecs__cmp_outf("\n");
  return 0;
}

/* ------------------------------------------------------------------ */
/* setup                                                                */

static const char *fs_name(long type) {
  switch ((unsigned long)type) {
  case 0x01021994: return "tmpfs";
  case 0xEF53: return "ext4";
  case 0x58465342: return "xfs";
  case 0x9123683E: return "btrfs";
  case 0x794c7630: return "overlayfs";
  case 0x6969: return "nfs";
  default: return "other";
  }
}

/* An RDMA device answers when /sys/class/infiniband lists one and a
 * client can connect over it. */
static void probe_rdma(run_t *r) {
  int devs = 0;
  DIR *d = opendir("/sys/class/infiniband");
  for (struct dirent *e; d && (e = readdir(d));)
    devs += e->d_name[0] != '.';
  if (d)
    closedir(d);
  if (!devs) {
    snprintf(r->rdma_note, sizeof r->rdma_note, "no device (/sys/class/infiniband lists none)");
    return;
  }
  ecs_client_t *c = ecs__cmp_client(r->env.servers, "rdma");
  if (!c) {
    snprintf(r->rdma_note, sizeof r->rdma_note, "a device is listed but the rdma transport did not connect");
    return;
  }
  ecs_client_close(c);
  r->have_rdma = 1;
}

static int mkdir_out(const char *d) {
  if (mkdir(d, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "ecstore-bench compare: cannot make %s: %s\n", d, strerror(errno));
    return -1;
  }
  return 0;
}

static FILE *open_out(const char *dir, const char *name) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  if (!f)
    fprintf(stderr, "ecstore-bench compare: cannot write %s: %s\n", p, strerror(errno));
  return f;
}

static void rm_dir(const char *d) {
  if (!d[0])
    return;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  if (system(cmd) != 0)
    fprintf(stderr, "ecstore-bench compare: could not remove %s\n", d);
}

/* ------------------------------------------------------------------ */
/* command line                                                         */

static void usage(FILE *f) {
  fprintf(f, "usage: ecstore-bench compare [options]\n"
             "  --out DIR        where compare.txt, compare.md and the CSV files go (default bench-compare)\n"
             "  --sizes LIST     object sizes (default 64K,1M,4M,16M)\n"
             "  --batches LIST   objects per call (default 1,8,32)\n"
             "  --reps N         timed repetitions per cell (default 3)\n"
             "  --seconds S      time per repetition (default 0.15)\n"
             "  --conns LIST     connection scaling (default 1,2,4,8)\n"
             "  --pools LIST     pool-size scaling (default 1G,2G,4G,8G,16G; a size that would leave\n"
             "                   less than 4 GiB of memory free is skipped and says so)\n"
             "  --objects LIST   object-count scaling (default 1000,10000,100000,1000000)\n"
             "  --disk-dir DIR   parent of the on-disk file directory (default /var/tmp)\n"
             "  --only LIST      sections: main,checksum,conns,pool,objects (default all)\n"
             "  --no-verify      ecstore clients skip checksum verification\n"
             "  --quick          a small, fast run (CI checks the harness with it; < 30 s)\n");
}

int ecs_bench_compare(int argc, char **argv) {
  ccfg_t cfg = {.sizes = {64 << 10, MIB, 4 * MIB, 16 * MIB},
                .nsizes = 4,
                .batches = {1, 8, 32},
                .nbatches = 3,
                .reps = 3,
                .seconds = 0.15,
                .conns = {1, 2, 4, 8},
                .nconns = 4,
                .pools = {GIB, 2 * GIB, 4 * GIB, 8 * GIB, 16 * GIB},
                .npools = 5,
                .objs = {1000, 10000, 100000, 1000000},
                .nobjs = 4,
                .out = "bench-compare",
                .disk_dir = "/var/tmp",
                .verify = 1,
                .do_main = 1,
                .do_sum = 1,
                .do_conns = 1,
                .do_pool = 1,
                .do_objs = 1};
  static const struct option opts[] = {
      {"out", required_argument, 0, 'o'},      {"sizes", required_argument, 0, 's'},
      {"batches", required_argument, 0, 'b'},  {"reps", required_argument, 0, 'r'},
      {"seconds", required_argument, 0, 't'},  {"conns", required_argument, 0, 'c'},
      {"pools", required_argument, 0, 'p'},    {"objects", required_argument, 0, 'n'},
      {"disk-dir", required_argument, 0, 'd'}, {"only", required_argument, 0, 'O'},
      {"no-verify", no_argument, 0, 'V'},      {"quick", no_argument, 0, 'q'},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  int o, quick = 0;
  optind = 1;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 'o': cfg.out = optarg; break;
    case 's':
      if (ecs_bench_parse_size_list(optarg, cfg.sizes, &cfg.nsizes, MAX_LIST))
        goto bad;
      break;
    case 'b':
      if (ecs_bench_parse_int_list(optarg, cfg.batches, &cfg.nbatches, MAX_LIST, 1024))
        goto bad;
      break;
    case 'r':
      cfg.reps = atoi(optarg);
      if (cfg.reps < 1 || cfg.reps > ECS_BENCH_MAX_REPS)
        goto bad;
      break;
    case 't':
      cfg.seconds = atof(optarg);
      if (cfg.seconds <= 0 || cfg.seconds > 60)
        goto bad;
      break;
    case 'c':
      if (ecs_bench_parse_int_list(optarg, cfg.conns, &cfg.nconns, MAX_LIST, ECS_BENCH_MAX_CONNS))
        goto bad;
      break;
    case 'p':
      if (ecs_bench_parse_size_list(optarg, cfg.pools, &cfg.npools, MAX_LIST))
        goto bad;
      break;
    case 'n':
      if (ecs_bench_parse_size_list(optarg, cfg.objs, &cfg.nobjs, MAX_LIST))
        goto bad;
      break;
    case 'd': cfg.disk_dir = optarg; break;
    case 'O':
      cfg.do_main = strstr(optarg, "main") != NULL;
      cfg.do_sum = strstr(optarg, "checksum") != NULL;
      cfg.do_conns = strstr(optarg, "conns") != NULL;
      cfg.do_pool = strstr(optarg, "pool") != NULL;
      cfg.do_objs = strstr(optarg, "objects") != NULL;
      break;
    case 'V': cfg.verify = 0; break;
    case 'q': quick = 1; break;
    case 'h': usage(stdout); return 0;
    default: goto bad;
    }
  }
  if (optind != argc)
    goto bad;
  if (quick) {
    cfg.sizes[0] = 64 << 10;
    cfg.sizes[1] = MIB;
    cfg.nsizes = 2;
    cfg.batches[0] = 1;
    cfg.batches[1] = 8;
    cfg.nbatches = 2;
    cfg.reps = 2;
    cfg.seconds = 0.05;
    cfg.conns[0] = 1;
    cfg.conns[1] = 2;
    cfg.nconns = 2;
    cfg.pools[0] = GIB;
    cfg.npools = 1;
    cfg.objs[0] = 1000;
    cfg.objs[1] = 10000;
    cfg.nobjs = 2;
  }

  signal(SIGPIPE, SIG_IGN);
  ecs_bench_find_bins();
  t_start = ecs_bench_now_ns();
  if (mkdir_out(cfg.out))
    return 1;
  txt = open_out(cfg.out, "compare.txt");
  run_t r;
  memset(&r, 0, sizeof r);
  r.csv = open_out(cfg.out, "compare.csv");
  r.md = open_out(cfg.out, "compare.md");
  FILE *ccsv = open_out(cfg.out, "scaling-conns.csv"), *pcsv = open_out(cfg.out, "scaling-pool.csv"),
       *ocsv = open_out(cfg.out, "scaling-objects.csv");
  if (!txt || !r.csv || !r.md || !ccsv || !pcsv || !ocsv)
    return 1;
  fprintf(r.csv,
          "op,size,batch,conns,path,gbps,gbps_min,gbps_max,objs_per_s,p50_us,p99_us,calls,reps,vs_phys,"
          "vs_redis\n");

  /* the peers */
  ecs_ts_proc_t redis, server, mc;
  memset(&redis, 0, sizeof redis);
  memset(&server, 0, sizeof server);
  memset(&mc, 0, sizeof mc);
  ecs_bench_raw_t raw;
  memset(&raw, 0, sizeof raw);
  raw.lfd = -1;
  int failed = 1;
  char servers[64];
  size_t maxset = 0, maxsize = 0;
  for (int i = 0; i < cfg.nsizes; i++) {
    maxsize = cfg.sizes[i] > maxsize ? cfg.sizes[i] : maxsize;
    for (int j = 0; j < cfg.nbatches; j++)
      maxset =
          cfg.sizes[i] * (size_t)cfg.batches[j] > maxset ? cfg.sizes[i] * (size_t)cfg.batches[j] : maxset;
  }
  size_t conn_set = 8 * MIB * (size_t)cfg.conns[cfg.nconns - 1];
  maxset = conn_set > maxset ? conn_set : maxset;
  size_t pool = maxset * 2 + 64 * MIB;
  pool = pool < GIB ? GIB : (pool + MIB - 1) / MIB * MIB;
  if (ecs_ts_redis_start(&redis)) {
    fprintf(stderr,
            "ecstore-bench compare: cannot start redis-server (scripts/install-deps.sh installs it)\n");
    goto out;
  }
  r.redis_port = redis.port;
  char psz[32];
  snprintf(psz, sizeof psz, "%zuM", pool / MIB);
  const char *extra[] = {
      "--pool-size", psz, "--log-level", "warn", ecs__cmp_need_no_mlock(pool) ? "--no-mlock" : NULL, NULL};
  if (ecs_ts_server_start(&server, redis.port, extra)) {
    fprintf(stderr, "ecstore-bench compare: cannot start ecstore-server\n");
    goto out;
  }
  snprintf(servers, sizeof servers, "127.0.0.1:%d", server.port);
  if (ecs_bench_raw_start(&raw)) {
    fprintf(stderr, "ecstore-bench compare: cannot listen for the raw baseline\n");
    goto out;
  }
  r.env = (ecs_bench_env_t){.servers = servers,
                            .rhost = "127.0.0.1",
                            .rport = redis.port,
                            .raw_port = raw.port,
                            .verify = cfg.verify};
  if (cfg.do_main && ecs_bench_memcached_start(&mc, maxset * 2 / MIB + 64, maxsize) == 0) {
    r.have_mc = 1;
    r.env.mc_port = mc.port;
  }
  probe_rdma(&r);
  snprintf(r.tmpfs_dir, sizeof r.tmpfs_dir, "/dev/shm/ecs-bench-XXXXXX");
  snprintf(r.disk_dir, sizeof r.disk_dir, "%s/ecs-bench-XXXXXX", cfg.disk_dir);
  if (!mkdtemp(r.tmpfs_dir) || !mkdtemp(r.disk_dir)) {
    fprintf(stderr, "ecstore-bench compare: cannot make the file directories: %s\n", strerror(errno));
    r.tmpfs_dir[0] = r.disk_dir[0] = '\0';
    goto out;
  }
  struct statfs sf;
  snprintf(r.disk_fs, sizeof r.disk_fs, "%s", statfs(r.disk_dir, &sf) == 0 ? fs_name(sf.f_type) : "?");

  /* the plan, for the progress line */
  int groups = 2 * cfg.nsizes * cfg.nbatches;
  cells_total = (cfg.do_main ? groups * (int)NPATHS : 0) + (cfg.do_sum ? 8 : 0) +
                (cfg.do_conns ? cfg.nconns * 5 : 0) + (cfg.do_pool ? cfg.npools : 0) +
                (cfg.do_objs ? cfg.nobjs : 0);

  char mach[256];
  ecs_bench_machine(mach, sizeof mach);
  ecs__cmp_outf("# ecstore-bench compare; machine: %s\n", mach);
  ecs__cmp_outf("# server: pool %zu MiB%s, loopback; Redis %s (no persistence); load at start: ", pool / MIB,
                ecs__cmp_need_no_mlock(pool) ? " unpinned (--no-mlock: over RLIMIT_MEMLOCK)" : "",
                "started by the bench");
  {
    double la[3] = {0, 0, 0};
    if (getloadavg(la, 3) == 3)
      ecs__cmp_outf("%.2f %.2f %.2f\n\n", la[0], la[1], la[2]);
    else
      ecs__cmp_outf("?\n\n");
  }
  targets_t tg;
  memset(&tg, 0, sizeof tg);
  failed = 0;
  if (cfg.do_main && main_table(&cfg, &r, &tg))
    failed = 1;
  if (cfg.do_main && !failed)
    print_targets(&tg);
  if (mc.pid) /* its memory back before the pools grow */
    ecs_ts_stop(&mc, 5000);
  if (!failed && cfg.do_sum && checksum_table(&cfg, &r))
    failed = 1;
  if (!failed && cfg.do_conns && ecs__cmp_conns_table(&cfg, &r, ccsv))
    failed = 1;
  if (!failed) { /* the main server's pool back too */
    ecs_ts_stop(&server, 10000);
  }
  if (!failed && cfg.do_pool && ecs__cmp_pool_table(&cfg, &r, pcsv))
    failed = 1;
  if (!failed && cfg.do_objs && ecs__cmp_objs_table(&cfg, &r, ocsv))
    failed = 1;
  {
    double la[3] = {0, 0, 0};
    if (getloadavg(la, 3) == 3)
      ecs__cmp_outf("# load at end: %.2f %.2f %.2f; run took %.0f s\n", la[0], la[1], la[2],
                    (double)(ecs_bench_now_ns() - t_start) / 1e9);
  }

out:
  ecs_bench_raw_stop(&raw);
  if (mc.pid)
    ecs_ts_stop(&mc, 5000);
  if (server.pid)
    ecs_ts_stop(&server, 10000);
  if (redis.pid)
    ecs_ts_stop(&redis, 5000);
  rm_dir(r.tmpfs_dir);
  rm_dir(r.disk_dir);
  FILE *fs[] = {txt, r.csv, r.md, ccsv, pcsv, ocsv};
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
    if (fs[i])
      fclose(fs[i]);
  txt = NULL;
  if (failed) {
    fprintf(stderr, "ecstore-bench compare: a measurement failed\n");
    return 1;
  }
  fprintf(stderr, "ecstore-bench compare: wrote %s/compare.{txt,md,csv} and %s/scaling-*.csv\n", cfg.out,
          cfg.out);
  return 0;
bad:
  if (optarg)
    fprintf(stderr, "ecstore-bench compare: bad value '%s'\n", optarg);
  usage(stderr);
  return 2;
}
