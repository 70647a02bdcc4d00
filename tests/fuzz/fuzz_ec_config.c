/*
 * Fuzz target: the connector's JSON config (ec_connector/config.c), the
 * file a vLLM deployment hands every encoder and worker.
 *
 * Input: the JSON text, parsed by ecs_ec_config_parse_json and, when it
 * parses, checked by ecs__ec_config_check; the same text written to a
 * memfd and read by ecs_ec_config_load_file (the path the connector
 * takes).
 *
 * Invariants: a config that parses holds NUL-terminated strings and values
 * within the bounds of its key table; parsing is deterministic (the same
 * text twice gives the same config, byte for byte) and loading it from a
 * file gives what parsing it gave; a refusal says why; the value of
 * "auth_token" never appears in an error message (the token is a secret).
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ec_connector/conn_internal.h"
#include "ecstore/ec_connector.h"
#include "ecstore/error.h"
#include "fuzz.h"

#define STR_OK(c, field) FUZZ_CHECK(memchr((c).field, '\0', sizeof(c).field) != NULL)

static ecs_ec_config_t a, b, f;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[300], err2[300];
  if (size == 0)
    return 0; /* len 0 means "strlen(json)" (ec_connector.h): not a 0-byte text */
  const char *s = (const char *)data;
  ecs_ec_config_init(&a);
  ecs_ec_config_init(&b);
  int rc = ecs_ec_config_parse_json(&a, s, size, err, sizeof err);
  int rc2 = ecs_ec_config_parse_json(&b, s, size, err2, sizeof err2);
  FUZZ_CHECK(rc == rc2);
  if (rc != ECS_OK) {
    FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
    FUZZ_CHECK(strcmp(err, err2) == 0);
    return 0;
  }
  FUZZ_CHECK(memcmp(&a, &b, sizeof a) == 0);
  STR_OK(a, servers);
  STR_OK(a, redis_url);
  STR_OK(a, ns);
  STR_OK(a, auth_token);
  STR_OK(a, protocol);
  STR_OK(a, device);
  STR_OK(a, compression);
  STR_OK(a, disk_path);
  STR_OK(a, redis_password_file);
  FUZZ_CHECK(a.backend >= ECS_EC_BACKEND_ECSTORE && a.backend <= ECS_EC_BACKEND_REDIS);
  FUZZ_CHECK(a.rdma_port >= 1 && a.rdma_port <= 255);
  FUZZ_CHECK(a.timeout_ms >= 1 && a.batch_size >= 1 && a.batch_size <= 4096);
  FUZZ_CHECK(a.staging_bytes >= (1u << 16) && a.staging_bytes <= (1ull << 40));
  err[0] = '\0';
  if (ecs__ec_config_check(&a, err, sizeof err) != ECS_OK) {
    FUZZ_CHECK(err[0] != '\0');
    if (strlen(a.auth_token) >= 8)
      FUZZ_CHECK(strstr(err, a.auth_token) == NULL);
  }
  /* from a file, as the connector reads it: the same config */
  int fd = memfd_create("fuzz-ec-config", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(write(fd, data, size) == (ssize_t)size);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ecs_ec_config_init(&f);
  int frc = ecs_ec_config_load_file(&f, path, err, sizeof err);
  close(fd);
  FUZZ_CHECK(frc == ECS_OK);
  FUZZ_CHECK(memcmp(&a, &f, sizeof a) == 0);
  return 0;
}
