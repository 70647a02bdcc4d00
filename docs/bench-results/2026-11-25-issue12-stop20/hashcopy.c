/* xxh3 (ecs_checksum) of 64 KiB in cache and from DRAM, and a 64 KiB memcpy from DRAM.
 * gcc -O2 -I../../../include hashcopy.c -L../../../build/lib -lecstore -o /tmp/hashcopy */
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
int main(void) {
  size_t n = 65536;
  char *b = malloc(n);
  memset(b, 7, n);
  volatile unsigned long long s = 0;
  for (int r = 0; r < 3; r++) {
    double t0 = now();
    for (int i = 0; i < 20000; i++)
      s += ecs_checksum(b, n);
    double dt = now() - t0;
    printf("64K in cache: %.2f us, %.1f GB/s\n", dt / 20000 * 1e6, 20000.0 * n / dt / 1e9);
  }
  size_t N = 256u << 20;
  char *B = malloc(N);
  memset(B, 1, N);
  char *D = malloc(N);
  memset(D, 2, N);
  for (int r = 0; r < 3; r++) {
    double t0 = now();
    for (size_t o = 0; o < N; o += n)
      s += ecs_checksum(B + o, n);
    double dt = now() - t0;
    printf("64K from DRAM: %.2f us\n", dt / (N / n) * 1e6);
  }
  for (int r = 0; r < 3; r++) {
    double t0 = now();
    for (size_t o = 0; o < N; o += n)
      memcpy(D + o, B + o, n);
    double dt = now() - t0;
    printf("memcpy 64K DRAM: %.2f us\n", dt / (N / n) * 1e6);
  }
  return 0;
}
