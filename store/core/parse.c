/* Value and config-file parsing; see parse.h. */
#include "store/core/parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"

int ecs_parse_size(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s))
    return ECS_EINVAL;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return ECS_EINVAL;
  /* A decimal fraction ("1.5G"): its digits, at most 9 of them, kept as
   * frac / 10^fdig and applied after the unit (bytes need no fraction). */
  unsigned long long frac = 0, fscale = 1;
  int has_frac = 0;
  if (*end == '.') {
    end++;
    if (!isdigit((unsigned char)*end))
      return ECS_EINVAL;
    has_frac = 1;
    for (int d = 0; isdigit((unsigned char)*end); d++, end++) {
      if (d >= 9)
        return ECS_EINVAL;
      frac = frac * 10 + (unsigned long long)(*end - '0');
      fscale *= 10;
    }
  }
  unsigned shift = 0;
  switch (*end) {
  case '\0': break;
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  case 't':
  case 'T':
    shift = 40;
    end++;
    break;
  case 'b':
  case 'B': break;
  default: return ECS_EINVAL;
  }
  if (has_frac && !shift) /* "1.5" or "1.5B": a fraction of a byte */
    return ECS_EINVAL;
  if (shift && *end == 'i')
    end++;
  if (*end == 'B' || *end == 'b')
    end++;
  if (*end != '\0')
    return ECS_EINVAL;
  if (shift && v > (~0ull >> shift))
    return ECS_EINVAL;
  uint64_t r = (uint64_t)v << shift;
  if (has_frac) {
    /* frac < fscale <= 10^9 < 2^30 and shift <= 40: the product fits in
     * 70 bits, so divide before the last shift: (frac << (shift-20)) stays
     * below 2^50, and the remainder's 20 bits are exact enough (the result
     * is rounded down to whole bytes). */
    unsigned hi = shift > 20 ? shift - 20 : 0, lo = shift - hi;
    uint64_t add = (((uint64_t)frac << hi) / fscale) << lo;
    add += ((((uint64_t)frac << hi) % fscale) << lo) / fscale;
    if (r > UINT64_MAX - add)
      return ECS_EINVAL;
    r += add;
  }
  *out = r;
  return ECS_OK;
}

int ecs_parse_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s)
    return ECS_EINVAL;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end != '\0' || v < lo || v > hi)
    return ECS_EINVAL;
  *out = v;
  return ECS_OK;
}

int ecs_parse_double(const char *s, double lo, double hi, double *out) {
  if (!s || !*s)
    return ECS_EINVAL;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end != '\0' || !(v >= lo && v <= hi))
    return ECS_EINVAL;
  *out = v;
  return ECS_OK;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

static int push(int *argc, char ***argv, size_t *cap, const char *s) {
  if ((size_t)*argc + 2 > *cap) {
    size_t ncap = *cap ? *cap * 2 : 16;
    char **n = realloc(*argv, ncap * sizeof *n);
    if (!n)
      return ECS_ENOMEM;
    *argv = n;
    *cap = ncap;
  }
  char *d = strdup(s);
  if (!d)
    return ECS_ENOMEM;
  (*argv)[(*argc)++] = d;
  (*argv)[*argc] = NULL;
  return ECS_OK;
}

/* Ends line at its comment: a '#' at the start or after whitespace, as in
 * a shell.  A '#' inside a value ("--redis redis://h:6379/0#x", a token
 * file "tok#en") is part of it: cutting there would silently run with a
 * different value than the one written. */
static void cut_comment(char *line) {
  for (char *p = line; *p; p++) {
    if (*p == '#' && (p == line || isspace((unsigned char)p[-1]))) {
      *p = '\0';
      return;
    }
  }
}

int ecs_conf_to_argv(const char *path, int *argc_out, char ***argv_out, char *err, size_t errlen) {
  *argc_out = 0;
  *argv_out = NULL;
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return ECS_EIO;
  }
  int argc = 0, rc = ECS_OK, lineno = 0;
  char **argv = NULL;
  size_t cap = 0;
  char line[1024];
  while (rc == ECS_OK && fgets(line, sizeof line, f)) {
    lineno++;
    if (!strchr(line, '\n') && !feof(f)) {
      snprintf(err, errlen, "%s:%d: line too long", path, lineno);
      rc = ECS_EINVAL;
      break;
    }
    cut_comment(line);
    char *l = trim(line);
    if (!*l)
      continue;
    char *val = NULL;
    char *sep = strpbrk(l, "= \t");
    if (sep) {
      *sep = '\0';
      val = trim(sep + 1);
      if (*val == '=')
        val = trim(val + 1);
    }
    char *name = trim(l);
    if (!*name || name[0] == '-') {
      snprintf(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
      rc = ECS_EINVAL;
      break;
    }
    char opt[256];
    if (strlen(name) > sizeof opt - 3) { /* was cut short without a word */
      snprintf(err, errlen, "%s:%d: option name too long", path, lineno);
      rc = ECS_EINVAL;
      break;
    }
    if (val && !strcmp(val, "false"))
      continue;
    snprintf(opt, sizeof opt, "--%s", name);
    rc = push(&argc, &argv, &cap, opt);
    if (rc == ECS_OK && val && *val && strcmp(val, "true") != 0)
      rc = push(&argc, &argv, &cap, val);
  }
  fclose(f);
  if (rc != ECS_OK) {
    ecs_conf_free_argv(argc, argv);
    return rc;
  }
  *argc_out = argc;
  *argv_out = argv;
  return ECS_OK;
}

void ecs_conf_free_argv(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    free(argv[i]);
  free(argv);
}
