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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ecstore.h"
#include "store/server/metrics.h"
#include "store/core/net.h"
#include "store/core/parse.h"
#include "support/fixture.h"
#include "support/ts.h"

#define RUN_TIMEOUT_MS 20000 /* one CLI or server run; ASan builds are slow */
#define OUT_CAP 16384

static int g_oom_first; /* run(): the child gets oom_score_adj 1000 */

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
    if (g_oom_first) { /* the kernel's first choice should this child outgrow memory after all */
      int fd = open("/proc/self/oom_score_adj", O_WRONLY);
      if (fd >= 0) {
        ssize_t w = write(fd, "1000", 4);
        (void)w;
        close(fd);
      }
    }
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

/* Protected mode: a non-loopback listen address without a token is
 * refused, with one line naming both ways out; --unprotected runs open. */
static void test_protected_mode(void **state) {
  (void)state;
  char out[OUT_CAP], bin[512], listen[32];
  int port = ecs_ts_free_port();
  snprintf(listen, sizeof listen, "0.0.0.0:%d", port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,           "--listen", listen,         "--redis", "none",
                  "--pool-size", "8M",       "--shm-socket", "off",     NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-server on 0.0.0.0 without a token", out);
  assert_int_equal(st, 1);
  char want[160];
  snprintf(want, sizeof want, "cannot start: listening on 0.0.0.0 without an auth token");
  assert_int_equal(lines_with(out, want), 1);
  assert_int_equal(lines_with(out, "--auth-token-file FILE, or pass --unprotected"), 1);
  assert_int_equal(lines_with(out, "cannot start"), 1);
  /* told so, it starts */
  ecs_ts_proc_t srv = {0};
  srv.port = port;
  assert_int_equal(
      ecs_ts_server_start(
          &srv, 1, (const char *const[]){"--redis", "none", "--listen", listen, "--unprotected", NULL}),
      0);
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
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
  char *argv[] = {bin,           "--listen", listen,         "--redis", "none",
                  "--pool-size", "8M",       "--shm-socket", "off",     NULL};
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

/* A server that fails to start after reaching Redis (its metrics port is
 * taken) leaves no registry entry behind: no node hash, not in the node
 * set (issue 24), so no client places puts on it until an entry expires. */
static void test_failed_start_not_registered(void **state) {
  (void)state;
  ecs_ts_proc_t redis = {0};
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  int busy = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  assert_true(busy >= 0);
  setsockopt(busy, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(busy, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(busy, 1), 0);
  socklen_t al = sizeof a;
  assert_int_equal(getsockname(busy, (struct sockaddr *)&a, &al), 0);
  char mlisten[32], listen_at[32], rurl[32], out[OUT_CAP], bin[512];
  snprintf(mlisten, sizeof mlisten, "127.0.0.1:%d", ntohs(a.sin_port));
  snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", ecs_ts_free_port());
  snprintf(rurl, sizeof rurl, "127.0.0.1:%d", redis.port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,   "--listen",         listen_at,  "--redis",     rurl, "--ns",
                  "reg", "--node-id",        "failnode", "--pool-size", "8M", "--shm-socket",
                  "off", "--metrics-listen", mlisten,    NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-server with its metrics port taken", out);
  assert_int_equal(st, 1);
  assert_int_equal(lines_with(out, "cannot start"), 1);
  redisContext *r = ecs_ts_redis_at(redis.port);
  assert_non_null(r);
  redisReply *rep = redisCommand(r, "SISMEMBER ecs:{reg}:nodes failnode");
  assert_non_null(rep);
  assert_int_equal(rep->integer, 0);
  freeReplyObject(rep);
  rep = redisCommand(r, "EXISTS ecs:{reg}:node:failnode");
  assert_non_null(rep);
  assert_int_equal(rep->integer, 0);
  freeReplyObject(rep);
  redisFree(r);
  close(busy);
  ecs_ts_stop(&redis, 5000);
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
  if (kb == 0) {
    printf("skip: test_hugepages_required_none_free: this kernel has no huge pages (no Hugepagesize in "
           "/proc/meminfo)\n");
    skip();
  }
  char size[32], out[OUT_CAP], bin[512];
  unsigned long long mib = ((nfree + 1) * kb + 1023) / 1024;
  snprintf(size, sizeof size, "%lluM", mib < 1 ? 1 : mib);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,  "--listen",    "127.0.0.1:0", "--redis",      "none", "--pool-size",
                  size, "--hugepages", "require",     "--shm-socket", "off",  NULL};
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
  char want[400];
  snprintf(want, sizeof want, "ready: listening on 127.0.0.1:%d and shm %s/shm.sock", srv.port, srv.dir);
  assert_true(log_wait(&srv, want, 5000));
  /* the test servers' sockets live in their own directories, which stop
   * removes: none is left in /tmp, even after a kill -9 */
  char dflt[64];
  snprintf(dflt, sizeof dflt, "/tmp/ecstore-%d.sock", srv.port);
  assert_int_equal(access(dflt, F_OK), -1);
  char dir[256];
  snprintf(dir, sizeof dir, "%s", srv.dir);
  ecs_ts_kill9(&srv);
  ecs_ts_stop(&srv, 5000); /* already dead: removes its directory, socket included */
  assert_int_equal(access(dir, F_OK), -1);
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
  /* stored, its record late: said once, in one sentence (it once read
   * "stored, but 1 of 1 items stored but not yet published") */
  if (*out) {
    assert_string_equal(out, "ecstore-cli: put k-down: 1 of 1 items stored but not yet published to Redis "
                             "(Redis slow or down): gets find them, exists through Redis says 0 until the "
                             "server re-publishes them\n");
  }
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

/* ---- the Prometheus endpoint -------------------------------------------- */

/* Checks the exposition format line by line: every sample belongs to a
 * family announced by "# TYPE" before it, names and values parse, and
 * every histogram series has cumulative buckets ending in +Inf whose count
 * equals _count.  Returns the number of histogram series checked. */
static int check_exposition(const char *body) {
  char family[128] = "", type[32] = "";
  uint64_t prev_cum = 0;
  double inf = -1;
  int series = 0;
  for (const char *l = body; *l;) {
    const char *e = strchr(l, '\n');
    assert_non_null(e); /* every line ends with a newline */
    char line[512];
    size_t len = (size_t)(e - l);
    assert_true(len > 0 && len < sizeof line);
    memcpy(line, l, len);
    line[len] = '\0';
    l = e + 1;
    if (!strncmp(line, "# HELP ", 7))
      continue;
    if (!strncmp(line, "# TYPE ", 7)) {
      assert_int_equal(sscanf(line + 7, "%127s %31s", family, type), 2);
      assert_true(!strcmp(type, "gauge") || !strcmp(type, "counter") || !strcmp(type, "histogram"));
      continue;
    }
    assert_true(line[0] != '#');
    /* name{labels} value */
    char *sp = strrchr(line, ' ');
    assert_non_null(sp);
    char *end;
    double v = strtod(sp + 1, &end);
    assert_true(*end == '\0' && end != sp + 1);
    *sp = '\0';
    char *brace = strchr(line, '{');
    if (brace) {
      assert_true(line[strlen(line) - 1] == '}');
      *brace = '\0';
    }
    size_t fl = strlen(family);
    assert_true(fl > 0 && !strncmp(line, family, fl)); /* announced by # TYPE */
    const char *suffix = line + fl;
    if (strcmp(type, "histogram") != 0) {
      assert_string_equal(suffix, "");
      continue;
    }
    if (!strcmp(suffix, "_bucket")) {
      assert_true((uint64_t)v >= prev_cum); /* cumulative */
      prev_cum = (uint64_t)v;
      if (strstr(brace + 1, "le=\"+Inf\""))
        inf = v;
    } else if (!strcmp(suffix, "_sum")) {
      assert_true(v >= 0);
    } else {
      assert_string_equal(suffix, "_count");
      assert_true(inf >= 0); /* the +Inf bucket came first */
      assert_true(v == inf);
      series++;
      prev_cum = 0;
      inf = -1;
    }
  }
  return series;
}

static void test_http_parse(void **state) {
  (void)state;
  static const struct {
    const char *req;
    ecs_http_req_t want;
  } cases[] = {
      {"GET /metrics HTTP/1.0\r\n\r\n", ECS_HTTP_METRICS},
      {"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n", ECS_HTTP_METRICS},
      {"HEAD /metrics HTTP/1.0\n\n", ECS_HTTP_HEAD},
      {"GET /metrics HTTP/1.0\r\n", ECS_HTTP_MORE},
      {"GET /metric", ECS_HTTP_MORE},
      {"GET / HTTP/1.0\r\n\r\n", ECS_HTTP_NOTFOUND},
      {"GET /metricsx HTTP/1.0\r\n\r\n", ECS_HTTP_NOTFOUND},
      {"POST /metrics HTTP/1.0\r\n\r\n", ECS_HTTP_METHOD},
      {"GET /metrics\r\n\r\n", ECS_HTTP_BAD},
      {"GET /metrics HTTP/2.0\r\n\r\n", ECS_HTTP_BAD},
      {" /metrics HTTP/1.0\r\n\r\n", ECS_HTTP_BAD},
      {"\r\n\r\n", ECS_HTTP_BAD},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ecs_http_req_t got = ecs_metrics_http_parse(cases[i].req, strlen(cases[i].req));
    if (got != cases[i].want)
      fprintf(stderr, "case %zu: '%s' -> %d\n", i, cases[i].req, (int)got);
    assert_int_equal(got, cases[i].want);
  }
  /* a head that never ends is refused at the bound, not buffered */
  char big[ECS_METRICS_MAX_REQUEST + 10];
  memset(big, 'a', sizeof big);
  memcpy(big, "GET /metrics HTTP/1.0\r\nX: ", 26);
  assert_int_equal(ecs_metrics_http_parse(big, ECS_METRICS_MAX_REQUEST - 1), ECS_HTTP_MORE);
  assert_int_equal(ecs_metrics_http_parse(big, ECS_METRICS_MAX_REQUEST), ECS_HTTP_BAD);
  assert_int_equal(ecs_metrics_http_parse(big, sizeof big), ECS_HTTP_BAD);
}

/* A run: puts and gets, then scrapes; the counters moved by what was done,
 * the histograms are well formed, the endpoint refuses what it should, and
 * stat --json reports the same counters. */
static void test_metrics_scrape(void **state) {
  (void)state;
  ecs_ts_proc_t redis = {0}, srv = {0};
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  int mport = ecs_ts_free_port();
  char mlisten[32];
  snprintf(mlisten, sizeof mlisten, "127.0.0.1:%d", mport);
  assert_int_equal(
      ecs_ts_server_start(&srv, redis.port, (const char *const[]){"--metrics-listen", mlisten, NULL}), 0);
  static char resp[1 << 16];
  static const char get_req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  assert_true(ecs_ts_http(mport, get_req, sizeof get_req - 1, resp, sizeof resp) > 0);
  assert_true(!strncmp(resp, "HTTP/1.0 200 OK\r\n", 17));
  char *body = strstr(resp, "\r\n\r\n");
  assert_non_null(body);
  assert_true(ecs_ts_sample(body + 4, "ecstore_puts_total") == 0);

  char servers[32];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", srv.port);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = servers;
  cfg.ns = "test";
  cfg.transport = "tcp";
  ecs_client_t *c;
  assert_int_equal(ecs_client_connect(&cfg, &c, NULL, 0), 0);
  uint8_t data[3][1000];
  ecs_key_t keys[4] = {{"m0", 2}, {"m1", 2}, {"m2", 2}, {"nope", 4}};
  ecs_tensor_t t[3];
  for (int i = 0; i < 3; i++) {
    memset(data[i], i + 1, sizeof data[i]);
    t[i] = (ecs_tensor_t){.data = data[i],
                          .nbytes = sizeof data[i],
                          .desc = {.dtype = ECS_DTYPE_U8, .ndim = 1, .shape = {sizeof data[i]}}};
  }
  int st[3];
  assert_int_equal(ecs_put_batch(c, keys, t, 3, st), 0);
  ecs_get_buf_t b[4];
  uint8_t out[4][1000];
  for (int i = 0; i < 4; i++)
    b[i] = (ecs_get_buf_t){.data = out[i], .capacity = sizeof out[i]};
  assert_int_equal(ecs_get_batch(c, keys, b, 4), 0);
  assert_int_equal(b[3].status, ECS_ENOTFOUND);
  ecs_client_close(c);

  assert_true(ecs_ts_http(mport, get_req, sizeof get_req - 1, resp, sizeof resp) > 0);
  assert_true(!strncmp(resp, "HTTP/1.0 200 OK\r\n", 17));
  assert_non_null(strstr(resp, "Content-Type: text/plain; version=0.0.4"));
  body = strstr(resp, "\r\n\r\n") + 4;
  assert_true(ecs_ts_sample(body, "ecstore_puts_total") == 3);
  assert_true(ecs_ts_sample(body, "ecstore_gets_total") == 4);
  assert_true(ecs_ts_sample(body, "ecstore_get_hits_total") == 3);
  assert_true(ecs_ts_sample(body, "ecstore_get_misses_total") == 1);
  assert_true(ecs_ts_sample(body, "ecstore_objects") == 3);
  assert_true(ecs_ts_sample(body, "ecstore_evictions_total") == 0);
  assert_true(ecs_ts_sample(body, "ecstore_evict_skipped_total") == 0);
  assert_true(ecs_ts_sample(body, "ecstore_hard_pinned_bytes") == 0);
  assert_true(ecs_ts_sample(body, "ecstore_redis_up") == 1);
  /* started without --cuda-register: the gauge is there, and 0 */
  assert_true(ecs_ts_sample(body, "ecstore_pool_cuda_registered") == 0);
  assert_true(ecs_ts_sample(body, "ecstore_request_duration_seconds_count{op=\"put\"}") >= 1);
  assert_true(ecs_ts_sample(body, "ecstore_request_duration_seconds_count{op=\"get\"}") >= 1);
  assert_true(check_exposition(body) >= 13); /* one series per named opcode */

  /* what it refuses: another path, another method, an endless head */
  static const char nf[] = "GET /x HTTP/1.0\r\n\r\n", post[] = "POST /metrics HTTP/1.0\r\n\r\n";
  assert_true(ecs_ts_http(mport, nf, sizeof nf - 1, resp, sizeof resp) > 0);
  assert_true(!strncmp(resp, "HTTP/1.0 404 ", 13));
  assert_true(ecs_ts_http(mport, post, sizeof post - 1, resp, sizeof resp) > 0);
  assert_true(!strncmp(resp, "HTTP/1.0 405 ", 13));
  static char
      endless[ECS_METRICS_MAX_REQUEST]; /* exactly the bound: nothing left unread to reset the reply */
  memset(endless, 'a', sizeof endless);
  assert_true(ecs_ts_http(mport, endless, sizeof endless, resp, sizeof resp) > 0);
  assert_true(!strncmp(resp, "HTTP/1.0 431 ", 13));
  /* a scraper that connects and says nothing does not hold the others up */
  int idle;
  assert_int_equal(ecs_net_connect("127.0.0.1", mport, 2000, &idle), 0);
  assert_true(ecs_ts_http(mport, get_req, sizeof get_req - 1, resp, sizeof resp) > 0);
  assert_true(!strncmp(resp, "HTTP/1.0 200 OK\r\n", 17));
  close(idle);

  /* stat --json: the same counters, for scripts */
  char bin[512], outbuf[OUT_CAP];
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  char *argv[] = {bin, "--server", servers, "--ns", "test", "--redis", "none", "stat", "--json", NULL};
  int rc = run(argv, NULL, outbuf, sizeof outbuf);
  show("stat --json", outbuf);
  assert_int_equal(rc, 0);
  assert_true(!strncmp(outbuf, "[\n  {\"index\": 0, \"address\": \"127.0.0.1:", 38));
  assert_non_null(strstr(outbuf, "\"puts\": 3, \"gets\": 4, \"hits\": 3, \"misses\": 1, \"evictions\": 0"));
  assert_non_null(strstr(outbuf, "\"redis_up\": true}\n]\n"));
  char *bad[] = {bin, "--server", servers, "ping", "--json", NULL};
  assert_int_equal(run(bad, NULL, outbuf, sizeof outbuf), 2);
  assert_non_null(strstr(outbuf, "--json goes with stat"));

  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
  ecs_ts_stop(&redis, 5000);
}

/* A '#' inside a config value is part of it (a Redis URL's fragment, a
 * path); only a '#' at a line's start or after whitespace opens a comment. */
static void test_config_hash_in_value(void **state) {
  (void)state;
  char dir[256], path[300], err[256];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(path, sizeof path, "%s/server.conf", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "# a comment line\n"
             "ns = team#7   # the namespace\n"
             "log-level=debug#x\n"
             "  #indented comment\n"
             "redis\tnone\t#tab before it\n");
  fclose(f);
  int argc = 0;
  char **argv = NULL;
  assert_int_equal(ecs_conf_to_argv(path, &argc, &argv, err, sizeof err), ECS_OK);
  assert_int_equal(argc, 6);
  assert_string_equal(argv[0], "--ns");
  assert_string_equal(argv[1], "team#7");
  assert_string_equal(argv[2], "--log-level");
  assert_string_equal(argv[3], "debug#x"); /* no space before it: not a comment */
  assert_string_equal(argv[4], "--redis");
  assert_string_equal(argv[5], "none");
  ecs_conf_free_argv(argc, argv);
  unlink(path);
  rmdir(dir);
}

/* An option name longer than an option can be (found by
 * tests/fuzz/fuzz_config): it was cut to 253 bytes without a word, so the
 * server ran with (or complained about) an option the file does not name,
 * one that could end in a stray '\r'.  It is refused with its line. */
static void test_config_long_name(void **state) {
  (void)state;
  char dir[256], path[300], err[256];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(path, sizeof path, "%s/server.conf", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "log-level = info\n%0300d\r\v = 1\n", 7);
  fclose(f);
  int argc = -1;
  char **argv = NULL;
  assert_int_equal(ecs_conf_to_argv(path, &argc, &argv, err, sizeof err), ECS_EINVAL);
  assert_int_equal(argc, 0);
  assert_null(argv);
  assert_non_null(strstr(err, "server.conf:2: option name too long"));
  unlink(path);
  rmdir(dir);
}

/* --port-file where an attacker planted a symlink to a file they want
 * overwritten: the link is replaced by the port file, the victim keeps its
 * bytes. */
static void test_port_file_symlink(void **state) {
  (void)state;
  char dir[256], victim[300], link_path[300];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  snprintf(link_path, sizeof link_path, "%s/port", dir);
  FILE *f = fopen(victim, "w");
  assert_non_null(f);
  fputs("precious\n", f);
  fclose(f);
  assert_int_equal(symlink(victim, link_path), 0);
  ecs_ts_proc_t srv = {0};
  assert_int_equal(
      ecs_ts_server_start(&srv, 1, (const char *const[]){"--redis", "none", "--port-file", link_path, NULL}),
      0);
  /* the port file is written once the listener is up: wait for it */
  struct stat st;
  uint64_t deadline = ecs_now_ms() + RUN_TIMEOUT_MS;
  while ((lstat(link_path, &st) != 0 || S_ISLNK(st.st_mode)) && ecs_now_ms() < deadline)
    usleep(20000);
  assert_int_equal(lstat(link_path, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  char buf[64] = "", want[32];
  f = fopen(link_path, "r");
  assert_non_null(f);
  assert_non_null(fgets(buf, sizeof buf, f));
  fclose(f);
  snprintf(want, sizeof want, "%d\n", srv.port);
  assert_string_equal(buf, want);
  f = fopen(victim, "r");
  assert_non_null(f);
  assert_non_null(fgets(buf, sizeof buf, f));
  fclose(f);
  assert_string_equal(buf, "precious\n");
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
  unlink(victim);
  unlink(link_path);
  rmdir(dir);
}

/* A token file group or others can read: the server refuses to start and
 * says which chmod fixes it. */
static void test_token_file_too_open(void **state) {
  (void)state;
  char dir[256], tok[300], out[OUT_CAP], bin[512], want[1024];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(tok, sizeof tok, "%s/token", dir);
  FILE *f = fopen(tok, "w");
  assert_non_null(f);
  fputs("s3cret\n", f);
  fclose(f);
  assert_int_equal(chmod(tok, 0644), 0);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,  "--listen",     "127.0.0.1:0", "--redis",           "none", "--pool-size",
                  "8M", "--shm-socket", "off",         "--auth-token-file", tok,    NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-server with a 0644 token file", out);
  assert_int_equal(st, 2);
  snprintf(want, sizeof want,
           "ecstore-server: --auth-token-file '%s': permissions 0644 are too open (group or others may "
           "access it); run: chmod 600 '%s'\n",
           tok, tok);
  assert_string_equal(out, want);
  unlink(tok);
  rmdir(dir);
}

/* ---- what a newcomer hits in the first hour (issue 26) ------------------ */

/* A pool far larger than the memory there is: refused before populating,
 * with the numbers and a --pool-size that fits, exit status 1; never the
 * OOM killer half-way (the child runs with oom_score_adj 1000, so that a
 * regression kills the server, not a neighbour). */
static void test_pool_over_memory(void **state) {
  (void)state;
  unsigned long long kb = 0, swap = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  assert_non_null(f);
  char line[128];
  while (fgets(line, sizeof line, f)) {
    sscanf(line, "MemAvailable: %llu kB", &kb);
    sscanf(line, "SwapFree: %llu kB", &swap);
  }
  fclose(f);
  assert_true(kb > 0);
  char size[32], out[OUT_CAP], bin[512];
  snprintf(size, sizeof size, "%lluM", (kb + swap) / 1024 * 4 + 1024); /* 4 x, pinned or not */
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin,           "--listen", "127.0.0.1:0",  "--redis", "none",
                  "--pool-size", size,       "--shm-socket", "off",     NULL};
  g_oom_first = 1;
  int st = run(argv, NULL, out, sizeof out);
  g_oom_first = 0;
  show("ecstore-server with a pool 4 x the memory available", out);
  assert_int_equal(st, 1);
  char want[160];
  snprintf(want, sizeof want,
           "cannot start: --pool-size %.*s MiB is more than the memory available: ", (int)strlen(size) - 1,
           size);
  assert_int_equal(lines_with(out, want), 1);
  assert_int_equal(lines_with(out, "Use a smaller --pool-size, e.g. --pool-size "), 1);
  assert_null(strstr(out, "pool: populating")); /* refused before, not during */
  assert_int_equal(lines_with(out, "cannot start"), 1);
  /* the size it suggests starts */
  const char *sug = strstr(out, "e.g. --pool-size ");
  assert_non_null(sug);
  unsigned long long mib = strtoull(sug + strlen("e.g. --pool-size "), NULL, 10);
  assert_true(mib > 0 && mib * 1024 <= kb + swap);
}

/* Sizes with a decimal fraction ("1.5G") are what people type: accepted,
 * rounded down to whole bytes; a fraction of a byte is not. */
static void test_pool_size_decimal(void **state) {
  (void)state;
  uint64_t v = 0;
  assert_int_equal(ecs_parse_size("1.5G", &v), ECS_OK);
  assert_int_equal(v, 3ull << 29);
  assert_int_equal(ecs_parse_size("0.5M", &v), ECS_OK);
  assert_int_equal(v, 1ull << 19);
  assert_int_equal(ecs_parse_size("2.25GiB", &v), ECS_OK);
  assert_int_equal(v, 9ull << 28);
  assert_int_equal(ecs_parse_size("1.1K", &v), ECS_OK);
  assert_int_equal(v, 1126); /* 1126.4 rounded down */
  assert_int_equal(ecs_parse_size("1.000000001T", &v), ECS_OK);
  assert_int_equal(v, (1ull << 40) + 1099);
  assert_int_equal(ecs_parse_size("4G", &v), ECS_OK);
  assert_int_equal(v, 4ull << 30);
  assert_int_equal(ecs_parse_size("1.5", &v), ECS_EINVAL);
  assert_int_equal(ecs_parse_size("1.5B", &v), ECS_EINVAL);
  assert_int_equal(ecs_parse_size("1.G", &v), ECS_EINVAL);
  assert_int_equal(ecs_parse_size("1..5G", &v), ECS_EINVAL);
  assert_int_equal(ecs_parse_size(".5G", &v), ECS_EINVAL);
  assert_int_equal(ecs_parse_size("1.5.G", &v), ECS_EINVAL);
  assert_int_equal(ecs_parse_size("1.1234567891G", &v), ECS_EINVAL); /* 10 digits */
  assert_int_equal(ecs_parse_size("16777215.9T", &v), ECS_OK);
  assert_int_equal(ecs_parse_size("16777216T", &v), ECS_EINVAL); /* 2^64 */
  /* the server takes one and says the size it made */
  ecs_ts_proc_t srv = {0};
  assert_int_equal(
      ecs_ts_server_start(&srv, 1, (const char *const[]){"--redis", "none", "--pool-size", "1.5M", NULL}), 0);
  char server[32], out[OUT_CAP], bin[512];
  snprintf(server, sizeof server, "127.0.0.1:%d", srv.port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  char *argv[] = {bin, "--server", server, "--redis", "none", "--ns", "test", "stat", "--json", NULL};
  int st = run(argv, NULL, out, sizeof out);
  show("ecstore-cli stat --json", out);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "\"pool_size\": 1572864,"));
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
}

/* A Redis URL whose port is out of range: both programs name the port. */
static void test_redis_port_named(void **state) {
  (void)state;
  char out[OUT_CAP], bin[512];
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *srv[] = {bin,           "--listen", "127.0.0.1:0",  "--redis", "redis://127.0.0.1:99999",
                 "--pool-size", "8M",       "--shm-socket", "off",     NULL};
  int st = run(srv, NULL, out, sizeof out);
  show("ecstore-server --redis redis://127.0.0.1:99999", out);
  assert_int_equal(st, 2);
  assert_string_equal(out, "ecstore-server: --redis 'redis://127.0.0.1:99999': port 99999 of "
                           "'127.0.0.1:99999' is out of range (1..65535)\n");
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  char *cli[] = {bin, "--redis", "redis://127.0.0.1:99999", "stat", NULL};
  st = run(cli, NULL, out, sizeof out);
  show("ecstore-cli --redis redis://127.0.0.1:99999 stat", out);
  assert_int_equal(st, 2);
  assert_string_equal(out, "ecstore-cli: Redis URL 'redis://127.0.0.1:99999': port 99999 of "
                           "'127.0.0.1:99999' is out of range (1..65535)\n");
  /* a sentinel list: the bad one of the list, and never the password */
  char *cli2[] = {bin, "stat", NULL};
  char *env[] = {"ECSTORE_REDIS=redis-sentinel://u:pw@h1:26379,h2:x9/m", "ECSTORE_SERVERS=", NULL};
  st = run(cli2, env, out, sizeof out);
  show("ecstore-cli with a sentinel URL", out);
  assert_int_equal(st, 2);
  assert_non_null(strstr(out, "port 'x9' of 'h2:x9' is not a number"));
  assert_null(strstr(out, "pw"));
}

/* Servers found through Redis, and a namespace none of them serves: every
 * command says so, naming the namespace and the Redis, and fails (stat
 * used to print nothing and exit 0, ping to say pong). */
static void test_cli_wrong_ns(void **state) {
  (void)state;
  ecs_ts_proc_t redis = {0}, srv = {0};
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  assert_int_equal(ecs_ts_server_start(&srv, redis.port, NULL), 0); /* namespace 'test' */
  assert_true(log_wait(&srv, "registered with Redis", 5000));
  char redis_env[64], file[320], out[OUT_CAP], bin[512], want[256];
  snprintf(redis_env, sizeof redis_env, "ECSTORE_REDIS=127.0.0.1:%d", redis.port);
  char *env[] = {redis_env, "ECSTORE_SERVERS=", NULL};
  snprintf(file, sizeof file, "%s/in.bin", srv.dir);
  FILE *f = fopen(file, "wb");
  assert_non_null(f);
  fputs("0123456789abcdef", f);
  fclose(f);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  snprintf(want, sizeof want, "ecstore-cli: no servers registered in namespace 'tset' (Redis 127.0.0.1:%d)",
           redis.port);
  char *cmds[][8] = {{bin, "--ns", "tset", "stat", NULL},
                     {bin, "--ns", "tset", "stat", "--json", NULL},
                     {bin, "--ns", "tset", "ping", NULL},
                     {bin, "--ns", "tset", "put", "k", file, NULL},
                     {bin, "--ns", "tset", "get", "k", "-", NULL}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    int st = run(cmds[i], env, out, sizeof out);
    show(cmds[i][3], out);
    assert_int_equal(st, 1);
    assert_int_equal(lines_with(out, want), 1);
    assert_null(strstr(out, "pong"));
  }
  /* the right namespace works */
  char *ok[] = {bin, "--ns", "test", "ping", NULL};
  int st = run(ok, env, out, sizeof out);
  show("ping in namespace 'test'", out);
  assert_int_equal(st, 0);
  assert_string_equal(out, "pong\n");
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
  ecs_ts_stop(&redis, 5000);
}

/* ecstore-cli wait: ready once the server answers; a namespace refused
 * ends it at once; nobody there ends it at its limit, with the cause. */
static void test_cli_wait(void **state) {
  (void)state;
  char server[32], out[OUT_CAP], bin[512];
  int port = ecs_ts_free_port();
  snprintf(server, sizeof server, "127.0.0.1:%d", port);
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-cli"));
  char *none[] = {bin, "--server", server, "--redis", "none", "--ns", "test", "wait", "1", NULL};
  uint64_t t0 = ecs_now_ms();
  int st = run(none, NULL, out, sizeof out);
  show("ecstore-cli wait 1, nobody listening", out);
  assert_int_equal(st, 1);
  assert_true(ecs_now_ms() - t0 >= 900);
  char want[200];
  snprintf(want, sizeof want,
           "ecstore-cli: wait: not ready after 1 s: cannot connect to %s: connection refused", server);
  assert_int_equal(lines_with(out, want), 1);
  ecs_ts_proc_t srv = {0};
  srv.port = port;
  assert_int_equal(ecs_ts_server_start(&srv, 1, (const char *const[]){"--redis", "none", NULL}), 0);
  char *ok[] = {bin, "--server", server, "--redis", "none", "--ns", "test", "wait", NULL};
  st = run(ok, NULL, out, sizeof out);
  show("ecstore-cli wait", out);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "ready: 1 server answered in "));
  char *ns[] = {bin, "--server", server, "--redis", "none", "--ns", "other", "wait", "30", NULL};
  t0 = ecs_now_ms();
  st = run(ns, NULL, out, sizeof out);
  show("ecstore-cli wait, another namespace", out);
  assert_int_equal(st, 1);
  assert_true(ecs_now_ms() - t0 < 10000);
  assert_non_null(strstr(out, "refused the namespace 'other'"));
  char *bad[] = {bin, "wait", "soon", NULL};
  assert_int_equal(run(bad, NULL, out, sizeof out), 2);
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_port_in_use),
      cmocka_unit_test(test_failed_start_not_registered),
      cmocka_unit_test(test_protected_mode),
      cmocka_unit_test(test_hugepages_required_none_free),
      cmocka_unit_test(test_cli_server_not_running),
      cmocka_unit_test(test_ready_line),
      cmocka_unit_test(test_cli_with_redis_down),
      cmocka_unit_test(test_http_parse),
      cmocka_unit_test(test_metrics_scrape),
      cmocka_unit_test(test_config_hash_in_value),
      cmocka_unit_test(test_config_long_name),
      cmocka_unit_test(test_port_file_symlink),
      cmocka_unit_test(test_token_file_too_open),
      cmocka_unit_test(test_pool_over_memory),
      cmocka_unit_test(test_pool_size_decimal),
      cmocka_unit_test(test_redis_port_named),
      cmocka_unit_test(test_cli_wrong_ns),
      cmocka_unit_test(test_cli_wait),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
