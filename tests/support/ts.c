/*
 * Test support: real processes on free ports in temp directories.
 *
 * Every child runs in its own process group with PR_SET_PDEATHSIG(SIGKILL),
 * so a crashed or killed test never leaves a redis-server or ecstore-server
 * behind.  Every wait has a deadline; when a child dies while we wait for it
 * to listen, its log is copied to stderr so the failure explains itself.
 *
 * Restarts: ecs_ts_redis_start() and ecs_ts_server_start() use p->port when
 * it is already set (> 0), and p->dir when it is already set, so that after
 * ecs_ts_kill9() the same struct starts a new process on the same port in the
 * same directory.  Zero-initialise a fresh struct.  ecs_ts_stop() clears the
 * whole struct.
 *
 * A failed cmocka assertion can skip a test's cleanup, so every spawned
 * process and its directory are also tracked here and, if still there at
 * exit, killed and removed (set ECS_TS_KEEP=1 to keep the directories and
 * their logs for a post-mortem).
 */
#include "support/ts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "ecstore/error.h"
#include "store/core/net.h"
#include "store/core/parse.h"

#define TS_REDIS_START_MS 10000  /* redis-server listens in ~10 ms; ASan runs are slower */
#define TS_SERVER_START_MS 15000 /* ecstore-server maps and locks its pool first */
#define TS_START_TRIES 3         /* a "free" port can be taken before the child binds it */

#define TS_TRACK_MAX 64 /* processes one test binary may have at once */

/* What exit-time cleanup must undo. */
typedef struct ts_track {
  pid_t pid;     /* running child, or 0 */
  char dir[256]; /* its directory, "" for a free slot */
} ts_track_t;

static ts_track_t ts_tracked[TS_TRACK_MAX];
static int ts_atexit_set;

static void ts_rmdir(const char *dir);

static void ts_cleanup_at_exit(void) {
  const char *keep = getenv("ECS_TS_KEEP");
  for (int i = 0; i < TS_TRACK_MAX; i++) {
    ts_track_t *t = &ts_tracked[i];
    if (t->pid > 0) {
      kill(-t->pid, SIGKILL);
      kill(t->pid, SIGKILL);
      while (waitpid(t->pid, NULL, 0) < 0 && errno == EINTR) {
      }
    }
    if (t->dir[0] != '\0') {
      if (keep != NULL && keep[0] == '1')
        fprintf(stderr, "ts: kept %s\n", t->dir);
      else
        ts_rmdir(t->dir);
    }
    memset(t, 0, sizeof *t);
  }
}

/* Records dir's process (pid 0: none running now). */
static void ts_track(const char *dir, pid_t pid) {
  ts_track_t *slot = NULL;
  for (int i = 0; i < TS_TRACK_MAX && slot == NULL; i++)
    if (strcmp(ts_tracked[i].dir, dir) == 0)
      slot = &ts_tracked[i];
  for (int i = 0; i < TS_TRACK_MAX && slot == NULL; i++)
    if (ts_tracked[i].dir[0] == '\0')
      slot = &ts_tracked[i];
  if (slot == NULL)
    return; /* full: this one is cleaned only by ecs_ts_stop() */
  if (!ts_atexit_set && atexit(ts_cleanup_at_exit) == 0)
    ts_atexit_set = 1;
  snprintf(slot->dir, sizeof slot->dir, "%s", dir);
  slot->pid = pid;
}

static void ts_untrack(const char *dir, int remove) {
  for (int i = 0; i < TS_TRACK_MAX; i++)
    if (dir[0] != '\0' && strcmp(ts_tracked[i].dir, dir) == 0) {
      if (remove)
        memset(&ts_tracked[i], 0, sizeof ts_tracked[i]);
      else
        ts_tracked[i].pid = 0;
    }
}

static uint64_t ts_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void ts_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int ecs_ts_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  socklen_t len = sizeof sa;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  close(fd);
  return port;
}

int ecs_ts_mkdtemp(char *out, size_t cap) {
  static const char tmpl[] = "/tmp/ecs-test-XXXXXX";
  if (out == NULL || cap < sizeof tmpl)
    return -1;
  memcpy(out, tmpl, sizeof tmpl);
  if (mkdtemp(out) == NULL) {
    fprintf(stderr, "ts: mkdtemp: %s\n", strerror(errno));
    out[0] = '\0';
    return -1;
  }
  return 0;
}

/* Copies the tail of p's log to stderr (the reason a child died). */
static void ts_print_log(const ecs_ts_proc_t *p) {
  FILE *f = fopen(p->log, "r");
  if (f == NULL) {
    fprintf(stderr, "ts: no log at %s\n", p->log);
    return;
  }
  if (fseek(f, 0, SEEK_END) == 0) {
    long sz = ftell(f);
    if (sz > 16384)
      fseek(f, sz - 16384, SEEK_SET);
    else
      fseek(f, 0, SEEK_SET);
  }
  fprintf(stderr, "---- %s ----\n", p->log);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    fwrite(buf, 1, n, stderr);
  fprintf(stderr, "---- end of log ----\n");
  fclose(f);
}

/* The child half of spawn: never returns. */
static void ts_child(const char *log, pid_t parent, char *const argv[]) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) /* the parent died before prctl took effect */
    _exit(127);
  int null = open("/dev/null", O_RDONLY);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (null < 0 || fd < 0)
    _exit(127);
  dup2(null, 0);
  dup2(fd, 1);
  dup2(fd, 2);
  /* Leave the child none of the test's sockets and files. */
  for (int i = 3; i < 1024; i++)
    close(i);
  /* The test may block signals or ignore SIGPIPE; the child starts clean. */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  execv(argv[0], argv);
  dprintf(2, "ts: execv %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

int ecs_ts_spawn(ecs_ts_proc_t *p, char *const argv[]) {
  if (p == NULL || argv == NULL || argv[0] == NULL)
    return -1;
  if (p->dir[0] == '\0' && ecs_ts_mkdtemp(p->dir, sizeof p->dir) != 0)
    return -1;
  int n = snprintf(p->log, sizeof p->log, "%s/log", p->dir);
  if (n < 0 || (size_t)n >= sizeof p->log)
    return -1;
  /* Mark each start in the log, so restarts are told apart. */
  FILE *f = fopen(p->log, "a");
  if (f != NULL) {
    fprintf(f, "==== ts: start:");
    for (size_t i = 0; argv[i] != NULL; i++)
      fprintf(f, " %s", argv[i]);
    fprintf(f, "\n");
    fclose(f);
  }
  fflush(NULL); /* so buffered test output is not written twice */
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "ts: fork: %s\n", strerror(errno));
    return -1;
  }
  if (pid == 0)
    ts_child(p->log, parent, argv);
  setpgid(pid, pid); /* also here, so kill(-pid) works before the child runs */
  p->pid = pid;
  ts_track(p->dir, pid);
  return 0;
}

/* Reaps p if it has exited; returns 1 when it is gone. */
static int ts_reaped(ecs_ts_proc_t *p, int *status) {
  if (p->pid <= 0)
    return 1;
  pid_t r = waitpid(p->pid, status, WNOHANG);
  if (r == p->pid || (r < 0 && errno == ECHILD)) {
    p->pid = 0;
    ts_untrack(p->dir, 0);
    return 1;
  }
  return 0;
}

static int ts_try_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons((uint16_t)port);
  /* Loopback connects complete or are refused at once; no timeout needed. */
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  close(fd);
  return rc;
}

int ecs_ts_wait_port(ecs_ts_proc_t *p, int port, int timeout_ms) {
  uint64_t deadline = ts_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
  int status = 0;
  for (;;) {
    if (p != NULL && p->pid > 0 && ts_reaped(p, &status)) {
      fprintf(stderr, "ts: process died before listening on %d (status 0x%x)\n", port, status);
      ts_print_log(p);
      return -1;
    }
    if (ts_try_connect(port) == 0)
      return 0;
    if (ts_now_ms() >= deadline)
      break;
    ts_sleep_ms(10);
  }
  fprintf(stderr, "ts: nothing listens on %d after %d ms\n", port, timeout_ms);
  if (p != NULL)
    ts_print_log(p);
  return -1;
}

static const char *ts_redis_path(void) {
  static char buf[512];
  const char *path = getenv("PATH");
  while (path != NULL && *path != '\0') {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    if (len > 0 && len < sizeof buf - 16) {
      snprintf(buf, sizeof buf, "%.*s/redis-server", (int)len, path);
      if (access(buf, X_OK) == 0)
        return buf;
    }
    path = end ? end + 1 : NULL;
  }
  return "/usr/bin/redis-server";
}

/* Waits until Redis answers PING with PONG (it may listen before it serves). */
static int ts_redis_ping(int port, int timeout_ms) {
  uint64_t deadline = ts_now_ms() + (uint64_t)timeout_ms;
  for (;;) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c != NULL && c->err == 0) {
      redisSetTimeout(c, tv);
      redisReply *r = redisCommand(c, "PING");
      int ok = r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
      if (r != NULL)
        freeReplyObject(r);
      redisFree(c);
      if (ok)
        return 0;
    } else if (c != NULL) {
      redisFree(c);
    }
    if (ts_now_ms() >= deadline)
      return -1;
    ts_sleep_ms(10);
  }
}

int ecs_ts_redis_start(ecs_ts_proc_t *p) {
  if (p == NULL || p->pid > 0)
    return -1;
  int fixed = p->port > 0;
  for (int attempt = 0; attempt < TS_START_TRIES; attempt++) {
    if (!fixed)
      p->port = ecs_ts_free_port();
    if (p->port <= 0)
      return -1;
    if (p->dir[0] == '\0' && ecs_ts_mkdtemp(p->dir, sizeof p->dir) != 0)
      return -1;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    char *argv[] = {(char *)ts_redis_path(), "--port", port,    "--bind", "127.0.0.1",   "--save", "",
                    "--appendonly",          "no",     "--dir", p->dir,   "--daemonize", "no",     NULL};
    if (ecs_ts_spawn(p, argv) != 0)
      return -1;
    if (ecs_ts_wait_port(p, p->port, TS_REDIS_START_MS) == 0) {
      if (ts_redis_ping(p->port, TS_REDIS_START_MS) == 0)
        return 0;
      fprintf(stderr, "ts: redis-server on %d never answered PING\n", p->port);
      ts_print_log(p);
      ecs_ts_kill9(p);
      return -1;
    }
    ecs_ts_kill9(p); /* a timeout leaves it running; a death leaves pid 0 */
    if (fixed)
      return -1;
  }
  return -1;
}

/* How long a server may take to listen: populating (and locking) a large
 * pool on this VM takes about 2 s per GiB, so a fixed wait refuses the
 * benchmarks' big pools.  The last --pool-size in extra counts. */
static int server_start_ms(const char *const extra[]) {
  uint64_t bytes = 0;
  for (size_t i = 0; extra != NULL && extra[i] != NULL && extra[i + 1] != NULL; i++)
    if (strcmp(extra[i], "--pool-size") == 0 && ecs_parse_size(extra[i + 1], &bytes) != ECS_OK)
      bytes = 0; /* the server will refuse it at once */
  uint64_t gib = bytes >> 30;
  return TS_SERVER_START_MS + (int)(gib > 1024 ? 1024 : gib) * 4000;
}

int ecs_ts_server_start(ecs_ts_proc_t *p, int redis_port, const char *const extra[]) {
  if (p == NULL || p->pid > 0)
    return -1;
  const char *bin = ecs_ts_bin("ecstore-server");
  if (access(bin, X_OK) != 0) {
    fprintf(stderr, "ts: %s: %s (is ECS_BIN_DIR set?)\n", bin, strerror(errno));
    return -1;
  }
  char binbuf[512];
  snprintf(binbuf, sizeof binbuf, "%s", bin);
  size_t nextra = 0;
  while (extra != NULL && extra[nextra] != NULL)
    nextra++;
  char **argv = calloc(nextra + 20, sizeof *argv);
  if (argv == NULL)
    return -1;
  /* The shm socket goes in the server's own directory, which stop removes:
   * the default, /tmp/ecstore-PORT.sock, outlives a server killed with -9. */
  char shm[300];
  if ((p->dir[0] == '\0' && ecs_ts_mkdtemp(p->dir, sizeof p->dir) != 0) ||
      snprintf(shm, sizeof shm, "%s/shm.sock", p->dir) >= 108) {
    free(argv);
    return -1;
  }
  chmod(p->dir, 0711); /* other users' clients reach the socket, not the listing */
  int fixed = p->port > 0;
  int rc = -1;
  for (int attempt = 0; attempt < TS_START_TRIES; attempt++) {
    if (!fixed)
      p->port = ecs_ts_free_port();
    if (p->port <= 0)
      break;
    char listen[32], redis[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", p->port);
    snprintf(redis, sizeof redis, "127.0.0.1:%d", redis_port);
    size_t k = 0;
    argv[k++] = binbuf;
    argv[k++] = "--listen";
    argv[k++] = listen;
    argv[k++] = "--redis";
    argv[k++] = redis;
    argv[k++] = "--pool-size";
    argv[k++] = "64M";
    argv[k++] = "--ns";
    argv[k++] = "test";
    argv[k++] = "--shm-socket";
    argv[k++] = shm;
    /* Redis replies may pass the server's 500 ms default on a loaded CI
     * host (sanitizers, --threads 4, parallel suites), turning puts into
     * ECS_EREDIS (stored, not yet published) where a test expects ECS_OK.
     * Tests of slow or frozen Redis set their own, later on the line. */
    argv[k++] = "--redis-timeout-ms";
    argv[k++] = "2000";
    /* ECS_TEST_SERVER_THREADS=N runs every suite's server with --threads N
     * (a test's own --threads, later on the line, wins). */
    const char *threads = getenv("ECS_TEST_SERVER_THREADS");
    if (threads != NULL && threads[0] != '\0') {
      argv[k++] = "--threads";
      argv[k++] = (char *)threads;
    }
    for (size_t i = 0; i < nextra; i++)
      argv[k++] = (char *)extra[i];
    argv[k] = NULL;
    if (ecs_ts_spawn(p, argv) != 0)
      break;
    if (ecs_ts_wait_port(p, p->port, server_start_ms(extra)) == 0) {
      rc = 0;
      break;
    }
    /* a retry helps when the server exited (another process took the
     * port; wait_port reaped it), not when it is up and too slow */
    int gone = p->pid <= 0;
    ecs_ts_kill9(p);
    if (fixed || !gone)
      break;
  }
  free(argv);
  return rc;
}

/* Whether every thread of pid is stopped (state T in /proc): kill(2)
 * returns before a multi-threaded process has stopped, and a thread not
 * yet stopped may still answer a request (the server's --threads). */
static int ts_all_stopped(int pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (d == NULL)
    return 1; /* no /proc: nothing better to wait for */
  int all = 1;
  struct dirent *de;
  while (all && (de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.')
      continue;
    char stat[128], buf[512];
    snprintf(stat, sizeof stat, "/proc/%d/task/%.20s/stat", pid, de->d_name);
    FILE *f = fopen(stat, "r");
    if (f == NULL)
      continue; /* the thread exited */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    if (rp && rp[1] == ' ' && rp[2] != 'T' && rp[2] != 't')
      all = 0;
  }
  closedir(d);
  return all;
}

int ecs_ts_signal(ecs_ts_proc_t *p, int sig) {
  if (p == NULL || p->pid <= 0)
    return -1;
  if (kill(p->pid, sig) != 0)
    return -1;
  /* SIGSTOP: return once the whole process has stopped (2 s at most) */
  for (int i = 0; sig == SIGSTOP && i < 2000 && !ts_all_stopped(p->pid); i++)
    usleep(1000);
  return 0;
}

static int ts_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  if (remove(path) != 0 && errno != ENOENT)
    fprintf(stderr, "ts: remove %s: %s\n", path, strerror(errno));
  return 0;
}

/* rm -rf dir, without following symlinks out of it. */
static void ts_rmdir(const char *dir) {
  if (dir[0] == '\0' || strcmp(dir, "/") == 0)
    return;
  nftw(dir, ts_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int ts_exit_code(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return -1;
}

int ecs_ts_stop(ecs_ts_proc_t *p, int timeout_ms) {
  if (p == NULL)
    return -1;
  int rc = -1;
  if (p->pid > 0) {
    int status = 0;
    /* The whole group: a SIGSTOPped child must be continued to see SIGTERM. */
    kill(-p->pid, SIGCONT);
    kill(-p->pid, SIGTERM);
    uint64_t deadline = ts_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    int gone = 0;
    for (;;) {
      if (ts_reaped(p, &status)) {
        gone = 1;
        break;
      }
      if (ts_now_ms() >= deadline)
        break;
      ts_sleep_ms(5);
    }
    if (!gone) {
      fprintf(stderr, "ts: pid %d ignored SIGTERM for %d ms; SIGKILL\n", (int)p->pid, timeout_ms);
      kill(-p->pid, SIGKILL);
      while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {
      }
      p->pid = 0;
    }
    rc = ts_exit_code(status);
  }
  ts_untrack(p->dir, 1);
  ts_rmdir(p->dir);
  memset(p, 0, sizeof *p);
  return rc;
}

void ecs_ts_kill9(ecs_ts_proc_t *p) {
  if (p == NULL || p->pid <= 0)
    return;
  kill(-p->pid, SIGKILL);
  kill(p->pid, SIGKILL);
  int status;
  while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {
  }
  p->pid = 0;
  ts_untrack(p->dir, 0);
}

const char *ecs_ts_bin(const char *name) {
  static char buf[512];
  const char *dir = getenv("ECS_BIN_DIR");
  if (dir == NULL || dir[0] == '\0')
    dir = "build/bin";
  snprintf(buf, sizeof buf, "%s/%s", dir, name);
  return buf;
}

int ecs_ts_file_lines_with(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  char line[1024];
  int k = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle))
      k++;
  fclose(f);
  return k;
}

/* ---- HTTP: the metrics endpoint ----------------------------------------- */

long ecs_ts_http(int port, const char *req, size_t req_len, char *out, size_t cap) {
  int fd;
  if (ecs_net_connect("127.0.0.1", port, 2000, &fd) != 0)
    return -1;
  uint64_t deadline = ecs_now_ms() + 5000;
  size_t sent = 0, n = 0;
  while (sent < req_len) {
    ssize_t w = send(fd, req + sent, req_len - sent, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 100);
      if (ecs_now_ms() > deadline)
        break;
      continue;
    }
    if (w <= 0)
      break; /* the server may answer and close before taking it all */
    sent += (size_t)w;
  }
  while (n + 1 < cap && ecs_now_ms() < deadline) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0)
      continue;
    ssize_t r = recv(fd, out + n, cap - 1 - n, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  out[n] = '\0';
  close(fd);
  return (long)n;
}

double ecs_ts_sample(const char *body, const char *series) {
  size_t sl = strlen(series);
  for (const char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, series, sl) && l[sl] == ' ')
      return strtod(l + sl + 1, NULL);
  return -1;
}

double ecs_ts_metric(int port, const char *series) {
  static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  char *resp = malloc(1 << 18);
  if (resp == NULL)
    return -1;
  double v = -1;
  if (ecs_ts_http(port, req, sizeof req - 1, resp, 1 << 18) > 0) {
    const char *body = strstr(resp, "\r\n\r\n");
    if (body != NULL)
      v = ecs_ts_sample(body + 4, series);
  }
  free(resp);
  return v;
}
