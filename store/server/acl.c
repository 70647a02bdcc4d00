/*
 * The ACL file (see acl.h): a parser over bytes with no I/O, a loader that
 * checks the file's permissions, and a constant-time lookup.
 */
#include "store/server/acl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/core/net.h"
#include "store/core/parse.h"

#define ACL_MAX_FILE (4u << 20)

typedef struct acl_entry {
  char *token;            /* the token (NUL-terminated; no whitespace inside) */
  size_t token_len;       /* its length */
  char **ns;              /* allowed namespaces; NULL with any_ns */
  size_t nns;             /* how many */
  int any_ns;             /* '*': every namespace */
  unsigned rights;        /* ECS__RIGHT_* bits */
  ecs__acl_quota_t quota; /* the optional fourth field (0: no limit) */
} acl_entry_t;

struct ecs__acl {
  acl_entry_t *e; /* entries, in file order */
  size_t n;       /* count */
};

static const struct {
  const char *name;
  unsigned bits;
} right_names[] = {
    {"read", ECS__RIGHT_READ},   {"write", ECS__RIGHT_WRITE},         {"remove", ECS__RIGHT_REMOVE},
    {"admin", ECS__RIGHT_ADMIN}, {"overwrite", ECS__RIGHT_OVERWRITE}, {"all", ECS__RIGHT_ALL},
};

static int acl_err(char *err, size_t errlen, const char *name, size_t line, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (err && errlen)
    snprintf(err, errlen, "%s:%zu: %s", name, line, msg);
  return ECS_EINVAL;
}

void ecs__acl_free(ecs__acl_t *a) {
  if (a == NULL)
    return;
  for (size_t i = 0; i < a->n; i++) {
    /* the token is a secret: do not leave it in freed memory */
    volatile char *t = a->e[i].token;
    for (size_t k = 0; t && k < a->e[i].token_len; k++)
      t[k] = 0;
    free(a->e[i].token);
    for (size_t k = 0; k < a->e[i].nns; k++)
      free(a->e[i].ns[k]);
    free(a->e[i].ns);
  }
  free(a->e);
  free(a);
}

size_t ecs__acl_count(const ecs__acl_t *a) {
  return a ? a->n : 0;
}

const char *ecs__acl_rights_str(unsigned rights, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < 5; i++) /* every right but "all" */
    if (rights & right_names[i].bits) {
      int k = snprintf(buf + used, cap - used, "%s%s", used ? "," : "", right_names[i].name);
      if (k < 0 || (size_t)k >= cap - used)
        break;
      used += (size_t)k;
    }
  if (!used)
    snprintf(buf, cap, "none");
  return buf;
}

/* Splits s (NUL-terminated) at whitespace into at most max fields; returns
 * the count, or max + 1 when there are more. */
static size_t split_fields(char *s, char **f, size_t max) {
  size_t n = 0;
  for (;;) {
    while (*s == ' ' || *s == '\t')
      s++;
    if (!*s)
      return n;
    if (n == max)
      return max + 1;
    f[n++] = s;
    while (*s && *s != ' ' && *s != '\t')
      s++;
    if (*s)
      *s++ = '\0';
  }
}

static int parse_rights(char *s, unsigned *out) {
  unsigned r = 0;
  size_t n = strlen(s);
  if (n == 0 || s[0] == ',' || s[n - 1] == ',' || strstr(s, ",,"))
    return -1;
  char *save = NULL;
  for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    size_t i;
    for (i = 0; i < sizeof right_names / sizeof right_names[0]; i++)
      if (!strcmp(t, right_names[i].name))
        break;
    if (i == sizeof right_names / sizeof right_names[0])
      return -1;
    r |= right_names[i].bits;
  }
  if (r == 0)
    return -1;
  *out = r;
  return 0;
}

/* The optional fourth field: "stored=SIZE,pinned=SIZE,pins=N", any of
 * them, in any order.  0 or -1 (why set). */
static int parse_quota(char *s, ecs__acl_quota_t *q, char *why, size_t whycap) {
  char *save = NULL;
  for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(t, '=');
    uint64_t v = 0;
    long long n = 0;
    if (eq)
      *eq++ = '\0';
    if (eq && !strcmp(t, "stored") && ecs_parse_size(eq, &v) == 0 && v) {
      q->stored = v;
    } else if (eq && !strcmp(t, "pinned") && ecs_parse_size(eq, &v) == 0 && v) {
      q->pinned = v;
    } else if (eq && !strcmp(t, "pins") && ecs_parse_int(eq, 1, 1 << 30, &n) == 0) {
      q->pins = (uint64_t)n;
    } else {
      snprintf(why, whycap,
               "the quota field must be a comma-separated list of stored=SIZE, pinned=SIZE, pins=N "
               "(sizes like 512M, above 0)");
      return -1;
    }
  }
  return 0;
}

/* One line's three or four fields into e.  ECS_OK, ECS_EINVAL (message in why),
 * ECS_ENOMEM. */
static int parse_entry(char **f, acl_entry_t *e, char *why, size_t whycap) {
  size_t tl = strlen(f[0]);
  if (tl > ECS__ACL_MAX_TOKEN) {
    snprintf(why, whycap, "token longer than %d bytes", ECS__ACL_MAX_TOKEN);
    return ECS_EINVAL;
  }
  for (size_t i = 0; i < tl; i++)
    if ((unsigned char)f[0][i] < 0x21 || (unsigned char)f[0][i] == 0x7f) {
      snprintf(why, whycap, "token holds a control character");
      return ECS_EINVAL;
    }
  if (f[3] && parse_quota(f[3], &e->quota, why, whycap) != 0)
    return ECS_EINVAL;
  if (parse_rights(f[2], &e->rights) != 0) {
    snprintf(why, whycap,
             "rights must be a comma-separated list of read, write, overwrite, remove, admin, or 'all'");
    return ECS_EINVAL;
  }
  if (!strcmp(f[1], "*")) {
    e->any_ns = 1;
  } else {
    char *save = NULL;
    for (char *t = f[1]; *t; t++)
      if (*t == ',' && (t == f[1] || t[1] == '\0' || t[1] == ',')) {
        snprintf(why, whycap, "empty namespace in the list");
        return ECS_EINVAL;
      }
    for (char *t = strtok_r(f[1], ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      if (strlen(t) > ECS__ACL_MAX_NS || !strcmp(t, "*")) {
        snprintf(why, whycap, "namespace must be 1..%d bytes, or '*' alone", ECS__ACL_MAX_NS);
        return ECS_EINVAL;
      }
      if (e->nns == ECS__ACL_MAX_ENTRIES) {
        snprintf(why, whycap, "more than %d namespaces", ECS__ACL_MAX_ENTRIES);
        return ECS_EINVAL;
      }
      char **nn = realloc(e->ns, (e->nns + 1) * sizeof *nn);
      if (!nn)
        return ECS_ENOMEM;
      e->ns = nn;
      if ((e->ns[e->nns] = strdup(t)) == NULL)
        return ECS_ENOMEM;
      e->nns++;
    }
  }
  e->token = strdup(f[0]);
  if (!e->token)
    return ECS_ENOMEM;
  e->token_len = tl;
  return ECS_OK;
}

int ecs__acl_parse(const char *text, size_t len, const char *name, ecs__acl_t **out, char *err,
                   size_t errlen) {
  *out = NULL;
  ecs__acl_t *a = calloc(1, sizeof *a);
  char *line = malloc(ECS__ACL_MAX_LINE + 1);
  if (!a || !line) {
    free(a);
    free(line);
    return ECS_ENOMEM;
  }
  int rc = ECS_OK;
  size_t lineno = 0, pos = 0;
  while (pos < len && rc == ECS_OK) {
    lineno++;
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t ll = nl ? (size_t)(nl - (text + pos)) : len - pos;
    if (ll > ECS__ACL_MAX_LINE) {
      rc = acl_err(err, errlen, name, lineno, "line longer than %d bytes", ECS__ACL_MAX_LINE);
      break;
    }
    memcpy(line, text + pos, ll);
    line[ll] = '\0';
    pos += ll + (nl ? 1 : 0);
    if (memchr(line, '\0', ll) != NULL) {
      rc = acl_err(err, errlen, name, lineno, "NUL byte in the line");
      break;
    }
    if (ll && line[ll - 1] == '\r')
      line[--ll] = '\0';
    for (size_t i = 0; i < ll; i++) /* a comment: '#' at the start or after whitespace */
      if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line[i] = '\0';
        break;
      }
    char *f[4] = {NULL, NULL, NULL, NULL};
    size_t nf = split_fields(line, f, 4);
    if (nf == 0)
      continue;
    if (nf < 3 || nf > 4) {
      rc = acl_err(err, errlen, name, lineno, "expected 'TOKEN NAMESPACES RIGHTS [QUOTA]', got %s fields",
                   nf > 4    ? "more than 4"
                   : nf == 1 ? "1"
                             : "2");
      break;
    }
    for (size_t i = 0; i < a->n; i++)
      if (!strcmp(a->e[i].token, f[0])) {
        rc = acl_err(err, errlen, name, lineno, "the token of line %zu appears again", i + 1);
        break;
      }
    if (rc != ECS_OK)
      break;
    if (a->n == ECS__ACL_MAX_ENTRIES) {
      rc = acl_err(err, errlen, name, lineno, "more than %d tokens", ECS__ACL_MAX_ENTRIES);
      break;
    }
    acl_entry_t *ne = realloc(a->e, (a->n + 1) * sizeof *ne);
    if (!ne) {
      rc = ECS_ENOMEM;
      break;
    }
    a->e = ne;
    memset(&a->e[a->n], 0, sizeof a->e[a->n]);
    char why[160];
    rc = parse_entry(f, &a->e[a->n], why, sizeof why);
    a->n++; /* even half-filled: ecs__acl_free frees what it holds */
    if (rc == ECS_EINVAL)
      acl_err(err, errlen, name, lineno, "%s", why);
  }
  /* the line buffer held tokens */
  memset(line, 0, ECS__ACL_MAX_LINE + 1);
  free(line);
  if (rc == ECS_OK && a->n == 0)
    rc = acl_err(err, errlen, name, lineno, "no token in the file");
  if (rc == ECS_ENOMEM && err && errlen)
    snprintf(err, errlen, "%s: out of memory", name);
  if (rc != ECS_OK) {
    ecs__acl_free(a);
    return rc;
  }
  *out = a;
  return ECS_OK;
}

int ecs__acl_load(const char *path, ecs__acl_t **out, char *err, size_t errlen) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return ECS_EINVAL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s: not a regular file", path);
    close(fd);
    return ECS_EINVAL;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    snprintf(err, errlen,
             "%s: permissions %04o are too open (group or others may access it); run: chmod 600 '%s'", path,
             (unsigned)(st.st_mode & 07777), path);
    close(fd);
    return ECS_EINVAL;
  }
  if ((uint64_t)st.st_size > ACL_MAX_FILE) {
    snprintf(err, errlen, "%s: larger than %u bytes", path, ACL_MAX_FILE);
    close(fd);
    return ECS_EINVAL;
  }
  size_t cap = (size_t)st.st_size + 1, got = 0;
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return ECS_ENOMEM;
  }
  for (;;) {
    ssize_t r = read(fd, buf + got, cap - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      snprintf(err, errlen, "%s: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return ECS_EINVAL;
    }
    if (r == 0)
      break;
    got += (size_t)r;
    if (got == cap) { /* grew since fstat: refuse rather than read a moving file */
      snprintf(err, errlen, "%s: changed while being read", path);
      free(buf);
      close(fd);
      return ECS_EINVAL;
    }
  }
  close(fd);
  int rc = ecs__acl_parse(buf, got, path, out, err, errlen);
  memset(buf, 0, got);
  free(buf);
  return rc;
}

unsigned ecs__acl_rights(const ecs__acl_t *a, const void *token, size_t len, const char *ns, int *known) {
  unsigned rights = 0;
  int found = 0;
  if (a == NULL)
    return 0;
  /* Every entry is compared, whatever matched before, so the time taken
   * does not depend on where (or whether) the token is. */
  for (size_t i = 0; i < a->n; i++) {
    int eq = ecs_ct_equal(token, len, a->e[i].token, a->e[i].token_len);
    if (!eq)
      continue;
    found = 1;
    int ok = a->e[i].any_ns;
    for (size_t k = 0; !ok && k < a->e[i].nns; k++)
      ok = !strcmp(a->e[i].ns[k], ns);
    if (ok)
      rights = a->e[i].rights;
  }
  if (known)
    *known = found;
  return rights;
}

const char *ecs__acl_entry(const ecs__acl_t *a, size_t i, const char *ns, size_t *len, unsigned *rights) {
  const acl_entry_t *e = &a->e[i];
  int ok = e->any_ns;
  for (size_t k = 0; !ok && k < e->nns; k++)
    ok = !strcmp(e->ns[k], ns);
  *rights = ok ? e->rights : 0;
  *len = e->token_len;
  return e->token;
}

void ecs__acl_entry_quota(const ecs__acl_t *a, size_t i, ecs__acl_quota_t *q) {
  *q = a->e[i].quota;
}
