/*
 * Unit tests of the connector's strict JSON parser and of the config keys
 * built on it (no processes, no sockets).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ec_connector/json.h"
#include "ecstore/ec_connector.h"

static ecs_json_t *parse_ok(const char *s) {
  ecs_json_t *j = NULL;
  char err[200] = "";
  int rc = ecs__json_parse(s, strlen(s), &j, err, sizeof err);
  if (rc != ECS_OK)
    fprintf(stderr, "unexpected error for %s: %s\n", s, err);
  assert_int_equal(rc, ECS_OK);
  assert_non_null(j);
  return j;
}

/* Parses s, expects a failure whose message contains want. */
static void parse_bad(const char *s, size_t len, const char *want) {
  ecs_json_t *j = (ecs_json_t *)1;
  char err[200] = "";
  int rc = ecs__json_parse(s, len, &j, err, sizeof err);
  if (rc == ECS_OK || strstr(err, want) == NULL)
    fprintf(stderr, "input <%.*s>: rc %d, err \"%s\", wanted \"%s\"\n", (int)len, s, rc, err, want);
  assert_int_equal(rc, ECS_EINVAL);
  assert_null(j);
  assert_non_null(strstr(err, want));
}

static void test_values(void **state) {
  (void)state;
  ecs_json_t *j =
      parse_ok(" { \"a\" : [1, -2.5e3, 0, true, false, null, \"x\", {}, []], \"b\": {\"c\": -0} } ");
  assert_int_equal(j->type, ECS_JSON_OBJECT);
  assert_int_equal(j->count, 2);
  const ecs_json_t *a = ecs__json_get(j, "a");
  assert_non_null(a);
  assert_int_equal(a->type, ECS_JSON_ARRAY);
  assert_int_equal(a->count, 9);
  const ecs_json_t *e = a->child;
  assert_true(e->is_int && e->integer == 1);
  e = e->next;
  assert_false(e->is_int);
  assert_true(e->number == -2500.0);
  e = e->next;
  assert_true(e->is_int && e->integer == 0);
  e = e->next;
  assert_true(e->type == ECS_JSON_BOOL && e->boolean == 1);
  e = e->next;
  assert_true(e->type == ECS_JSON_BOOL && e->boolean == 0);
  e = e->next;
  assert_int_equal(e->type, ECS_JSON_NULL);
  e = e->next;
  assert_string_equal(e->str, "x");
  e = e->next;
  assert_true(e->type == ECS_JSON_OBJECT && e->count == 0);
  e = e->next;
  assert_true(e->type == ECS_JSON_ARRAY && e->count == 0);
  assert_null(e->next);
  assert_null(ecs__json_get(j, "zz"));
  assert_true(ecs__json_get(ecs__json_get(j, "b"), "c")->is_int);
  ecs__json_free(j);

  /* scalars at top level, big integers */
  j = parse_ok("9223372036854775807");
  assert_true(j->is_int && j->integer == 9223372036854775807LL);
  ecs__json_free(j);
  j = parse_ok("92233720368547758070"); /* too big for long long: a double */
  assert_false(j->is_int);
  ecs__json_free(j);
  ecs__json_free(NULL);
}

static void test_strings(void **state) {
  (void)state;
  ecs_json_t *j = parse_ok("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20ac\\ud83d\\ude00\"");
  const char want[] = "a\"b\\c/d\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  assert_int_equal(j->len, sizeof want - 1);
  assert_memory_equal(j->str, want, sizeof want - 1);
  ecs__json_free(j);
  /* \u0000 is kept, with its length */
  j = parse_ok("\"a\\u0000b\"");
  assert_int_equal(j->len, 3);
  ecs__json_free(j);
  /* raw UTF-8 passes */
  j = parse_ok("\"caf\xc3\xa9\"");
  assert_int_equal(j->len, 5);
  ecs__json_free(j);
}

static void test_errors(void **state) {
  (void)state;
  parse_bad("", 0, "unexpected end");
  parse_bad("{", 1, "expected a string key");
  parse_bad("{\"a\" 1}", 7, "expected ':'");
  parse_bad("{\"a\":1,}", 8, "trailing comma");
  parse_bad("[1,]", 4, "trailing comma");
  parse_bad("[1 2]", 5, "expected ','");
  parse_bad("{\"a\":1,\"a\":2}", 13, "duplicate key");
  parse_bad("01", 2, "leading zero");
  parse_bad("1.", 2, "digit after '.'");
  parse_bad("1e", 2, "exponent");
  parse_bad("-", 1, "expected a digit");
  parse_bad("+1", 2, "unexpected character");
  parse_bad("tru", 3, "unexpected character");
  parse_bad("nul", 3, "unexpected character");
  parse_bad("1 2", 3, "after the value");
  parse_bad("\"abc", 4, "unterminated string");
  parse_bad("\"a\nb\"", 5, "control character");
  parse_bad("\"\\x\"", 4, "invalid escape");
  parse_bad("\"\\u12zz\"", 8, "hex digit");
  parse_bad("\"\\u12\"", 6, "truncated");
  parse_bad("\"\\ud800\"", 8, "high surrogate");
  parse_bad("\"\\udc00\"", 8, "low surrogate");
  parse_bad("\"\xc3\x28\"", 4, "UTF-8");
  parse_bad("\"\xc0\xaf\"", 4, "UTF-8");     /* overlong */
  parse_bad("\"\xed\xa0\x80\"", 5, "UTF-8"); /* encoded surrogate */
  parse_bad("// c\n{}", 7, "unexpected character");
  parse_bad("1e999", 5, "out of range");
  /* an embedded NUL is junk, not the end of input */
  parse_bad("{}\0{}", 5, "after the value");
  /* the offset is in the message */
  parse_bad("{\"a\": [1, 2, x]}", 16, "offset 13");
}

static void test_limits(void **state) {
  (void)state;
  char deep[200];
  size_t n = 0;
  for (int i = 0; i < ECS_JSON_MAX_DEPTH; i++)
    deep[n++] = '[';
  for (int i = 0; i < ECS_JSON_MAX_DEPTH; i++)
    deep[n++] = ']';
  deep[n] = '\0';
  ecs__json_free(parse_ok(deep));
  n = 0;
  for (int i = 0; i < ECS_JSON_MAX_DEPTH + 1; i++)
    deep[n++] = '[';
  for (int i = 0; i < ECS_JSON_MAX_DEPTH + 1; i++)
    deep[n++] = ']';
  parse_bad(deep, n, "nesting deeper");
  /* 100k unclosed brackets: refused at the depth bound, no stack overflow */
  size_t big = 100000;
  char *b = malloc(big);
  memset(b, '[', big);
  parse_bad(b, big, "nesting deeper");
  free(b);
  /* input size bound */
  size_t huge = ECS_JSON_MAX_INPUT + 1;
  char *h = malloc(huge);
  memset(h, ' ', huge);
  h[0] = '1';
  parse_bad(h, huge, "exceeds");
  free(h);
}

/* ------------------------------------------------------------------ */
/* config                                                               */

static void cfg_bad(const char *json, const char *want) {
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  char err[300] = "";
  int rc = ecs_ec_config_parse_json(&cfg, json, 0, err, sizeof err);
  if (rc == ECS_OK || strstr(err, want) == NULL)
    fprintf(stderr, "config %s: rc %d err \"%s\", wanted \"%s\"\n", json, rc, err, want);
  assert_int_equal(rc, ECS_EINVAL);
  assert_non_null(strstr(err, want));
}

static void test_config_defaults_and_keys(void **state) {
  (void)state;
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  assert_int_equal(cfg.backend, ECS_EC_BACKEND_ECSTORE);
  assert_string_equal(cfg.protocol, "auto");
  assert_string_equal(cfg.ns, "default");
  assert_int_equal(cfg.queue_depth, 256);
  assert_int_equal(cfg.staging_bytes, 64ull << 20);
  assert_string_equal(cfg.servers, ""); /* the servers come from redis_url's registry */
  assert_string_equal(cfg.placement, "hash");
  char err[300];
  assert_int_equal(ecs_ec_config_parse_json(&cfg, "{\"placement\": \"least-loaded\"}", 0, err, sizeof err),
                   ECS_OK);
  assert_string_equal(cfg.placement, "least-loaded");
  assert_int_equal(ecs_ec_config_parse_json(&cfg, "{\"placement\": \"nearest\"}", 0, err, sizeof err),
                   ECS_EINVAL);
  assert_non_null(strstr(err, "placement"));
  ecs_ec_config_init(&cfg);
  const char *js =
      "{\"backend\": \"redis\", \"servers\": [\"10.0.0.1:7700\", \"10.0.0.2:7700\"],"
      " \"redis_url\": \"redis://127.0.0.1:6379/2\", \"namespace\": \"qwen\", \"protocol\": \"tcp\","
      " \"device\": \"mlx5_0\", \"rdma_port\": 2, \"compression\": \"lz4\", \"timeout_ms\": 1500,"
      " \"connect_timeout_ms\": 300, \"save_timeout_ms\": 0, \"verify_checksum\": false,"
      " \"staging_bytes\": \"16M\", \"queue_depth\": 8, \"batch_size\": 4, \"disk_path\": \"/tmp/x\","
      " \"disk_fsync\": true, \"redis_ttl_s\": 60, \"kv_ttl_s\": 30, \"lookup_retries\": 2,"
      " \"retry_backoff_ms\": 5, \"auth_token\": null, \"rdma_gid_index\": 3}";
  assert_int_equal(ecs_ec_config_parse_json(&cfg, js, 0, err, sizeof err), ECS_OK);
  assert_int_equal(cfg.backend, ECS_EC_BACKEND_REDIS);
  assert_string_equal(cfg.servers, "10.0.0.1:7700,10.0.0.2:7700");
  assert_string_equal(cfg.redis_url, "redis://127.0.0.1:6379/2");
  assert_string_equal(cfg.ns, "qwen");
  assert_string_equal(cfg.protocol, "tcp");
  assert_string_equal(cfg.device, "mlx5_0");
  assert_int_equal(cfg.rdma_port, 2);
  assert_int_equal(cfg.rdma_gid_index, 3);
  assert_string_equal(cfg.compression, "lz4");
  assert_int_equal(cfg.timeout_ms, 1500);
  assert_int_equal(cfg.connect_timeout_ms, 300);
  assert_int_equal(cfg.save_timeout_ms, 0);
  assert_int_equal(cfg.verify_checksum, 0);
  assert_int_equal(cfg.staging_bytes, 16u << 20);
  assert_int_equal(cfg.queue_depth, 8);
  assert_int_equal(cfg.batch_size, 4);
  assert_string_equal(cfg.disk_path, "/tmp/x");
  assert_int_equal(cfg.disk_fsync, 1);
  assert_int_equal(cfg.redis_ttl_s, 60);
  assert_int_equal(cfg.kv_ttl_s, 30);
  assert_int_equal(cfg.lookup_retries, 2);
  assert_int_equal(cfg.retry_backoff_ms, 5);
  assert_string_equal(cfg.auth_token, ""); /* null keeps the default */
  /* a number for a size */
  assert_int_equal(ecs_ec_config_parse_json(&cfg, "{\"staging_bytes\": 1048576}", 0, err, sizeof err),
                   ECS_OK);
  assert_int_equal(cfg.staging_bytes, 1048576);
  /* an empty object changes nothing */
  assert_int_equal(ecs_ec_config_parse_json(&cfg, "{}", 0, err, sizeof err), ECS_OK);
  assert_string_equal(ecs_ec_backend_name(ECS_EC_BACKEND_DISK), "disk");
}

static void test_config_errors(void **state) {
  (void)state;
  cfg_bad("{\"backnd\": \"disk\"}", "unknown key \"backnd\"");
  cfg_bad("{\"backend\": \"s3\"}", "key \"backend\": expected one of ecstore|disk|redis");
  cfg_bad("{\"protocol\": \"udp\"}", "key \"protocol\": expected one of auto|tcp|shm|rdma");
  cfg_bad("{\"compression\": 1}", "key \"compression\"");
  cfg_bad("{\"timeout_ms\": \"10\"}", "key \"timeout_ms\": expected an integer");
  cfg_bad("{\"timeout_ms\": 0}", "key \"timeout_ms\": expected an integer in 1..");
  cfg_bad("{\"queue_depth\": 1.5}", "key \"queue_depth\"");
  cfg_bad("{\"batch_size\": -1}", "key \"batch_size\"");
  cfg_bad("{\"verify_checksum\": 1}", "key \"verify_checksum\": expected true or false");
  cfg_bad("{\"staging_bytes\": \"lots\"}", "key \"staging_bytes\"");
  cfg_bad("{\"staging_bytes\": 100}", "key \"staging_bytes\": 100 is outside");
  cfg_bad("{\"servers\": []}", "key \"servers\": empty list");
  cfg_bad("{\"servers\": [\"a:1\", 2]}", "key \"servers\"");
  cfg_bad("{\"servers\": 7}", "key \"servers\"");
  cfg_bad("{\"namespace\": \"a\\u0000b\"}", "key \"namespace\": string holds a NUL");
  char longns[400];
  snprintf(longns, sizeof longns, "{\"namespace\": \"%0200d\"}", 0);
  cfg_bad(longns, "key \"namespace\": longer than");
  cfg_bad("[1]", "must be an object");
  cfg_bad("{\"timeout_ms\": 10,}", "JSON syntax: offset");
  cfg_bad("{\"a\": 1, \"a\": 2}", "duplicate key");
}

static void test_config_file_and_open_checks(void **state) {
  (void)state;
  char path[] = "/tmp/ecs-conn-cfg-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *js = "{\n  \"backend\": \"disk\",\n  \"disk_path\": \"/tmp/x\",\n  \"bogus\": 1\n}\n";
  assert_int_equal(write(fd, js, strlen(js)), (ssize_t)strlen(js));
  close(fd);
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  char err[400];
  assert_int_equal(ecs_ec_config_load_file(&cfg, path, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "unknown key \"bogus\""));
  unlink(path);
  assert_true(ecs_ec_config_load_file(&cfg, "/nonexistent/ecs.json", err, sizeof err) < 0);
  assert_non_null(strstr(err, "/nonexistent/ecs.json"));

  /* open refuses incomplete configs with the key named, before any I/O */
  ecs_ec_conn_t *c = (ecs_ec_conn_t *)1;
  assert_int_equal(ecs_ec_open_json("{\"backend\": \"disk\"}", &c, err, sizeof err), ECS_EINVAL);
  assert_null(c);
  assert_non_null(strstr(err, "disk_path"));
  assert_int_equal(ecs_ec_open_json("{\"backend\": \"redis\"}", &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "redis_url"));
  assert_int_equal(
      ecs_ec_open_json("{\"backend\": \"ecstore\", \"servers\": \"127.0.0.1:1\"}", &c, err, sizeof err),
      ECS_EINVAL);
  assert_non_null(strstr(err, "redis_url"));
  assert_int_equal(ecs_ec_open_json("{\"queue_depth\": 0}", &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "queue_depth"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_config_defaults_and_keys),
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_config_file_and_open_checks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
