/*
 * Fuzz target: the configuration parsers.
 *
 * Input: one byte that picks the parser, then its text:
 *   0  an ecstore-server --config file (store/core/parse.c ecs_conf_to_argv,
 *      read from a memfd as the server reads its file)
 *   1  a size ("4G", ecs_parse_size)
 *   2  a bounded integer (ecs_parse_int)
 *   3  a bounded double (ecs_parse_double)
 *   4  a Redis URL (store/redis/rds.c ecs__rds_parse_url)
 *   5  a connector JSON config (ec_connector/config.c
 *      ecs_ec_config_parse_json, then ecs__ec_config_check)
 *
 * Invariants: a config file becomes a NULL-terminated argv of "--name"
 * options, each followed by at most one value, none of them empty or
 * holding a newline or surrounding blanks, "true" and "false" never left
 * as values; a size, integer
 * or double that parses is within its bounds and prints back to the same
 * value; a Redis URL yields a NUL-terminated host and a port in 1..65535;
 * a connector config that parses holds NUL-terminated strings and values
 * within the bounds of its key table.
 */
#include <ctype.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ec_connector/conn_internal.h"
#include "ecstore/ec_connector.h"
#include "ecstore/error.h"
#include "store/core/parse.h"
#include "store/redis/rds.h"
#include "fuzz.h"

static void conf_file(const uint8_t *s, size_t n) {
  int fd = memfd_create("fuzz-conf", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(write(fd, s, n) == (ssize_t)n);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int argc = -1;
  char **argv = (char **)1;
  char err[256];
  int rc = ecs_conf_to_argv(path, &argc, &argv, err, sizeof err);
  close(fd);
  if (rc != ECS_OK) {
    FUZZ_CHECK(argc == 0 && argv == NULL && rc == ECS_EINVAL && strchr(err, ':') != NULL);
    return;
  }
  FUZZ_CHECK(argc >= 0 && (argc == 0 || argv != NULL));
  if (argc > 0)
    FUZZ_CHECK(argv[argc] == NULL);
  if (argc > 0) /* an option comes first, never a value */
    FUZZ_CHECK(strncmp(argv[0], "--", 2) == 0 && argv[0][2] != '\0' && argv[0][2] != '-');
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    size_t alen = strlen(a);
    FUZZ_CHECK(alen > 0 && strchr(a, '\n') == NULL);
    FUZZ_CHECK(!isspace((unsigned char)a[0]) && !isspace((unsigned char)a[alen - 1]));
    /* "name = true" is the option alone, "name = false" no option at all */
    FUZZ_CHECK(strcmp(a, "true") != 0 && strcmp(a, "false") != 0);
  }
  ecs_conf_free_argv(argc, argv);
}

static void size_text(const char *s) {
  uint64_t v;
  if (ecs_parse_size(s, &v) != ECS_OK)
    return;
  char back[32];
  snprintf(back, sizeof back, "%" PRIu64, v);
  uint64_t w;
  FUZZ_CHECK(ecs_parse_size(back, &w) == ECS_OK && w == v);
}

static void int_text(const char *s, long long lo, long long hi) {
  long long v;
  if (ecs_parse_int(s, lo, hi, &v) != ECS_OK)
    return;
  FUZZ_CHECK(v >= lo && v <= hi);
  char back[32];
  snprintf(back, sizeof back, "%lld", v);
  long long w;
  FUZZ_CHECK(ecs_parse_int(back, lo, hi, &w) == ECS_OK && w == v);
}

static void double_text(const char *s) {
  double v;
  if (ecs_parse_double(s, 0.0, 1.0, &v) != ECS_OK)
    return;
  FUZZ_CHECK(v >= 0.0 && v <= 1.0);
  char back[64];
  snprintf(back, sizeof back, "%.17g", v);
  double w;
  FUZZ_CHECK(ecs_parse_double(back, 0.0, 1.0, &w) == ECS_OK && w == v);
}

/* The whole URL (redis://, redis-cluster://, redis-sentinel://) survives
 * a format and a parse; a Redis Cluster redirection parses to a port and
 * a NUL-terminated host. */
static void redis_url_full(const char *s) {
  char h[64] = "kept";
  int p = 0;
  int k = ecs__rds_redirect(s, strlen(s), h, sizeof h, &p);
  FUZZ_CHECK(k >= 0 && k <= 2);
  if (k != 0)
    FUZZ_CHECK(memchr(h, '\0', sizeof h) != NULL && p >= 1 && p <= 65535);
  static ecs__rds_url_t u, u2;
  char out[1400];
  if (ecs__rds_url_parse(s, &u) != ECS_OK || ecs__rds_url_format(&u, 1, out, sizeof out) != ECS_OK)
    return;
  FUZZ_CHECK(ecs__rds_url_parse(out, &u2) == ECS_OK);
  FUZZ_CHECK(!strcmp(u.host, u2.host) && u.port == u2.port && u.db == u2.db && !strcmp(u.user, u2.user) &&
             !strcmp(u.pass, u2.pass) && !strcmp(u.sentinels, u2.sentinels) && !strcmp(u.master, u2.master) &&
             u.cluster == u2.cluster && !strcmp(u.suser, u2.suser) && !strcmp(u.spass, u2.spass) &&
             !strcmp(u.seeds, u2.seeds));
}

static void redis_url(const char *s) {
  char host[256];
  int port = -1, db = -1;
  memset(host, 'x', sizeof host);
  redis_url_full(s);
  if (ecs__rds_parse_url(s, host, sizeof host, &port, &db) != ECS_OK)
    return;
  FUZZ_CHECK(memchr(host, '\0', sizeof host) != NULL && host[0] != '\0');
  FUZZ_CHECK(port >= 1 && port <= 65535 && db >= 0 && db <= 1000000);
}

#define STR_OK(field) FUZZ_CHECK(memchr(cfg.field, '\0', sizeof cfg.field) != NULL)

static void connector_json(const char *s, size_t n) {
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  char err[300];
  if (ecs_ec_config_parse_json(&cfg, s, n, err, sizeof err) != ECS_OK) {
    FUZZ_CHECK(err[0] != '\0');
    return;
  }
  STR_OK(servers);
  STR_OK(redis_url);
  STR_OK(ns);
  STR_OK(auth_token);
  STR_OK(protocol);
  STR_OK(device);
  STR_OK(compression);
  STR_OK(disk_path);
  FUZZ_CHECK(cfg.backend >= ECS_EC_BACKEND_ECSTORE && cfg.backend <= ECS_EC_BACKEND_REDIS);
  FUZZ_CHECK(cfg.rdma_port >= 1 && cfg.rdma_port <= 255);
  FUZZ_CHECK(cfg.timeout_ms >= 1 && cfg.batch_size >= 1 && cfg.batch_size <= 4096);
  FUZZ_CHECK(cfg.staging_bytes >= (1u << 16) && cfg.staging_bytes <= (1ull << 40));
  (void)ecs__ec_config_check(&cfg, err, sizeof err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  /* the text parsers take C strings: a NUL-terminated copy */
  char *s = malloc(size);
  FUZZ_CHECK(s != NULL);
  memcpy(s, data + 1, size - 1);
  s[size - 1] = '\0';
  switch (data[0] % 6) {
  case 0: conf_file(data + 1, size - 1); break;
  case 1: size_text(s); break;
  case 2:
    int_text(s, 0, 65535);
    int_text(s, -1000, 1000);
    break;
  case 3: double_text(s); break;
  case 4: redis_url(s); break;
  case 5:
    if (size > 1)
      connector_json(s, size - 1);
    break;
  }
  free(s);
  return 0;
}
