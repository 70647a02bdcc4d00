#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ecstore/ecstore.h"
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = argv[1];
  cfg.transport = getenv("TR") ? getenv("TR") : "tcp"; /* TR=shm: added for stop 20 */
  cfg.verify_checksum = 1;
  cfg.ns = "test";
  cfg.timeout_ms = 10000;
  double secs = atof(argv[2]);
  ecs_client_t *c = NULL;
  char err[256];
  if (ecs_client_connect(&cfg, &c, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  enum { B = 32 };
  size_t sz = 65536;
  static char names[B][80];
  ecs_key_t keys[B];
  ecs_tensor_t ts[B];
  int st[B];
  char *src = malloc(sz);
  memset(src, 0x3c, sz);
  memset(ts, 0, sizeof ts);
  for (int i = 0; i < B; i++) {
    keys[i].data = names[i];
    ts[i].data = src;
    ts[i].nbytes = sz;
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = sz;
  }
  double t0 = now();
  long n = 0;
  while (now() - t0 < secs) {
    for (int i = 0; i < B; i++) {
      snprintf(names[i], 80, "pl-%ld-%d", n, i);
      keys[i].len = strlen(names[i]);
    }
    int rc = ecs_put_batch(c, keys, ts, B, st);
    if (rc) {
      fprintf(stderr, "rc %d\n", rc);
      return 1;
    }
    for (int i = 0; i < B; i++)
      if (st[i]) {
        fprintf(stderr, "st %d\n", st[i]);
        return 1;
      }
    n++;
  }
  double dt = now() - t0;
  printf("%.1f kobj/s\n", n * B / dt / 1e3);
  ecs_client_close(c);
  return 0;
}
