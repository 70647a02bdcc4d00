/*
 * Test support: real processes on free ports in temp directories.
 *
 * Integration tests start their own redis-server and ecstore-server with
 * these helpers and stop them at the end, never touching a system service.
 * Every wait is bounded.  Binaries are found through ECS_BIN_DIR (set by
 * ctest) and redis-server through PATH or /usr/bin.
 */
#ifndef ECS_TS_H
#define ECS_TS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct ecs_ts_proc {
  pid_t pid;     /* 0 when not running */
  int port;      /* the port it listens on */
  char dir[256]; /* its temp directory (removed by stop) */
  char log[300]; /* its stdout+stderr log file inside dir */
} ecs_ts_proc_t;

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int ecs_ts_free_port(void);

/* Makes a fresh temp directory ("/tmp/ecs-test-XXXXXX") into out. */
int ecs_ts_mkdtemp(char *out, size_t cap);

/* Spawns argv (argv[0] a path) with stdout/stderr to p->log in p->dir
 * (which the caller set, or which is made when empty). */
int ecs_ts_spawn(ecs_ts_proc_t *p, char *const argv[]);

/* Waits until 127.0.0.1:port accepts a connection; 0 or -1 on timeout or
 * when the process died (its log is printed to stderr then). */
int ecs_ts_wait_port(ecs_ts_proc_t *p, int port, int timeout_ms);

/* Starts redis-server (no persistence) on a free port; waits for PING. */
int ecs_ts_redis_start(ecs_ts_proc_t *p);

/* Starts build/bin/ecstore-server with the given extra arguments (NULL-
 * terminated) on a free port, against redis_port; waits for it to listen. */
int ecs_ts_server_start(ecs_ts_proc_t *p, int redis_port, const char *const extra[]);

/* Sends sig to the process. */
int ecs_ts_signal(ecs_ts_proc_t *p, int sig);

/* SIGTERM, wait up to timeout_ms, then SIGKILL; reaps; removes the temp
 * directory.  Returns the exit status (or -1).  Accepts a stopped proc. */
int ecs_ts_stop(ecs_ts_proc_t *p, int timeout_ms);

/* SIGKILL and reap, leaving the directory (for restart tests). */
void ecs_ts_kill9(ecs_ts_proc_t *p);

/* How many lines of the file at path (a server's log) contain needle;
 * -1 when it cannot be read. */
int ecs_ts_file_lines_with(const char *path, const char *needle);

/* Path of a binary in ECS_BIN_DIR (static buffer). */
const char *ecs_ts_bin(const char *name);

/* Sends req to 127.0.0.1:port and reads the whole response (the server
 * closes after one) into out, NUL-terminated.  Returns its length, or -1. */
long ecs_ts_http(int port, const char *req, size_t req_len, char *out, size_t cap);

/* The value of the sample line of body that starts with "series " exactly
 * as given (labels included); -1 when absent. */
double ecs_ts_sample(const char *body, const char *series);

/* Scrapes GET /metrics from 127.0.0.1:port: that series' value, or -1. */
double ecs_ts_metric(int port, const char *series);

#endif
