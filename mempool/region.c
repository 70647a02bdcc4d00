/* The pool's memory: memfd, mmap, mlock, huge pages, CUDA registration. */
#include "mempool/region.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

#define POPULATE_CHUNK ((size_t)256 << 20) /* bytes between two progress calls */
#define POPULATE_UNIT ((size_t)32 << 20)   /* bytes a worker faults in per claim */
#define POPULATE_MAX_THREADS 16            /* more rarely helps: page zeroing saturates memory */

/*
 * Faulting in gigabytes of 4 KiB pages is CPU work (a page fault and a page
 * zeroed per 4 KiB: about half a second per GiB on one core), so it is
 * spread over one thread per online CPU.  Workers claim units of
 * POPULATE_UNIT from a shared cursor, which balances them whatever the
 * size; the creating thread only waits and reports progress, so
 * on_populate is called from it alone, once per POPULATE_CHUNK completed
 * (and once at the end), with done increasing.
 */
typedef struct populate_job {
  char *base;         /* the mapping */
  size_t len;         /* its length */
  int fd;             /* the memfd, for the MAP_POPULATE fallback */
  size_t unit;        /* bytes per claim: POPULATE_UNIT in whole pages */
  pthread_mutex_t mu; /* guards the fields below */
  pthread_cond_t cv;  /* signalled when a unit completes or a worker ends */
  size_t next;        /* first byte not claimed yet */
  size_t done;        /* bytes faulted in */
  int err;            /* first errno a worker met (0: none) */
  int running;        /* workers still running */
  int remapped;       /* the MAP_POPULATE fallback ran (it drops an mlock) */
} populate_job_t;

/* Faults [p, p+n) in for writing.  MADV_POPULATE_WRITE (Linux 5.14)
 * reports a failure (ENOMEM when the memory is not there); on older
 * kernels the range is re-mapped MAP_FIXED | MAP_POPULATE over itself,
 * which populates as well but cannot report one. */
static int populate_range(populate_job_t *j, size_t off, size_t n) {
  if (madvise(j->base + off, n, MADV_POPULATE_WRITE) == 0)
    return 0;
  if (errno != EINVAL)
    return errno;
  void *q = mmap(j->base + off, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, j->fd,
                 (off_t)off);
  if (q == MAP_FAILED)
    return errno;
  pthread_mutex_lock(&j->mu);
  j->remapped = 1;
  pthread_mutex_unlock(&j->mu);
  return 0;
}

static void *populate_worker(void *arg) {
  populate_job_t *j = arg;
  pthread_mutex_lock(&j->mu);
  while (!j->err && j->next < j->len) {
    size_t off = j->next;
    size_t n = j->len - off < j->unit ? j->len - off : j->unit;
    j->next += n;
    pthread_mutex_unlock(&j->mu);
    int e = populate_range(j, off, n);
    pthread_mutex_lock(&j->mu);
    if (e && !j->err)
      j->err = e;
    j->done += n;
    pthread_cond_signal(&j->cv);
  }
  j->running--;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

/* Workers: one per online CPU, at least one, at most one per unit. */
static int populate_threads(size_t len, size_t unit) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t units = (len + unit - 1) / unit;
  size_t n = cpus < 1 ? 1 : (size_t)cpus;
  if (n > POPULATE_MAX_THREADS)
    n = POPULATE_MAX_THREADS;
  if (n > units)
    n = units;
  return n ? (int)n : 1;
}

/* Faults the whole mapping in, reporting progress.  Returns 0 or an errno;
 * *remapped says whether the fallback re-mapped (and so unlocked) a part. */
static int populate(void *p, size_t len, size_t page, int fd, const ecs_pool_opts_t *pr, int *remapped) {
  /* A unit is whole pages: a huge page is faulted in (or re-mapped) whole. */
  size_t unit = page >= POPULATE_UNIT ? page : POPULATE_UNIT / page * page;
  populate_job_t j = {.base = p, .len = len, .fd = fd, .unit = unit};
  pthread_t th[POPULATE_MAX_THREADS];
  int want = populate_threads(len, unit), started = 0;
  pthread_mutex_init(&j.mu, NULL);
  pthread_cond_init(&j.cv, NULL);
  j.running = want;
  for (; started < want; started++)
    if (pthread_create(&th[started], NULL, populate_worker, &j) != 0)
      break;
  pthread_mutex_lock(&j.mu);
  j.running -= want - started;
  pthread_mutex_unlock(&j.mu);
  if (started == 0) { /* no thread to be had: do the work here */
    j.running = 1;
    populate_worker(&j);
  }
  size_t reported = 0;
  pthread_mutex_lock(&j.mu);
  for (;;) {
    /* One call per whole chunk completed, and one for the tail. */
    while (pr && pr->on_populate && !j.err && reported < len &&
           j.done >= (len - reported < POPULATE_CHUNK ? len : reported + POPULATE_CHUNK)) {
      reported = len - reported < POPULATE_CHUNK ? len : reported + POPULATE_CHUNK;
      pthread_mutex_unlock(&j.mu);
      pr->on_populate(pr->populate_ctx, reported, len);
      pthread_mutex_lock(&j.mu);
    }
    if (j.running == 0)
      break;
    pthread_cond_wait(&j.cv, &j.mu);
  }
  int err = j.err;
  *remapped = j.remapped;
  pthread_mutex_unlock(&j.mu);
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  pthread_cond_destroy(&j.cv);
  pthread_mutex_destroy(&j.mu);
  return err;
}

/* Creates the memfd and maps it; huge selects MFD_HUGETLB.  Returns 0 or a
 * positive errno, with nothing left open. */
static int map_fd(ecs__region_t *r, size_t size, int huge, int lock, const char *name,
                  const ecs_pool_opts_t *pr) {
  size_t page = huge ? huge_page_size() : 4096;
  size_t len = (size + page - 1) / page * page;
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0));
  if (fd < 0)
    return errno;
  /* The fd is handed to other processes (shm ATTACH).  Mode 0600: no
   * other uid can reopen it through /proc/PID/fd/N with more access than
   * the descriptor it was given (a memfd is created 0777).  Sealed at its
   * size: no holder of a writable fd can shrink it under the server (its
   * next touch of a page past the end would be a SIGBUS) or grow it. */
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)len) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
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
  /* Locked before populating, on fault: each page is locked as the
   * populate threads fault it in, instead of a second walk over every page
   * afterwards (mlock(2) after MAP_POPULATE cost another 10%).  Where
   * mlock2 is refused, lock_region() tries mlock(2) after populating and
   * says why it failed. */
  r->locked = lock && syscall(SYS_mlock2, p, len, MLOCK_ONFAULT) == 0;
  int remapped = 0;
  int e = populate(p, len, page, fd, pr, &remapped);
  if (e) {
    munmap(p, len);
    close(fd);
    r->locked = 0;
    return e;
  }
  if (remapped)
    r->locked = 0;
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
  if (r->locked)
    return; /* mlock2(MLOCK_ONFAULT) before populating did it */
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
    e = map_fd(r, size, 1, lock, name, progress);
    if (e && huge == ECS_POOL_HUGE_REQUIRE)
      return ECS_ENOMEM;
  }
  if (!r->base && (e = map_fd(r, size, 0, lock, name, progress)) != 0)
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
