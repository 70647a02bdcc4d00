/*
 * Redis URLs and secrets (see rds.h): parsing redis://, redis-sentinel://
 * and redis-cluster:// URLs with their credentials and query, formatting
 * and redacting them, reading a password file, resolving a URL with the
 * environment's passwords, and parsing MOVED/ASK redirections.  No I/O
 * but the password file; the links (rds.c, rds_async.c) use these.
 */
#include "store/redis/rds.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ecstore/error.h"

#define RDS_DEFAULT_PORT 6379

int ecs__rds_parse_u64(const char *s, size_t len, uint64_t *out) {
  if (len == 0 || len > 20)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    uint64_t d = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/* Decodes n bytes of %XX-escaped text at s into out (cap bytes, NUL-
 * terminated).  0, or -1 on a bad escape, a NUL or an overflow. */
static int pct_decode(const char *s, size_t n, char *out, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int ch = (unsigned char)s[i];
    if (ch == '%') {
      int v = 0;
      for (int d = 1; d <= 2; d++) {
        int x = i + (size_t)d < n ? (unsigned char)s[i + (size_t)d] : -1;
        if (x >= '0' && x <= '9')
          v = v * 16 + (x - '0');
        else if (x >= 'a' && x <= 'f')
          v = v * 16 + (x - 'a' + 10);
        else if (x >= 'A' && x <= 'F')
          v = v * 16 + (x - 'A' + 10);
        else
          return -1;
      }
      ch = v;
      i += 2;
    }
    if (ch == 0 || k + 1 >= cap)
      return -1;
    out[k++] = (char)ch;
  }
  out[k] = '\0';
  return 0;
}

/* "HOST[:PORT]" (HOST maybe a bracketed IPv6 literal), hp_len bytes at
 * url, into host (cap bytes) and port (6379 when absent).  0, or -1.  A
 * host holds none of the URL's delimiters: a '?' in one would be read back
 * as the start of a sentinel URL's query (fuzz_config found it). */
int ecs__rds_hostport(const char *url, size_t hp_len, char *host, size_t cap, int *port) {
  const char *h = url, *colon;
  size_t hlen;
  if (hp_len > 0 && url[0] == '[') {
    const char *rb = memchr(url, ']', hp_len);
    if (rb == NULL)
      return -1;
    h = url + 1;
    hlen = (size_t)(rb - h);
    colon = rb + 1 < url + hp_len ? rb + 1 : NULL;
    if (colon != NULL && *colon != ':')
      return -1;
  } else {
    colon = memchr(url, ':', hp_len);
    hlen = colon ? (size_t)(colon - url) : hp_len;
  }
  if (hlen == 0 || hlen >= cap)
    return -1;
  for (size_t i = 0; i < hlen; i++)
    if (h[i] <= ' ' || h[i] == '@' || h[i] == '/' || h[i] == '[' || h[i] == ']' || h[i] == ',' ||
        h[i] == '?' || h[i] == '#' || h[i] == 0x7f)
      return -1;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  *port = RDS_DEFAULT_PORT;
  if (colon != NULL) {
    uint64_t v;
    size_t plen = (size_t)(url + hp_len - (colon + 1));
    if (ecs__rds_parse_u64(colon + 1, plen, &v) != 0 || v == 0 || v > 65535)
      return -1;
    *port = (int)v;
  }
  return 0;
}

/* "/DB" or "" at s into *db.  0, or -1. */
static int parse_db(const char *s, int *db) {
  *db = 0;
  if (s != NULL && s[0] == '/' && s[1] != '\0') {
    uint64_t v;
    if (ecs__rds_parse_u64(s + 1, strlen(s + 1), &v) != 0 || v > 1000000)
      return -1;
    *db = (int)v;
  }
  return 0;
}

/* A list of "HOST[:PORT]" separated by commas, len bytes at s, at most
 * max of them (no empty one); the first into host (cap bytes) and port.
 * The count, or -1. */
static int parse_hostlist(const char *s, size_t len, int max, char *host, size_t cap, int *port) {
  int n = 0;
  const char *end = s + len;
  for (const char *p = s; p < end;) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    const char *e = comma ? comma : end;
    char h[256];
    int hp;
    if (++n > max || ecs__rds_hostport(p, (size_t)(e - p), h, sizeof h, &hp) != 0)
      return -1;
    if (n == 1) {
      if (strlen(h) >= cap)
        return -1;
      snprintf(host, cap, "%s", h);
      *port = hp;
    }
    p = comma ? comma + 1 : end;
    if (comma != NULL && p == end)
      return -1; /* a trailing comma */
  }
  return n;
}

/* The query of a redis-sentinel:// URL (after its last '?'):
 * "sentinel_user=U&sentinel_password=P", either or both, %XX-escaped.
 * 0, or -1 when it is anything else (then it is no query). */
static int parse_query(const char *q, ecs__rds_url_t *u) {
  char user[sizeof u->suser] = "", pass[sizeof u->spass] = "";
  int rc = 0;
  while (rc == 0 && *q) {
    const char *amp = strchr(q, '&'), *end = amp ? amp : q + strlen(q);
    const char *eq = memchr(q, '=', (size_t)(end - q));
    if (eq == NULL || eq + 1 == end)
      rc = -1;
    else if ((size_t)(eq - q) == 13 && memcmp(q, "sentinel_user", 13) == 0)
      rc = pct_decode(eq + 1, (size_t)(end - eq - 1), user, sizeof user);
    else if ((size_t)(eq - q) == 17 && memcmp(q, "sentinel_password", 17) == 0)
      rc = pct_decode(eq + 1, (size_t)(end - eq - 1), pass, sizeof pass);
    else
      rc = -1;
    q = amp ? amp + 1 : end;
    if (amp != NULL && *q == '\0')
      rc = -1;
  }
  if (rc == 0) {
    memcpy(u->suser, user, sizeof user);
    memcpy(u->spass, pass, sizeof pass);
  }
  memset(pass, 0, sizeof pass);
  return rc;
}

/* The sentinel part of a redis-sentinel:// URL, "H1:P1,H2:P2/NAME[/DB]". */
static int parse_sentinel(const char *url, ecs__rds_url_t *u) {
  const char *slash = strchr(url, '/');
  if (slash == NULL || (size_t)(slash - url) >= sizeof u->sentinels)
    return ECS_EINVAL;
  if (parse_hostlist(url, (size_t)(slash - url), ECS_RDS_MAX_SENTINELS, u->host, sizeof u->host, &u->port) <
      1)
    return ECS_EINVAL;
  memcpy(u->sentinels, url, (size_t)(slash - url));
  u->sentinels[slash - url] = '\0';
  const char *name = slash + 1, *dbs = strchr(name, '/');
  size_t nlen = dbs ? (size_t)(dbs - name) : strlen(name);
  if (nlen == 0 || nlen >= sizeof u->master)
    return ECS_EINVAL;
  for (size_t i = 0; i < nlen; i++) { /* letters, digits, '.', '_', '-' */
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
          ch == '_' || ch == '-'))
      return ECS_EINVAL;
  }
  memcpy(u->master, name, nlen);
  u->master[nlen] = '\0';
  return parse_db(dbs, &u->db) == 0 ? ECS_OK : ECS_EINVAL;
}

int ecs__rds_url_parse(const char *url, ecs__rds_url_t *u) {
  if (url == NULL || u == NULL)
    return ECS_EINVAL;
  memset(u, 0, sizeof *u);
  char copy[2048]; /* the URL, its query cut off */
  if (strlen(url) >= sizeof copy)
    return ECS_EINVAL;
  int sentinel = 0, cluster = 0;
  if (strncmp(url, "redis://", 8) == 0) {
    url += 8;
  } else if (strncmp(url, "redis-cluster://", 16) == 0) {
    url += 16;
    cluster = 1;
  } else if (strncmp(url, "redis-sentinel://", 17) == 0) {
    url += 17;
    sentinel = 1;
  } else if (strstr(url, "://") != NULL) {
    return ECS_EINVAL;
  }
  snprintf(copy, sizeof copy, "%s", url);
  url = copy;
  char *q = sentinel ? strrchr(copy, '?') : NULL;
  if (q != NULL && parse_query(q + 1, u) == 0)
    *q = '\0';
  /* userinfo: up to the last '@' (a password may hold one, escaped or not) */
  const char *at = strrchr(url, '@');
  if (at != NULL) {
    const char *colon = memchr(url, ':', (size_t)(at - url));
    size_t ulen = colon ? (size_t)(colon - url) : (size_t)(at - url);
    if (pct_decode(url, ulen, u->user, sizeof u->user) != 0)
      goto bad;
    if (colon != NULL && pct_decode(colon + 1, (size_t)(at - colon - 1), u->pass, sizeof u->pass) != 0)
      goto bad;
    if (u->user[0] == '\0' && u->pass[0] == '\0')
      goto bad; /* "@host" or ":@host" */
    url = at + 1;
  }
  if (sentinel) {
    if (parse_sentinel(url, u) != ECS_OK)
      goto bad;
    memset(copy, 0, sizeof copy);
    return ECS_OK;
  }
  const char *slash = strchr(url, '/');
  size_t hp_len = slash ? (size_t)(slash - url) : strlen(url);
  if (parse_db(slash, &u->db) != 0)
    goto bad;
  if (cluster && memchr(url, ',', hp_len) != NULL) { /* a seed list */
    if (hp_len >= sizeof u->seeds ||
        parse_hostlist(url, hp_len, ECS_RDS_MAX_SEEDS, u->host, sizeof u->host, &u->port) < 2)
      goto bad;
    memcpy(u->seeds, url, hp_len);
    u->seeds[hp_len] = '\0';
  } else if (ecs__rds_hostport(url, hp_len, u->host, sizeof u->host, &u->port) != 0) {
    goto bad;
  }
  u->cluster = cluster;
  memset(copy, 0, sizeof copy);
  return ECS_OK;
bad:
  memset(copy, 0, sizeof copy);
  memset(u, 0, sizeof *u);
  return ECS_EINVAL;
}

int ecs__rds_redirect(const char *s, size_t len, char *host, size_t cap, int *port) {
  int kind;
  size_t k;
  if (len > 6 && memcmp(s, "MOVED ", 6) == 0)
    kind = 1, k = 6;
  else if (len > 4 && memcmp(s, "ASK ", 4) == 0)
    kind = 2, k = 4;
  else
    return 0;
  size_t slot0 = k;
  while (k < len && s[k] >= '0' && s[k] <= '9')
    k++;
  if (k == slot0 || k - slot0 > 5 || k >= len || s[k] != ' ')
    return 0;
  const char *hp = s + k + 1;
  size_t hl = len - k - 1;
  const char *colon = NULL;
  for (size_t i = 0; i < hl; i++)
    if (hp[i] == ':')
      colon = hp + i; /* the last one: an IPv6 address holds several */
  if (colon == NULL)
    return 0;
  uint64_t v;
  size_t plen = (size_t)(hp + hl - colon - 1), hlen = (size_t)(colon - hp);
  if (ecs__rds_parse_u64(colon + 1, plen, &v) != 0 || v == 0 || v > 65535 || hlen >= cap)
    return 0;
  for (size_t i = 0; i < hlen; i++)
    if (hp[i] <= ' ' || hp[i] == 0x7f || hp[i] == '/' || hp[i] == '@')
      return 0;
  if (hlen > 0) {
    memcpy(host, hp, hlen);
    host[hlen] = '\0';
  }
  *port = (int)v;
  return kind;
}

int ecs__rds_parse_url(const char *url, char *host, size_t hostcap, int *port, int *db) {
  ecs__rds_url_t u;
  int rc = ecs__rds_url_parse(url, &u);
  if (rc == ECS_OK && strlen(u.host) >= hostcap)
    rc = ECS_EINVAL;
  if (rc == ECS_OK) {
    snprintf(host, hostcap, "%s", u.host);
    *port = u.port;
    *db = u.db;
  }
  memset(u.pass, 0, sizeof u.pass);
  return rc;
}

int ecs__rds_url_has_password(const char *url) {
  ecs__rds_url_t u;
  int has = ecs__rds_url_parse(url, &u) == ECS_OK && (u.pass[0] != '\0' || u.spass[0] != '\0');
  memset(&u, 0, sizeof u);
  /* one that does not parse may still hold one: "user:pw@" then junk */
  return has || (url != NULL && strchr(url, '@') != NULL && ecs__rds_url_parse(url, &u) != ECS_OK);
}

/* url with the value of its "sentinel_password=" (up to the next '&')
 * replaced by "***" into out. */
static const char *redact_query(const char *url, char *out, size_t cap) {
  const char *q = strrchr(url, '?');
  const char *k = q && strncmp(q + 1, "sentinel_", 9) == 0 ? strstr(q, "sentinel_password=") : NULL;
  if (k == NULL) {
    snprintf(out, cap, "%s", url);
    return out;
  }
  k += 18;
  const char *amp = strchr(k, '&');
  snprintf(out, cap, "%.*s***%s", (int)(k - url), url, amp ? amp : "");
  return out;
}

const char *ecs__rds_url_redact(const char *url, char *out, size_t cap) {
  if (url == NULL) {
    snprintf(out, cap, "(none)");
    return out;
  }
  char tmp[2048];
  if (strncmp(url, "redis-sentinel://", 17) == 0 && strlen(url) < sizeof tmp)
    url = redact_query(url, tmp, sizeof tmp);
  const char *q = strrchr(url, '?');
  const char *at = strrchr(url, '@');
  if (at != NULL && q != NULL && at > q && strncmp(q + 1, "sentinel_", 9) == 0 &&
      strncmp(url, "redis-sentinel://", 17) == 0) {
    /* an '@' after the query's start: the userinfo ends before it */
    const char *at2 = NULL;
    for (const char *p = url; p < q; p++)
      if (*p == '@')
        at2 = p;
    at = at2;
  }
  if (at == NULL) {
    snprintf(out, cap, "%s", url);
    return out;
  }
  const char *base = strncmp(url, "redis://", 8) == 0             ? url + 8
                     : strncmp(url, "redis-sentinel://", 17) == 0 ? url + 17
                     : strncmp(url, "redis-cluster://", 16) == 0  ? url + 16
                                                                  : url;
  const char *colon = base < at ? memchr(base, ':', (size_t)(at - base)) : NULL;
  if (colon == NULL) /* a user alone: nothing secret */
    snprintf(out, cap, "%s", url);
  else
    snprintf(out, cap, "%.*s:***%s", (int)(colon - url), url, at);
  memset(tmp, 0, sizeof tmp);
  return out;
}

/* Appends s %XX-escaped (everything but unreserved characters) at out+*k. */
static int pct_encode(const char *s, char *out, size_t cap, size_t *k) {
  static const char hex[] = "0123456789ABCDEF";
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                ch == '-' || ch == '_' || ch == '.' || ch == '~';
    if (*k + (plain ? 1 : 3) >= cap)
      return -1;
    if (plain) {
      out[(*k)++] = (char)ch;
    } else {
      out[(*k)++] = '%';
      out[(*k)++] = hex[ch >> 4];
      out[(*k)++] = hex[ch & 15];
    }
  }
  out[*k] = '\0';
  return 0;
}

int ecs__rds_url_format(const ecs__rds_url_t *u, int with_pass, char *out, size_t cap) {
  size_t k = 0;
  int n = snprintf(out, cap, "%s",
                   u->master[0] ? "redis-sentinel://"
                   : u->cluster ? "redis-cluster://"
                                : "redis://");
  if (n < 0 || (size_t)n >= cap)
    return ECS_EINVAL;
  k = (size_t)n;
  int pass = with_pass && u->pass[0];
  if ((u->user[0] || pass) && pct_encode(u->user, out, cap, &k) != 0)
    return ECS_EINVAL;
  if (pass) {
    if (k + 1 >= cap)
      return ECS_EINVAL;
    out[k++] = ':';
    if (pct_encode(u->pass, out, cap, &k) != 0)
      return ECS_EINVAL;
  }
  if (u->master[0]) {
    n = snprintf(out + k, cap - k, "%s%s/%s/%d", (u->user[0] || pass) ? "@" : "", u->sentinels, u->master,
                 u->db);
    if (n < 0 || (size_t)n >= cap - k)
      return ECS_EINVAL;
    k += (size_t)n;
    int spass = with_pass && u->spass[0];
    const char *sep = "?";
    if (u->suser[0]) {
      n = snprintf(out + k, cap - k, "?sentinel_user=");
      if (n < 0 || (size_t)n >= cap - k)
        return ECS_EINVAL;
      k += (size_t)n;
      if (pct_encode(u->suser, out, cap, &k) != 0)
        return ECS_EINVAL;
      sep = "&";
    }
    if (spass) {
      n = snprintf(out + k, cap - k, "%ssentinel_password=", sep);
      if (n < 0 || (size_t)n >= cap - k)
        return ECS_EINVAL;
      k += (size_t)n;
      if (pct_encode(u->spass, out, cap, &k) != 0)
        return ECS_EINVAL;
    }
    return ECS_OK;
  }
  if (u->seeds[0]) {
    n = snprintf(out + k, cap - k, "%s%s/%d", (u->user[0] || pass) ? "@" : "", u->seeds, u->db);
    return n < 0 || (size_t)n >= cap - k ? ECS_EINVAL : ECS_OK;
  }
  int v6 = strchr(u->host, ':') != NULL;
  n = snprintf(out + k, cap - k, "%s%s%s%s:%d/%d", (u->user[0] || pass) ? "@" : "", v6 ? "[" : "", u->host,
               v6 ? "]" : "", u->port, u->db);
  if (n < 0 || (size_t)n >= cap - k)
    return ECS_EINVAL;
  return ECS_OK;
}

int ecs__rds_auth_argv(const ecs__rds_url_t *u, const char *argv[3], size_t lens[3]) {
  if (u->pass[0] == '\0')
    return 0;
  int n = 0;
  argv[n] = "AUTH", lens[n++] = 4;
  if (u->user[0])
    argv[n] = u->user, lens[n] = strlen(u->user), n++;
  argv[n] = u->pass, lens[n] = strlen(u->pass), n++;
  return n;
}

int ecs__rds_read_secret(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  out[0] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return ECS_EINVAL;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    close(fd);
    snprintf(err, errlen,
             "%s: permissions %04o are too open (group or others may access it); run: chmod 600 '%s'", path,
             (unsigned)(st.st_mode & 07777), path);
    return ECS_EINVAL;
  }
  char buf[512];
  ssize_t n;
  do {
    n = read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n < 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return ECS_EINVAL;
  }
  buf[n] = '\0';
  size_t len = strcspn(buf, "\r\n");
  int ok = len > 0 && len < cap && memchr(buf, '\0', len) == NULL;
  if (ok) {
    memcpy(out, buf, len);
    out[len] = '\0';
  } else {
    snprintf(err, errlen, "%s: expected the password on the first line (1..%zu bytes)", path, cap - 1);
  }
  memset(buf, 0, sizeof buf);
  return ok ? ECS_OK : ECS_EINVAL;
}

int ecs__rds_url_resolve(const char *url, ecs__rds_url_t *u, char *err, size_t errlen) {
  if (url == NULL || url[0] == '\0') {
    snprintf(err, errlen, "no redis_url configured");
    return ECS_EINVAL;
  }
  if (ecs__rds_url_parse(url, u) != ECS_OK) {
    char shown[256], port[256];
    const char *bad = ecs__rds_url_port_problem(url, port, sizeof port);
    snprintf(err, errlen, "bad redis_url \"%.200s\"%s%s", ecs__rds_url_redact(url, shown, sizeof shown),
             bad ? ": " : "", bad ? bad : "");
    memset(u, 0, sizeof *u);
    return ECS_EINVAL;
  }
  const char *env = getenv("ECSTORE_REDIS_PASSWORD");
  if (!u->pass[0] && env != NULL) {
    if (strlen(env) >= sizeof u->pass) {
      snprintf(err, errlen, "ECSTORE_REDIS_PASSWORD longer than %zu bytes", sizeof u->pass - 1);
      memset(u, 0, sizeof *u);
      return ECS_EINVAL;
    }
    snprintf(u->pass, sizeof u->pass, "%s", env);
  }
  if (u->user[0] && !u->pass[0]) {
    snprintf(err, errlen,
             "redis_url names user '%.100s' but no password: put it in the URL of a config file, "
             "in a password file or in ECSTORE_REDIS_PASSWORD",
             u->user);
    memset(u, 0, sizeof *u);
    return ECS_EINVAL;
  }
  /* the sentinels' own password: never the master's (docs/redis-ha.md) */
  const char *senv = getenv("ECSTORE_SENTINEL_PASSWORD");
  if (u->master[0] && !u->spass[0] && senv != NULL && senv[0]) {
    if (strlen(senv) >= sizeof u->spass) {
      snprintf(err, errlen, "ECSTORE_SENTINEL_PASSWORD longer than %zu bytes", sizeof u->spass - 1);
      memset(u, 0, sizeof *u);
      return ECS_EINVAL;
    }
    snprintf(u->spass, sizeof u->spass, "%s", senv);
  }
  if (u->suser[0] && !u->spass[0]) {
    snprintf(err, errlen,
             "redis_url names sentinel_user '%.100s' but no sentinel password: put it in the URL of a "
             "config file, in a sentinel password file or in ECSTORE_SENTINEL_PASSWORD",
             u->suser);
    memset(u, 0, sizeof *u);
    return ECS_EINVAL;
  }
  return ECS_OK;
}

const char *ecs__rds_url_port_problem(const char *url, char *out, size_t cap) {
  if (url == NULL)
    return NULL;
  const char *p = strstr(url, "://");
  p = p ? p + 3 : url;
  const char *end = p + strcspn(p, "/?");
  const char *at = NULL; /* userinfo ends at the last '@' before the path */
  for (const char *q = p; q < end; q++)
    if (*q == '@')
      at = q;
  if (at != NULL)
    p = at + 1;
  while (p < end) {
    const char *e = memchr(p, ',', (size_t)(end - p));
    if (e == NULL)
      e = end;
    const char *colon;
    if (*p == '[') {
      const char *rb = memchr(p, ']', (size_t)(e - p));
      colon = rb && rb + 1 < e && rb[1] == ':' ? rb + 1 : NULL;
    } else {
      colon = memchr(p, ':', (size_t)(e - p));
    }
    if (colon != NULL) {
      int hlen = (int)(colon - p), plen = (int)(e - colon - 1);
      uint64_t v;
      if (plen == 0) {
        snprintf(out, cap, "'%.*s' has an empty port", hlen + 1, p);
        return out;
      }
      if (ecs__rds_parse_u64(colon + 1, (size_t)plen, &v) != 0) {
        snprintf(out, cap, "port '%.*s' of '%.*s' is not a number", plen > 32 ? 32 : plen, colon + 1,
                 (int)(e - p) > 160 ? 160 : (int)(e - p), p);
        return out;
      }
      if (v == 0 || v > 65535) {
        snprintf(out, cap, "port %llu of '%.*s' is out of range (1..65535)", (unsigned long long)v,
                 (int)(e - p) > 160 ? 160 : (int)(e - p), p);
        return out;
      }
    }
    p = e < end ? e + 1 : end;
  }
  return NULL;
}
