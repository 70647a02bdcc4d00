/*
 * The pool's lock: a test-and-test-and-set lock whose waiters back off
 * exponentially, then sleep on a futex.
 *
 * Why not a pthread mutex: an alloc or free holds the pool lock for about
 * a hundred nanoseconds, and what the lock costs under contention is not
 * the waiting but the handing over.  Each time another thread gets the
 * lock, the lock word and every buddy cache line the next operation
 * touches move between cores.  With glibc's adaptive mutex two threads
 * alternated nearly every operation, and two threads got fewer alloc+free
 * pairs per second than one thread alone (ecstore-bench pool; see
 * docs/bench-results/2026-11-25-pool-2thread.md).  Here a waiter looks at
 * the word less and less often (up to ECS__LOCK_BACKOFF_MAX pauses, about
 * 10 us on current x86, between looks), so the holder takes the lock again
 * for the price of an uncontended atomic and the lines stay in one core's
 * cache for many operations in a row.
 *
 * The price is fairness, as with any barging mutex: a waiter may wait
 * while the holder runs dozens of operations in a row (with two threads
 * contending all the time, p99 of an alloc fell from ~2 to ~0.5 us but
 * p99.99 rose from ~0.1 to ~0.17 ms; see the results file above).  A waiter that has
 * looked ECS__LOCK_SPIN_ROUNDS times (its holder preempted, or many
 * threads) sleeps on a futex instead of burning its CPU: the word then
 * says 2 and the unlock wakes one sleeper, the three-state futex mutex of
 * Drepper's "Futexes Are Tricky".  Linux only, like the region.
 *
 * Not recursive; no owner checks.  The word is zeroed memory when free,
 * so a calloc'd lock is ready to use.
 */
#ifndef ECS_MEMPOOL_LOCK_H
#define ECS_MEMPOOL_LOCK_H

#include <stdatomic.h>
#include <stdint.h>

/* Longest pause between two looks at a held lock, in cpu_relax() calls,
 * and how many looks before sleeping (about 0.6 ms in all). */
#define ECS__LOCK_BACKOFF_MAX 1024u
#define ECS__LOCK_SPIN_ROUNDS 64u

typedef struct ecs__lock {
  _Atomic int word;        /* 0 free, 1 held, 2 held and maybe sleepers */
  _Atomic uint64_t sleeps; /* futex waits so far (tests; relaxed) */
} ecs__lock_t;

/* A free lock (same as zeroed memory). */
void ecs__lock_init(ecs__lock_t *l);

/* Takes the lock, waiting as above. */
void ecs__lock_acquire(ecs__lock_t *l);

/* Releases it; wakes one sleeper when there may be one. */
void ecs__lock_release(ecs__lock_t *l);

#endif
