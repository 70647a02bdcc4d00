/* The pool's memory: memfd, mmap, mlock, huge pages, CUDA registration. */
#include "mempool/region.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HUGE_PAGE_DEFAULT ((size_t)2 << 20)
#define CUDA_HOST_REGISTER_PORTABLE 1u /* cudaHostRegisterPortable: every context sees it */

typedef int (*cuda_register_fn)(void *ptr, size_t size, unsigned flags);
typedef int (*cuda_unregister_fn)(void *ptr);

/* The default huge page size (what MFD_HUGETLB uses), from /proc/meminfo;
 * 2 MiB when it cannot be read. */
static size_t huge_page_size(void) {
  size_t kib = 0;
  char line[128];
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return HUGE_PAGE_DEFAULT;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Hugepagesize: %zu kB", &kib) == 1)
      break;
  fclose(f);
  return kib ? kib * 1024 : HUGE_PAGE_DEFAULT;
}

#define POPULATE_CHUNK ((size_t)256 << 20) /* bytes faulted in between progress calls */

/* Faults the mapping in chunk by chunk: the same effect as one MAP_POPULATE
 * mmap, with a progress call between chunks. */
static int populate(void *p, size_t len, int fd, const ecs_pool_opts_t *pr) {
  for (size_t off = 0; off < len; off += POPULATE_CHUNK) {
    size_t n = len - off < POPULATE_CHUNK ? len - off : POPULATE_CHUNK;
    void *q = mmap((char *)p + off, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd,
                   (off_t)off);
    if (q == MAP_FAILED)
      return errno;
    if (pr && pr->on_populate)
      pr->on_populate(pr->populate_ctx, off + n, len);
  }
  return 0;
}

/* Creates the memfd and maps it; huge selects MFD_HUGETLB.  Returns 0 or a
 * positive errno, with nothing left open. */
static int map_fd(ecs__region_t *r, size_t size, int huge, const char *name, const ecs_pool_opts_t *pr) {
  size_t page = huge ? huge_page_size() : 4096;
  size_t len = (size + page - 1) / page * page;
  int fd = memfd_create(name, MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));
  if (fd < 0)
    return errno;
  if (ftruncate(fd, (off_t)len) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  /* The hugetlb reservation is made here, so an empty huge page pool
   * still fails at this mmap, before any populating. */
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return e;
  }
  int e = populate(p, len, fd, pr);
  if (e) {
    munmap(p, len);
    close(fd);
    return e;
  }
  r->base = p;
  r->map_len = len;
  r->fd = fd;
  r->hugepages = huge;
  return 0;
}

/* mlock, or one line on stderr saying why the pool stays unpinned.  The raw
 * syscall, because ASan's interceptor turns mlock() into a no-op that
 * reports success, which would make stats.locked lie in sanitizer builds. */
static void lock_region(ecs__region_t *r) {
  if (syscall(SYS_mlock, r->base, r->map_len) == 0) {
    r->locked = 1;
    return;
  }
  int e = errno;
  struct rlimit rl;
  char lim[32] = "?";
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    if (rl.rlim_cur == RLIM_INFINITY)
      snprintf(lim, sizeof lim, "unlimited");
    else
      snprintf(lim, sizeof lim, "%llu KiB", (unsigned long long)rl.rlim_cur / 1024);
  }
  fprintf(stderr,
          "ecstore: warning: mlock of the %zu-byte pool refused (%s; RLIMIT_MEMLOCK %s); "
          "continuing unpinned (raise ulimit -l or grant CAP_IPC_LOCK)\n",
          r->map_len, strerror(e), lim);
}

/* cudaHostRegister through dlopen; silent when libcudart is absent (the
 * common case on CPU-only hosts), one warning when it is there and refuses. */
static void cuda_register(ecs__region_t *r) {
  void *lib = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return;
  cuda_register_fn reg;
  *(void **)&reg = dlsym(lib, "cudaHostRegister");
  if (!reg || !dlsym(lib, "cudaHostUnregister")) {
    dlclose(lib);
    return;
  }
  int rc = reg(r->base, r->map_len, CUDA_HOST_REGISTER_PORTABLE);
  if (rc != 0) {
    fprintf(stderr,
            "ecstore: warning: cudaHostRegister of the %zu-byte pool failed (cudaError %d); "
            "continuing unregistered\n",
            r->map_len, rc);
    dlclose(lib);
    return;
  }
  r->cuda_lib = lib;
  r->cuda_registered = 1;
}

int ecs__region_map(ecs__region_t *r, size_t size, ecs_pool_huge_t huge, int lock, int cuda, const char *name,
                    const ecs_pool_opts_t *progress) {
  memset(r, 0, sizeof *r);
  r->fd = -1;
  int e = ENOMEM;
  if (huge != ECS_POOL_HUGE_OFF) {
    e = map_fd(r, size, 1, name, progress);
    if (e && huge == ECS_POOL_HUGE_REQUIRE)
      return ECS_ENOMEM;
  }
  if (!r->base && (e = map_fd(r, size, 0, name, progress)) != 0)
    return ECS_ENOMEM;
  if (lock)
    lock_region(r);
  if (cuda)
    cuda_register(r);
  return 0;
}

void ecs__region_unmap(ecs__region_t *r) {
  if (!r || !r->base)
    return;
  if (r->cuda_registered) {
    cuda_unregister_fn unreg;
    *(void **)&unreg = dlsym(r->cuda_lib, "cudaHostUnregister");
    if (unreg)
      unreg(r->base);
    dlclose(r->cuda_lib);
  }
  if (r->locked)
    syscall(SYS_munlock, r->base, r->map_len);
  munmap(r->base, r->map_len);
  close(r->fd);
  memset(r, 0, sizeof *r);
  r->fd = -1;
}
