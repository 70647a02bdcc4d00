/*
 * test_bad_input: bad input to ecstore-server is refused at start with a
 * message naming the flag and the fix (issue 23).  Before, each of these
 * was accepted silently or wrongly: a 1 GiB pool for --pool-size 16M
 * --min-block 1G, a --port-file path written cut at 511 bytes, a --config
 * file holding a Redis password at mode 0644, --ns 'a b', a --node-id
 * with a newline, a --shm-allow-uid list cut at 255 bytes (1001 could
 * become 100); and unclear: "invalid argument" for a Redis user without a
 * password, "a password on the command line" for %00 in the user part.
 * Each case runs the real binary (under a 5 s timeout: a server that
 * starts instead of refusing is the failure).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/ts.h"

static char g_dir[256];

/* Runs the server with args (a shell fragment); its exit status (124: it
 * ran until the timeout), its output in out. */
static int run(const char *args, char *out, size_t cap) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "env -u ECSTORE_REDIS_PASSWORD timeout 5 '%s' --redis none %s 2>&1",
           ecs_ts_bin("ecstore-server"), args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The server refuses args at start, saying each of the needles. */
static void refused(const char *args, const char *n1, const char *n2) {
  static char out[8192];
  int st = run(args, out, sizeof out);
  if (st == 0 || st == 124 || !strstr(out, n1) || (n2 && !strstr(out, n2)))
    fail_msg("'%.200s': status %d, output:\n%s", args, st, out);
}

static void test_min_block_over_pool(void **state) {
  (void)state;
  refused("--listen 127.0.0.1:0 --pool-size 16M --min-block 1G", "--min-block", "--pool-size");
}

static void test_port_file_too_long(void **state) {
  (void)state;
  char args[1024];
  int n = snprintf(args, sizeof args, "--listen 127.0.0.1:0 --pool-size 16M --port-file %s/", g_dir);
  memset(args + n, 'p', 600);
  args[n + 600] = '\0';
  refused(args, "--port-file", "1..511 bytes");
}

static void test_names_with_spaces_or_newlines(void **state) {
  (void)state;
  refused("--listen 127.0.0.1:0 --pool-size 16M --ns 'a b'", "--ns", "no spaces");
  refused("--listen 127.0.0.1:0 --pool-size 16M --node-id \"$(printf 'a\\nb')\"", "--node-id", "newlines");
}

static void test_uid_list_too_long(void **state) {
  (void)state;
  char args[1024] = "--listen 127.0.0.1:0 --pool-size 16M --shm-allow-uid ";
  for (int i = 0; i < 60; i++)
    strcat(args, i ? ",1001" : "1001"); /* 299 bytes */
  refused(args, "--shm-allow-uid", "longer than 255 bytes");
}

/* A config file with a Redis password in its URL: refused at 0644 with
 * the chmod; at 0600 the server starts (and runs until the timeout). */
static void test_config_with_password_private(void **state) {
  (void)state;
  char path[300], args[512];
  snprintf(path, sizeof path, "%s/server.conf", g_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "redis = redis://:s3cret-pw@127.0.0.1:1\nlisten = 127.0.0.1:0\npool-size = 16M\n");
  fclose(f);
  assert_int_equal(chmod(path, 0644), 0);
  snprintf(args, sizeof args, "--config '%s'", path);
  refused(args, "holds a Redis password", "chmod 600");
  static char out[8192];
  assert_int_equal(run(args, out, sizeof out), 2);
  assert_null(strstr(out, "s3cret-pw")); /* the message names the file, never the password */
  assert_int_equal(chmod(path, 0600), 0);
  int st = run(args, out, sizeof out);
  if (st != 124)
    fail_msg("at 0600: status %d, output:\n%s", st, out);
  assert_null(strstr(out, "s3cret-pw")); /* never logged */
  unlink(path);
}

static void test_redis_url_messages(void **state) {
  (void)state;
  refused("--listen 127.0.0.1:0 --pool-size 16M --redis redis://u@127.0.0.1:1",
          "names user 'u' but no password", NULL);
  refused("--listen 127.0.0.1:0 --pool-size 16M --redis 'redis://u%00x@127.0.0.1:1'", "does not parse",
          "%00 would put a NUL byte");
}

static int setup(void **state) {
  (void)state;
  return ecs_ts_mkdtemp(g_dir, sizeof g_dir);
}

static int teardown(void **state) {
  (void)state;
  rmdir(g_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_min_block_over_pool),           cmocka_unit_test(test_port_file_too_long),
      cmocka_unit_test(test_names_with_spaces_or_newlines), cmocka_unit_test(test_uid_list_too_long),
      cmocka_unit_test(test_config_with_password_private),  cmocka_unit_test(test_redis_url_messages),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
