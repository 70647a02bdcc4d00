/* Timing, statistics and parsing helpers shared by the benchmarks. */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

uint64_t ecs_bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double ecs_bench_percentile(double *v, size_t n, double p) {
  if (n == 0)
    return 0.0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
  if (rank < 1)
    rank = 1;
  if (rank > n)
    rank = n;
  return v[rank - 1];
}

double ecs_bench_median(double *v, size_t n) {
  if (n == 0)
    return 0.0;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int ecs_bench_parse_size(const char *s, size_t *out) {
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s)
    return -1;
  unsigned long long mul = 1;
  switch (*end) {
  case '\0': break;
  case 'k':
  case 'K':
    mul = 1ull << 10;
    end++;
    break;
  case 'm':
  case 'M':
    mul = 1ull << 20;
    end++;
    break;
  case 'g':
  case 'G':
    mul = 1ull << 30;
    end++;
    break;
  default: return -1;
  }
  if (*end == 'i' || *end == 'B')
    end++;
  if (*end == 'B')
    end++;
  if (*end != '\0' || (mul > 1 && v > (~0ull) / mul))
    return -1;
  *out = (size_t)(v * mul);
  return 0;
}

int ecs_bench_parse_size_list(const char *s, size_t *out, int *n, int cap) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  char *save;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*n == cap || ecs_bench_parse_size(t, &out[*n]) || out[*n] == 0)
      return -1;
    (*n)++;
  }
  return *n ? 0 : -1;
}

int ecs_bench_parse_int_list(const char *s, int *out, int *n, int cap, int max) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  char *save;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char *end;
    long v = strtol(t, &end, 10);
    if (*n == cap || *end != '\0' || v < 1 || v > max)
      return -1;
    out[(*n)++] = (int)v;
  }
  return *n ? 0 : -1;
}

/* The CPU's model name from /proc/cpuinfo, or "?". */
static void cpu_model(char *out, size_t cap) {
  snprintf(out, cap, "?");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon) {
      colon += 1 + (colon[1] == ' ');
      colon[strcspn(colon, "\n")] = '\0';
      snprintf(out, cap, "%s", colon);
      break;
    }
  }
  fclose(f);
}

void ecs_bench_machine(char *out, size_t cap) {
  struct sysinfo si;
  char date[32] = "?", cpu[128];
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm))
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
  double gib = 0;
  if (sysinfo(&si) == 0)
    gib = (double)si.totalram * si.mem_unit / (1024.0 * 1024 * 1024);
  cpu_model(cpu, sizeof cpu);
  snprintf(out, cap, "%ld cores (%s), %.1f GiB memory; %s", sysconf(_SC_NPROCESSORS_ONLN), cpu, gib, date);
}

void ecs_bench_print_machine(void) {
  char m[256];
  ecs_bench_machine(m, sizeof m);
  printf("# machine: %s\n", m);
}
