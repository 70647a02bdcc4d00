/*
 * Parsing of human-written values shared by the programs: sizes ("4G"),
 * whole numbers with bounds, and "key = value" config files.
 *
 * Thread safety: pure functions.
 */
#ifndef ECS_PARSE_H
#define ECS_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* "4096", "64K", "16M", "4G", "1T" (also "4GiB", "4GB": powers of 1024),
 * and decimal fractions of a unit ("1.5G", at most 9 digits after the
 * point; rounded down to whole bytes).  ECS_OK or ECS_EINVAL (junk, a
 * fraction of a byte, overflow). */
int ecs_parse_size(const char *s, uint64_t *out);

/* A decimal integer in [lo, hi].  ECS_OK or ECS_EINVAL. */
int ecs_parse_int(const char *s, long long lo, long long hi, long long *out);

/* A floating-point number in [lo, hi].  ECS_OK or ECS_EINVAL. */
int ecs_parse_double(const char *s, double lo, double hi, double *out);

/* Reads a config file of "name = value" (or "name value") lines, '#'
 * comments (at a line's start or after whitespace: a '#' inside a value is
 * part of it) and blank lines, and appends "--name" "value" pairs to a
 * NULL-terminated argv it allocates (*argv_out; free with
 * ecs_conf_free_argv).  A line "name" alone, or "name = true", becomes
 * "--name" alone; "name = false" is dropped.  On a malformed line returns
 * ECS_EINVAL and writes "FILE:LINE: what" into err. */
int ecs_conf_to_argv(const char *path, int *argc_out, char ***argv_out, char *err, size_t errlen);
void ecs_conf_free_argv(int argc, char **argv);

#endif
