/*
 * Before the pool is made: does it fit in the memory this host (and this
 * process's cgroup) has?  A pool larger than that is not refused by mmap:
 * the memfd mapping is made lazily, and the populate threads then fault in
 * page after page until the kernel's OOM killer ends the server half-way,
 * with no message.  So the size is compared first, and a pool that cannot
 * fit is refused with the numbers and the --pool-size that would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ecstore/error.h"
#include "store/core/log.h"
#include "store/server/server_internal.h"

unsigned long long ecs__meminfo(const char *name) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  unsigned long long v = 0;
  size_t n = strlen(name);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, name, n) && line[n] == ':') {
      v = strtoull(line + n + 1, NULL, 10);
      break;
    }
  if (f)
    fclose(f);
  return v;
}

/* Whether this process may lock memory beyond RLIMIT_MEMLOCK
 * (CAP_IPC_LOCK, bit 14 of CapEff in /proc/self/status). */
static int has_ipc_lock(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long cap = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "CapEff:", 7)) {
      cap = strtoull(line + 7, NULL, 16);
      break;
    }
  if (f)
    fclose(f);
  return (cap >> 14) & 1;
}

/* Reads one number from a cgroup file; 0 when absent, "max" (v2) or
 * unlimited (v1 shows a number near 2^63). */
static unsigned long long cg_value(const char *dir, const char *file) {
  char path[600], buf[64];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  unsigned long long v = 0;
  if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0)
    v = strtoull(buf, NULL, 10);
  fclose(f);
  return v >= (1ull << 62) ? 0 : v;
}

/* One "NAME N" line of a cgroup's memory.stat; 0 when absent. */
static unsigned long long cg_stat(const char *dir, const char *name) {
  char path[600], line[128];
  snprintf(path, sizeof path, "%s/memory.stat", dir);
  FILE *f = fopen(path, "r");
  unsigned long long v = 0;
  size_t n = strlen(name);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, name, n) && line[n] == ' ') {
      v = strtoull(line + n + 1, NULL, 10);
      break;
    }
  if (f)
    fclose(f);
  return v;
}

/* Room left under this process's cgroup memory limit (bytes), or 0 when
 * there is none: cgroup v2's memory.max, else v1's memory.limit_in_bytes.
 * The usage counts the page cache, which the kernel reclaims before it
 * kills: what cannot be reclaimed is the usage less the file pages that
 * are not shmem (a memfd pool is shmem). */
static unsigned long long cgroup_room(unsigned long long *limit_out) {
  *limit_out = 0;
  FILE *f = fopen("/proc/self/cgroup", "r");
  char line[512], v2[560] = "", v1[560] = "";
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (!strncmp(line, "0::", 3))
      snprintf(v2, sizeof v2, "/sys/fs/cgroup%s", line + 3);
    const char *m = strstr(line, ":memory:");
    if (m)
      snprintf(v1, sizeof v1, "/sys/fs/cgroup/memory%s", m + 8);
  }
  if (f)
    fclose(f);
  unsigned long long max = 0, cur = 0, file = 0, shmem = 0;
  if (v2[0] && (max = cg_value(v2, "memory.max")) != 0) {
    cur = cg_value(v2, "memory.current");
    file = cg_stat(v2, "file");
    shmem = cg_stat(v2, "shmem");
  } else if (v1[0] && (max = cg_value(v1, "memory.limit_in_bytes")) != 0) {
    cur = cg_value(v1, "memory.usage_in_bytes");
    file = cg_stat(v1, "total_cache");
    shmem = cg_stat(v1, "total_shmem");
  } else {
    return 0;
  }
  unsigned long long cache = file > shmem ? file - shmem : 0;
  cur = cur > cache ? cur - cache : 0;
  *limit_out = max;
  return cur < max ? max - cur : 1; /* at the limit: room for nothing */
}

int ecs__server_pool_fits(const ecs_server_opts_t *o) {
  if (o->hugepages == 2) /* --hugepages require: the reservation decides (pool_fail_log) */
    return ECS_OK;
  /* The size the pool will have: rounded up to the minimum block. */
  unsigned long long mb = o->min_block ? o->min_block : 4096;
  unsigned long long want = (o->pool_size + mb - 1) / mb * mb;
  struct rlimit rl;
  int have_rl = getrlimit(RLIMIT_MEMLOCK, &rl) == 0;
  int locked =
      o->lock_pool && (has_ipc_lock() || (have_rl && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want)));
  if (o->lock_pool && !locked && have_rl)
    ECS_LOG_W(
        "pool: %llu MiB is over RLIMIT_MEMLOCK (%llu KiB) and this process lacks CAP_IPC_LOCK: the "
        "pool will not be pinned (raise it with ulimit -l or systemd's LimitMEMLOCK=, or grant CAP_IPC_LOCK; "
        "--no-mlock says not to pin it)",
        want >> 20, (unsigned long long)rl.rlim_cur / 1024);
  unsigned long long kb_avail = ecs__meminfo("MemAvailable");
  if (kb_avail == 0) /* no /proc/meminfo (or a kernel without the field): nothing to compare with */
    return ECS_OK;
  unsigned long long avail = kb_avail * 1024, swap = locked ? 0 : ecs__meminfo("SwapFree") * 1024;
  if (o->hugepages == 1) /* try: free huge pages are not in MemAvailable */
    avail += ecs__meminfo("HugePages_Free") * ecs__meminfo("Hugepagesize") * 1024;
  unsigned long long cg_limit, cg = cgroup_room(&cg_limit);
  const char *what = "MemAvailable in /proc/meminfo";
  char cgwhat[160];
  unsigned long long room = avail + swap;
  if (cg && cg < room) {
    room = cg;
    snprintf(cgwhat, sizeof cgwhat, "left under this cgroup's memory limit of %llu MiB", cg_limit >> 20);
    what = cgwhat;
  }
  if (want <= room)
    return ECS_OK;
  /* Leave a quarter of what there is to the rest of the host. */
  unsigned long long suggest = room / 4 * 3 >> 20;
  ECS_LOG_E("cannot start: --pool-size %llu MiB is more than the memory available: %llu MiB (%s%s); "
            "populating it would get the server killed by the kernel half-way. Use a smaller --pool-size, "
            "e.g. --pool-size %lluM",
            want >> 20, room >> 20, what,
            swap && room == avail + swap ? ", with free swap, as the pool will not be pinned" : "",
            suggest ? suggest : 1ULL);
  return ECS_ENOMEM;
}
