/*
 * What an operator and a new user see: the server's and the CLI's messages
 * (the exact text a person reads), the server's log lines for readiness and
 * for Redis going and coming back, and the CLI working against a server
 * whose Redis is down.  Real redis-server, ecstore-server and ecstore-cli
 * processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "store/net.h"
#include "support/ts.h"

#define RUN_TIMEOUT_MS 20000 /* one CLI or server run; ASan builds are slow */
#define OUT_CAP 16384

/* Runs argv (argv[0] a path) with extra environment entries, stdout and
 * stderr into out; kills it past RUN_TIMEOUT_MS.  Returns the exit status,
 * or -1. */
static int run(char *const argv[], char *const env[], char *out, size_t cap) {
  int pfd[2];
  if (pipe(pfd) != 0)
    return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    for (size_t i = 0; env && env[i]; i++)
      putenv(env[i]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  uint64_t deadline = ecs_now_ms() + RUN_TIMEOUT_MS;
  for (;;) {
    uint64_t now = ecs_now_ms();
    if (now >= deadline) {
      kill(pid, SIGKILL);
      break;
    }
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    int r = poll(&p, 1, (int)(deadline - now));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      continue;
    char tmp[4096];
    ssize_t k = read(pfd[0], tmp, sizeof tmp);
    if (k <= 0)
      break;
    size_t take = (size_t)k < cap - 1 - n ? (size_t)k : cap - 1 - n;
    memcpy(out + n, tmp, take);
    n += take;
  }
  out[n] = '\0';
  close(pfd[0]);
  int ws;
  if (waitpid(pid, &ws, 0) != pid)
    return -1;
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* Number of lines of s that contain needle. */
static int lines_with(const char *s, const char *needle) {
  int k = 0;
  while (s && *s) {
    const char *e = strchr(s, '\n');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    const char *hit = strstr(s, needle);
    if (hit && (size_t)(hit - s) < len)
      k++;
    s = e ? e + 1 : NULL;
  }
  return k;
}

/* Reads a process's log file (whole, up to cap). */
static void read_log(const ecs_ts_proc_t *p, char *out, size_t cap) {
  out[0] = '\0';
  FILE *f = fopen(p->log, "r");
  if (!f)
    return;
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = '\0';
  fclose(f);
}

/* Waits up to ms for the process's log to contain needle. */
static int log_wait(const ecs_ts_proc_t *p, const char *needle, int ms) {
  static char buf[65536];
  uint64_t deadline = ecs_now_ms() + (uint64_t)ms;
  do {
    read_log(p, buf, sizeof buf);
    if (strstr(buf, needle))
      return 1;
    usleep(50000);
  } while (ecs_now_ms() < deadline);
  fprintf(stderr, "log %s lacks '%s':\n%s\n", p->log, needle, buf);
  return 0;
}

static void show(const char *what, const char *out) { /* for the log of a failed run */
  fprintf(stderr, "--- %s printed:\n%s---\n", what, out);
}

/* A second server on a port in use: one line that names the address and
 * the cause, and no generic second line. */
static void test_port_in_use(void **state) {
  (void)state;
  ecs_ts_proc_t srv = {0};
  assert_int_equal(ecs_ts_server_start(&srv, 1, (const char *const[]){"--redis", "none", NULL}), 0);
  char listen[32], out[OUT_CAP], bin[512];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", srv.port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin, "--listen", listen, "--redis", "none", "--pool-size", "8M", "--shm-socket", "off", NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-server on a busy port", out);
  assert_int_equal(st, 1);
  char want[96];
  snprintf(want, sizeof want, "cannot start: cannot listen on %s: Address already in use", listen);
  assert_int_equal(lines_with(out, want), 1);
  assert_int_equal(lines_with(out, "cannot start"), 1);
  assert_null(strstr(out, "input/output error"));
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
}

/* --hugepages require with too few huge pages free: says huge pages, how
 * many, and what to do; never "out of host memory". */
static void test_hugepages_required_none_free(void **state) {
  (void)state;
  /* A pool one page larger than every free huge page: it cannot fit,
   * whatever this machine has reserved. */
  unsigned long long kb = 0, nfree = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  assert_non_null(f);
  char line[128];
  while (fgets(line, sizeof line, f)) {
    sscanf(line, "Hugepagesize: %llu kB", &kb);
    sscanf(line, "HugePages_Free: %llu", &nfree);
  }
  fclose(f);
  if (kb == 0)
    skip(); /* no hugetlb support at all */
  char size[32], out[OUT_CAP], bin[512];
  unsigned long long mib = ((nfree + 1) * kb + 1023) / 1024;
  snprintf(size, sizeof size, "%lluM", mib < 1 ? 1 : mib);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,          "--listen", "127.0.0.1:0", "--redis", "none",     "--pool-size",
                  size,         "--hugepages", "require",  "--shm-socket", "off", NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-server --hugepages require", out);
  assert_int_equal(st, 1);
  assert_int_equal(lines_with(out, "cannot start: --hugepages require:"), 1);
  assert_non_null(strstr(out, "huge pages of"));
  assert_non_null(strstr(out, "vm.nr_hugepages"));
  assert_null(strstr(out, "out of host memory"));
  assert_int_equal(lines_with(out, "cannot start"), 1);
}

/* The CLI against a port nobody listens on: the system's reason once. */
static void test_cli_server_not_running(void **state) {
  (void)state;
  int port = ecs_ts_free_port();
  char srv[32], out[OUT_CAP], bin[512];
  snprintf(srv, sizeof srv, "127.0.0.1:%d", port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  char *argv[] = {bin, "--server", srv, "--redis", "none", "stat", NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-cli stat", out);
  assert_int_equal(st, 1);
  char want[160];
  snprintf(want, sizeof want,
           "ecstore-cli: cannot connect to %s: connection refused (is ecstore-server running there?)\n", srv);
  assert_string_equal(out, want);
}

/* The server says when it is ready, with the address to use. */
static void test_ready_line(void **state) {
  (void)state;
  ecs_ts_proc_t srv = {0};
  assert_int_equal(ecs_ts_server_start(&srv, 1, (const char *const[]){"--redis", "none", NULL}), 0);
  char want[64];
  snprintf(want, sizeof want, "ready: listening on 127.0.0.1:%d", srv.port);
  assert_true(log_wait(&srv, want, 5000));
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
}

/* A real Redis started, then stopped: the CLI still puts, gets, stats and
 * answers exists (from the server); the server logs the loss, and the
 * return once Redis is back on the same port. */
static void test_cli_with_redis_down(void **state) {
  (void)state;
  ecs_ts_proc_t redis = {0}, srv = {0};
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  assert_int_equal(ecs_ts_server_start(&srv, redis.port, NULL), 0);
  assert_true(log_wait(&srv, "registered with Redis", 5000));
  ecs_ts_kill9(&redis); /* keeps its port and directory for the restart */

  char srv_env[64], redis_env[64], file[320], outfile[320], out[OUT_CAP], bin[512];
  snprintf(srv_env, sizeof srv_env, "ECSTORE_SERVERS=127.0.0.1:%d", srv.port);
  snprintf(redis_env, sizeof redis_env, "ECSTORE_REDIS=127.0.0.1:%d", redis.port);
  char *env[] = {srv_env, redis_env, "ECSTORE_NS=test", NULL};
  snprintf(file, sizeof file, "%s/in.bin", srv.dir);
  snprintf(outfile, sizeof outfile, "%s/out.bin", srv.dir);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  FILE *f = fopen(file, "wb");
  assert_non_null(f);
  for (int i = 0; i < 4096; i++)
    fputc(i * 7, f);
  fclose(f);

  char *put[] = {bin, "put", "k-down", file, "--dtype", "f32", "--shape", "32,32", NULL};
  int st = run(put, env, out, sizeof out);
  show("put", out);
  assert_int_equal(st, 0);
  char *get[] = {bin, "get", "k-down", outfile, NULL};
  st = run(get, env, out, sizeof out);
  show("get", out);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "k-down: 4096 bytes, dtype f32, shape 32,32"));
  char *exists[] = {bin, "exists", "k-down", "k-never", NULL};
  st = run(exists, env, out, sizeof out);
  show("exists", out);
  assert_int_equal(st, 0);
  assert_string_equal(out, "k-down yes\nk-never no\n");
  char *stat[] = {bin, "stat", NULL};
  st = run(stat, env, out, sizeof out);
  show("stat", out);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "redis DOWN"));
  assert_true(log_wait(&srv, "redis: connection to", 5000));
  assert_true(log_wait(&srv, "lost", 5000));

  /* Back on the same port: the server says so and re-publishes. */
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  assert_true(log_wait(&srv, "regained; re-publishing 1 objects", 10000));
  st = run(exists, env, out, sizeof out);
  show("exists after the return", out);
  assert_int_equal(st, 0);
  assert_string_equal(out, "k-down yes\nk-never no\n");
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
  ecs_ts_stop(&redis, 5000);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_port_in_use),
      cmocka_unit_test(test_hugepages_required_none_free),
      cmocka_unit_test(test_cli_server_not_running),
      cmocka_unit_test(test_ready_line),
      cmocka_unit_test(test_cli_with_redis_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
