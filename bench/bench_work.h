/*
 * The measuring core shared by `ecstore-bench net` and `ecstore-bench
 * compare`: one worker thread per client connection makes one kind of call
 * in a loop for a given time; a cell runs its connections at once, a
 * measurement is a warm-up cell then N timed ones.  Beside the ecstore
 * paths it holds the peers' small clients (Redis through hiredis, memcached
 * through a tiny text-protocol client of our own, files the way vLLM's disk
 * connector writes them) and the physical baselines (a raw TCP stream of
 * the same bytes, memcpy of the same bytes).  Benchmarks measure; they
 * never assert.
 *
 * Thread safety: ecs_bench_measure() runs its own threads and joins them;
 * call it from one thread at a time.
 */
#ifndef ECS_BENCH_WORK_H
#define ECS_BENCH_WORK_H

#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>

#include "support/ts.h"

#define ECS_BENCH_MAX_CONNS 16
#define ECS_BENCH_MAX_REPS 32

/* What one worker does in its loop.  A get first stores the batch once
 * (so every get hits), then reads it; a put writes the batch per call. */
typedef enum ecs_bench_mode {
  ECS_BM_ECS_GET,   /* ecstore get into caller buffers over job.transport */
  ECS_BM_ECS_PUT,   /* ecstore put over job.transport, fresh keys per call */
  ECS_BM_ECS_VIEW,  /* ecstore zero-copy views (shm): pin, check, release */
  ECS_BM_RAW_GET,   /* raw TCP: ask for batch*size bytes, read them */
  ECS_BM_RAW_PUT,   /* raw TCP: send batch*size bytes, read an 8-byte ack */
  ECS_BM_REDIS_GET, /* Redis GET, one pipeline per batch, copied out */
  ECS_BM_REDIS_SET, /* Redis SET, one pipeline per batch */
  ECS_BM_MC_GET,    /* memcached multi-get, one request per batch */
  ECS_BM_MC_SET,    /* memcached set, pipelined per batch */
  ECS_BM_FILE_GET,  /* one file per object: open, read, close */
  ECS_BM_FILE_PUT,  /* one file per object: write a temp file, [fsync], rename */
  ECS_BM_MEMCPY     /* memcpy of the same bytes between private buffers */
} ecs_bench_mode_t;

/* Where the peers are; filled by the caller (ports 0: not running). */
typedef struct ecs_bench_env {
  const char *servers; /* ecstore "HOST:PORT" */
  const char *rhost;   /* Redis host */
  int rport;           /* Redis port */
  int raw_port;        /* raw-stream server (ecs_bench_raw_start) */
  int mc_port;         /* memcached */
  int verify;          /* ecstore clients verify checksums */
} ecs_bench_env_t;

/* One measured thing. */
typedef struct ecs_bench_job {
  ecs_bench_mode_t mode;
  const char *transport; /* ecstore modes: "tcp", "shm" or "rdma" */
  size_t size;           /* object bytes */
  int batch;             /* objects per call */
  int conns;             /* connections (threads) at once, 1..ECS_BENCH_MAX_CONNS */
  const char *dir;       /* file modes: the directory */
  int fsync;             /* file put: fsync every file before its rename */
} ecs_bench_job_t;

/* What a measurement produced. */
typedef struct ecs_bench_result {
  double gbps;               /* payload GB/s (1e9 bytes/s), median over reps */
  double gbps_min, gbps_max; /* spread over reps */
  double mops;               /* objects/s in millions, median over reps */
  double p50_us, p99_us;     /* per-call latency over every timed call of every rep */
  size_t calls;              /* timed calls behind the latencies */
  uint64_t objects_all;      /* objects moved in the whole measurement, warm-up included (CPU costs) */
  int reps;                  /* timed repetitions */
} ecs_bench_result_t;

/* A warm-up cell (seconds / 4, at least one call), then reps timed cells of
 * `seconds` each (at least one call each).  0, or -1 when a call failed
 * (the reason is on stderr). */
int ecs_bench_measure(const ecs_bench_env_t *env, const ecs_bench_job_t *job, int reps, double seconds,
                      ecs_bench_result_t *out);

/* The raw-stream server: a thread per connection answering "send me N
 * bytes" with N bytes from memory and "take N bytes" with an ack. */
typedef struct ecs_bench_raw {
  int lfd;           /* listening socket */
  int port;          /* its port */
  uint8_t *buf;      /* the bytes served / the sink */
  size_t cap;        /* buf's size */
  volatile int stop; /* asks the accept loop to end */
  int started;       /* the accept thread runs */
  uint64_t thread_;  /* internal: the accept thread */
  int threads;       /* > 0: at most this many payload syscalls at once (ecs_bench_raw_start_threads) */
  sem_t slots_;      /* internal: those slots */
} ecs_bench_raw_t;

int ecs_bench_raw_start(ecs_bench_raw_t *rs);
/* As ecs_bench_raw_start, but the payload syscalls of all its connections
 * share `threads` slots: the baseline of a server with that many threads
 * (a connection waiting for its socket holds no slot, as an epoll thread
 * serves another meanwhile).  0: a thread per connection, unlimited. */
int ecs_bench_raw_start_threads(ecs_bench_raw_t *rs, int threads);
void ecs_bench_raw_stop(ecs_bench_raw_t *rs);

/* Starts memcached (PATH or /usr/bin) on a free port with room for mem_mb
 * MiB of items up to max_item bytes each.  0, or -1 when it is missing or
 * did not come up. */
int ecs_bench_memcached_start(ecs_ts_proc_t *p, size_t mem_mb, size_t max_item);

/* Sets ECS_BIN_DIR to this executable's directory unless it is set, so
 * ecs_ts_server_start() finds the ecstore-server built beside us. */
void ecs_bench_find_bins(void);

/* "64K", "1M", "16M": a size for tables. */
void ecs_bench_size_label(char *out, size_t cap, size_t size);

#endif
