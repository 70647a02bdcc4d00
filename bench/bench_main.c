/* ecstore-bench: dispatches to one benchmark per subcommand. */
#include "bench.h"

#include <stdio.h>
#include <string.h>

static const struct {
  const char *name;
  ecs_bench_fn fn;
  const char *help;
} cmds[] = {
    {"net", ecs_bench_net, "ecstore put/get over loopback TCP vs a raw socket stream and Redis"},
    {"pool", ecs_bench_pool, "buddy pool alloc/free vs glibc malloc, and a FIFO eviction workload"},
    {"compare", ecs_bench_compare,
     "every ecstore path next to Redis, memcached, files, raw TCP and memcpy; scaling; CSV"},
    {"shmcopy", ecs_bench_shmcopy, "shm copy gets vs memcpy, run after run, against a running server"},
    {"codec", ecs_bench_codec, "lz4/zstd ratio and speed, with and without byte shuffle, vs memcpy"},
    {"frozen", ecs_bench_frozen,
     "the slowest get while Redis is frozen (SIGSTOP), next to a normal run's p99"},
};

static void usage(FILE *f) {
  fprintf(
      f, "usage: ecstore-bench SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n\nsubcommands:\n");
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name))
      return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "ecstore-bench: unknown subcommand '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
