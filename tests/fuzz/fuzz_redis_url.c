/*
 * Fuzz target: Redis URLs, redis-sentinel:// above all (store/redis/rds_url.c):
 * "redis-sentinel://[USER:PASS@]H1:P1,H2:P2/MASTER[/DB]?sentinel_user=U&
 * sentinel_password=P", the form with the most parts and two secrets.
 *
 * Input: the URL text (NUL-terminated copy).
 *
 * Invariants on a URL that parses: every field NUL-terminated; a port in
 * 1..65535; a sentinel URL names a master of letters, digits, '.', '_' and
 * '-' and a host list; written back (ecs__rds_url_format) and parsed
 * again, the same fields; ecs__rds_url_has_password says yes when a
 * password or a sentinel password is there; and the redacted form for
 * messages (ecs__rds_url_redact) shows neither secret, as written in the
 * URL (a secret of 6 bytes or more that appears nowhere else in it).
 * ecs__rds_url_resolve never crashes and says why when it refuses.
 */
#include <string.h>

#include "ecstore/error.h"
#include "store/redis/rds.h"
#include "fuzz.h"

static ecs__rds_url_t u, u2;

#define NUL_IN(field) FUZZ_CHECK(memchr(u.field, '\0', sizeof u.field) != NULL)

/* The raw (still %-escaped) text of the secret in url: for the password,
 * between the userinfo's ':' and its '@'; for the sentinel password, after
 * "sentinel_password=" up to '&'.  Copied into out ("" when absent). */
static void raw_secret(const char *url, int sentinel_pw, char *out, size_t cap) {
  out[0] = '\0';
  const char *b = NULL, *e = NULL;
  if (sentinel_pw) {
    const char *q = strrchr(url, '?'); /* the query, as the parser takes it */
    b = q ? strstr(q, "sentinel_password=") : NULL;
    if (b) {
      b += 18;
      e = strchr(b, '&');
      if (!e)
        e = b + strlen(b);
    }
  } else {
    const char *s = strstr(url, "://");
    s = s ? s + 3 : url;
    const char *q = strchr(s, '?');
    const char *at = NULL;
    for (const char *p = s; *p && (!q || p < q); p++)
      if (*p == '@')
        at = p;
    const char *colon = at ? memchr(s, ':', (size_t)(at - s)) : NULL;
    if (colon) {
      b = colon + 1;
      e = at;
    }
  }
  if (b && e && (size_t)(e - b) < cap) {
    memcpy(out, b, (size_t)(e - b));
    out[e - b] = '\0';
  }
}

/* Whether needle occurs in hay more than once: then finding it in the
 * redacted form proves nothing. */
static int occurs_elsewhere(const char *hay, const char *needle) {
  const char *first = strstr(hay, needle);
  return first && strstr(first + 1, needle) != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  FUZZ_CHECK(s != NULL);
  memcpy(s, data, size);
  s[size] = '\0';
  char shown[2600], out[1400], err[300];
  (void)ecs__rds_url_redact(s, shown, sizeof shown);
  FUZZ_CHECK(memchr(shown, '\0', sizeof shown) != NULL);
  if (ecs__rds_url_parse(s, &u) == ECS_OK) {
    NUL_IN(host);
    NUL_IN(user);
    NUL_IN(pass);
    NUL_IN(sentinels);
    NUL_IN(master);
    NUL_IN(suser);
    NUL_IN(spass);
    NUL_IN(seeds);
    FUZZ_CHECK(u.port >= 1 && u.port <= 65535 && u.db >= 0);
    if (u.master[0]) {
      FUZZ_CHECK(u.sentinels[0] != '\0');
      for (const char *p = u.master; *p; p++)
        FUZZ_CHECK((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                   *p == '.' || *p == '_' || *p == '-');
    }
    FUZZ_CHECK(ecs__rds_url_has_password(s) == (u.pass[0] != '\0' || u.spass[0] != '\0'));
    if (ecs__rds_url_format(&u, 1, out, sizeof out) == ECS_OK) {
      FUZZ_CHECK(ecs__rds_url_parse(out, &u2) == ECS_OK);
      FUZZ_CHECK(!strcmp(u.host, u2.host) && u.port == u2.port && u.db == u2.db && !strcmp(u.user, u2.user) &&
                 !strcmp(u.pass, u2.pass) && !strcmp(u.sentinels, u2.sentinels) &&
                 !strcmp(u.master, u2.master) && u.cluster == u2.cluster && !strcmp(u.suser, u2.suser) &&
                 !strcmp(u.spass, u2.spass) && !strcmp(u.seeds, u2.seeds));
    }
    char raw[2048];
    for (int k = 0; k < 2; k++) { /* neither secret in the redacted form */
      raw_secret(s, k, raw, sizeof raw);
      const char *dec = k ? u.spass : u.pass;
      if (strlen(raw) >= 6 && dec[0] && !occurs_elsewhere(s, raw))
        FUZZ_CHECK(strstr(shown, raw) == NULL);
    }
  }
  err[0] = '\0';
  if (ecs__rds_url_resolve(s, &u, err, sizeof err) != ECS_OK)
    FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
  memset(&u, 0, sizeof u);
  free(s);
  return 0;
}
