/*
 * Shared helpers of ecstore-bench.  Benchmarks measure; they never assert.
 * Every figure is printed next to a baseline measured in the same run.
 */
#ifndef ECS_BENCH_H
#define ECS_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* A subcommand: argv[0] is the subcommand's name.  Returns an exit status. */
typedef int (*ecs_bench_fn)(int argc, char **argv);

/* Monotonic clock in nanoseconds. */
uint64_t ecs_bench_now_ns(void);

/* Median of n doubles (sorts the array in place).  0 when n == 0. */
double ecs_bench_median(double *v, size_t n);

/* The p-th percentile (0..100) of n doubles, nearest rank (sorts in place). */
double ecs_bench_percentile(double *v, size_t n, double p);

/* Parses "4K", "16M", "2G", "123" into bytes.  Returns 0 or -1. */
int ecs_bench_parse_size(const char *s, size_t *out);

/* Comma lists for the command lines: "64K,1M" into at most cap sizes
 * (each > 0), "1,8,32" into at most cap ints in 1..max.  *n gets the
 * count.  Returns 0, or -1 for an empty, too long or bad list. */
int ecs_bench_parse_size_list(const char *s, size_t *out, int *n, int cap);
int ecs_bench_parse_int_list(const char *s, int *out, int *n, int cap, int max);

/* One line naming the machine (cores, CPU, memory) and the date, for
 * headers: into out, or printed as "# machine: ..." on stdout. */
void ecs_bench_machine(char *out, size_t cap);
void ecs_bench_print_machine(void);

/* Subcommands (one per bench_*.c file). */
int ecs_bench_pool(int argc, char **argv);
int ecs_bench_net(int argc, char **argv);
int ecs_bench_codec(int argc, char **argv);
int ecs_bench_compare(int argc, char **argv);
int ecs_bench_shmcopy(int argc, char **argv);
int ecs_bench_frozen(int argc, char **argv);

#endif
