/*
 * Small helpers shared by the example programs: clocks, listening and
 * accepting with a poll timeout, stop signals, option values, and
 * percentiles.
 *
 * Thread safety: everything is thread-safe except ex_signals_install
 * (call it once from main) and ex_pct (sorts its argument in place).
 */
#ifndef ECS_EX_UTIL_H
#define ECS_EX_UTIL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Set by SIGINT/SIGTERM once ex_signals_install ran. */
extern volatile sig_atomic_t ex_stop;

/* SIGINT/SIGTERM set ex_stop; SIGPIPE is ignored (writes report ECONN). */
void ex_signals_install(void);

/* Monotonic microseconds. */
uint64_t ex_now_us(void);

/* Listens on "HOST:PORT" (port 0: any free one) and, when port_file is
 * given, writes the bound port there (atomically, by rename) once
 * listening.  0 or an ECS_E* code; *fd non-blocking. */
int ex_listen(const char *hostport, const char *port_file, int *fd, int *port);

/* Waits up to timeout_ms for a connection.  Returns the accepted socket
 * (non-blocking, TCP_NODELAY), or -1 when none came (or on error). */
int ex_accept(int lfd, int timeout_ms);

/* "700x728" -> 700, 728 (each 1..EX_MAX_SIDE).  0 or -1. */
int ex_parse_wh(const char *s, uint32_t *w, uint32_t *h);

/* A whole number in [lo, hi] from an option value, or exit(2) naming opt. */
long long ex_opt_int(const char *opt, const char *val, long long lo, long long hi);

/* Splits a comma-separated list in place into at most max items. */
size_t ex_split_list(char *s, char **items, size_t max);

/* The p-th percentile (0..100, nearest rank) of v[0..n); sorts v.  0 when n 0. */
double ex_pct(double *v, size_t n, double p);
double ex_mean(const double *v, size_t n);

#endif
