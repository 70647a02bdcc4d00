/*
 * The pool's memory: one memfd-backed shared mapping, populated up front,
 * optionally on huge pages, mlock'd, and optionally registered with CUDA.
 *
 * Preconditions and what each primitive needs from the system:
 *  - memfd_create(2) (Linux >= 3.17): the region lives in a file so that a
 *    co-located process can mmap the same pages from the fd we pass it.
 *    The file is mode 0600 and sealed (F_SEAL_SHRINK | F_SEAL_GROW, then
 *    F_SEAL_SEAL; hugetlb memfds take seals since Linux 4.16): another
 *    uid cannot reopen it with more access than the fd it was handed,
 *    and nobody can truncate it under the server.
 *  - MFD_HUGETLB (Linux >= 4.14) needs free pages in the hugetlb pool
 *    (/proc/sys/vm/nr_hugepages); the reservation is made at mmap time, so
 *    an empty pool shows up as mmap failing with ENOMEM.  The mapped length
 *    is rounded up to the default huge page size (Hugepagesize in
 *    /proc/meminfo); the pool still manages only the size asked for.
 *  - Every page is faulted in at create (MADV_POPULATE_WRITE, Linux 5.14;
 *    older kernels re-map each unit MAP_FIXED | MAP_POPULATE over itself),
 *    so the first PUT never pays for page faults and a too-large pool fails
 *    at start.  It is CPU work, so it runs on one thread per online CPU;
 *    progress is reported from the calling thread between chunks.
 *  - mlock2(2) with MLOCK_ONFAULT before populating (plain mlock(2) after,
 *    where that is refused) needs RLIMIT_MEMLOCK >= the region or CAP_IPC_LOCK.  When it
 *    is refused we print one line on stderr and go on unpinned (locked=0):
 *    an unpinned pool is slower for DMA, not wrong.
 *  - CUDA registration is looked up at run time only (dlopen of
 *    libcudart.so, then cudaHostRegister/cudaHostUnregister); there is no
 *    build-time CUDA dependency.  A missing library or a failed register
 *    leaves cuda_registered=0 and is not an error.  The whole mapped length
 *    is registered, and the same pointer is unregistered before munmap.
 *
 * Not thread-safe: map and unmap belong to pool create and destroy (map
 * starts and joins its own populate threads).
 */
#ifndef ECS_MEMPOOL_REGION_H
#define ECS_MEMPOOL_REGION_H

#include <stddef.h>

#include "ecstore/pool.h"

typedef struct ecs__region {
  void *base;          /* start of the mapping (MAP_FAILED never kept) */
  size_t map_len;      /* mapped bytes (size rounded up to the page size in use) */
  int fd;              /* the memfd, -1 when unmapped */
  int locked;          /* 1 when mlock succeeded */
  int hugepages;       /* 1 when backed by MFD_HUGETLB pages */
  int cuda_registered; /* 1 when cudaHostRegister succeeded */
  void *cuda_lib;      /* dlopen handle of libcudart while registered */
} ecs__region_t;

/* Maps a region of at least size bytes (a multiple of 4096), calling
 * progress->on_populate (when progress and it are non-NULL) after each
 * populated chunk.  0, or
 * ECS_ENOMEM (memfd/ftruncate/mmap failed, or huge pages REQUIRE'd and not
 * available), with *r left unmapped. */
int ecs__region_map(ecs__region_t *r, size_t size, ecs_pool_huge_t huge, int lock, int cuda_register,
                    const char *name, const ecs_pool_opts_t *progress);

/* Unregisters, unlocks, unmaps and closes; accepts an unmapped region. */
void ecs__region_unmap(ecs__region_t *r);

#endif
