/*
 * The pool's lock (see lock.h): backoff, then a futex.
 */
#include "mempool/lock.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield" ::: "memory");
#else
  atomic_signal_fence(memory_order_seq_cst);
#endif
}

/* Test, then test-and-set: a look that finds the lock held only reads,
 * and leaves the line shared with the holder. */
static int try_take(ecs__lock_t *l) {
  int c = 0;
  return atomic_load_explicit(&l->word, memory_order_relaxed) == 0 &&
         atomic_compare_exchange_strong_explicit(&l->word, &c, 1, memory_order_acquire, memory_order_relaxed);
}

void ecs__lock_init(ecs__lock_t *l) {
  atomic_init(&l->word, 0);
  atomic_init(&l->sleeps, 0);
}

void ecs__lock_acquire(ecs__lock_t *l) {
  if (try_take(l))
    return;
  /* Once the backoff is at its longest, each look also yields, so that a
   * preempted holder sharing our CPU can finish. */
  for (unsigned wait = 1, round = 0; round < ECS__LOCK_SPIN_ROUNDS; round++) {
    for (unsigned i = 0; i < wait; i++)
      cpu_relax();
    if (wait < ECS__LOCK_BACKOFF_MAX)
      wait *= 2;
    else
      sched_yield();
    if (try_take(l))
      return;
  }
  /* Taken with 2, not 1: other sleepers may remain, and our release must
   * wake them. */
  while (atomic_exchange_explicit(&l->word, 2, memory_order_acquire) != 0) {
    atomic_fetch_add_explicit(&l->sleeps, 1, memory_order_relaxed);
    syscall(SYS_futex, &l->word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
  }
}

void ecs__lock_release(ecs__lock_t *l) {
  if (atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2)
    syscall(SYS_futex, &l->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
