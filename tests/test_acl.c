/*
 * test_acl: the ACL file parser and lookup (store/server/acl.h), on bytes: good
 * files, every malformed line the parser must refuse with FILE:LINE, and
 * hostile input (NUL bytes, huge lines, thousands of entries, random
 * bytes); and the loader's permission check on a real file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/error.h"
#include "store/server/acl.h"
#include "support/ts.h"

static ecs__acl_t *parse_ok(const char *text) {
  ecs__acl_t *a = NULL;
  char err[256] = "";
  int rc = ecs__acl_parse(text, strlen(text), "acl", &a, err, sizeof err);
  if (rc != ECS_OK)
    fprintf(stderr, "unexpected: %s\n", err);
  assert_int_equal(rc, ECS_OK);
  assert_non_null(a);
  return a;
}

static unsigned rights(const ecs__acl_t *a, const char *tok, const char *ns, int *known) {
  return ecs__acl_rights(a, tok, strlen(tok), ns, known);
}

static void test_good_file(void **state) {
  (void)state;
  ecs__acl_t *a = parse_ok("# TOKEN NAMESPACES RIGHTS\n"
                           "\n"
                           "   \t\n"
                           "reader   model-a,model-b   read   # a trailing comment\n"
                           "writer\tmodel-a\tread,write\r\n"
                           "ops *  all\n"
                           "remover model-a write,remove\n"
                           "h#sh model-a admin\n" /* '#' inside a token is part of it */
                           "last model-c read");  /* no final newline */
  assert_int_equal(ecs__acl_count(a), 6);
  int known = -1;
  assert_int_equal(rights(a, "reader", "model-a", &known), ECS__RIGHT_READ);
  assert_int_equal(known, 1);
  assert_int_equal(rights(a, "reader", "model-b", NULL), ECS__RIGHT_READ);
  assert_int_equal(rights(a, "reader", "model-c", &known), 0); /* known, not allowed there */
  assert_int_equal(known, 1);
  assert_int_equal(rights(a, "writer", "model-a", NULL), ECS__RIGHT_READ | ECS__RIGHT_WRITE);
  assert_int_equal(rights(a, "ops", "anything", NULL), ECS__RIGHT_ALL);
  assert_int_equal(rights(a, "remover", "model-a", NULL), ECS__RIGHT_WRITE | ECS__RIGHT_REMOVE);
  assert_int_equal(rights(a, "h#sh", "model-a", NULL), ECS__RIGHT_ADMIN);
  assert_int_equal(rights(a, "last", "model-c", NULL), ECS__RIGHT_READ);
  /* unknown tokens, prefixes and extensions of known ones */
  assert_int_equal(rights(a, "nobody", "model-a", &known), 0);
  assert_int_equal(known, 0);
  assert_int_equal(rights(a, "read", "model-a", &known), 0);
  assert_int_equal(known, 0);
  assert_int_equal(rights(a, "readerX", "model-a", &known), 0);
  assert_int_equal(known, 0);
  assert_int_equal(ecs__acl_rights(a, "reader\0", 7, "model-a", &known), 0);
  assert_int_equal(known, 0);
  assert_int_equal(ecs__acl_rights(a, "", 0, "model-a", &known), 0);
  assert_int_equal(known, 0);
  /* namespaces match exactly */
  assert_int_equal(rights(a, "reader", "model-", NULL), 0);
  assert_int_equal(rights(a, "reader", "model-a,model-b", NULL), 0);
  assert_int_equal(rights(a, "reader", "*", NULL), 0);
  char buf[64];
  assert_string_equal(ecs__acl_rights_str(ECS__RIGHT_READ | ECS__RIGHT_REMOVE, buf, sizeof buf),
                      "read,remove");
  assert_string_equal(ecs__acl_rights_str(0, buf, sizeof buf), "none");
  ecs__acl_free(a);
  ecs__acl_free(NULL);
}

/* Every malformed line is refused, naming the file and the line. */
static void test_malformed_lines(void **state) {
  (void)state;
  static const struct {
    const char *text;
    const char *where; /* "acl:LINE:" expected in the message */
    const char *what;  /* and this */
  } bad[] = {
      {"tok ns\n", "acl:1:", "2 fields"},
      {"tok\n", "acl:1:", "1 fields"},
      {"# c\ntok ns read stored=1M extra\n", "acl:2:", "more than 4"},
      {"tok ns read extra\n", "acl:1:", "quota field"},
      {"tok ns read stored=0\n", "acl:1:", "quota field"},
      {"tok ns read stored=12Q\n", "acl:1:", "quota field"},
      {"tok ns read pins=-1\n", "acl:1:", "quota field"},
      {"tok ns read bytes=1M\n", "acl:1:", "quota field"},
      {"tok ns reed\n", "acl:1:", "rights"},
      {"tok ns read,\n", "acl:1:", "rights"},
      {"tok ns ,\n", "acl:1:", "rights"},
      {"tok ns READ\n", "acl:1:", "rights"},
      {"tok ns,,b read\n", "acl:1:", "empty namespace"},
      {"tok ,ns read\n", "acl:1:", "empty namespace"},
      {"tok ns, read\n", "acl:1:", "empty namespace"},
      {"tok a,* read\n", "acl:1:", "'*' alone"},
      {"a ns read\nb ns read\na other write\n", "acl:3:", "line 1 appears again"},
      {"tok\x01x ns read\n", "acl:1:", "control character"},
      {"tok ns read\nb\0c ns read\n", "acl:2:", "NUL byte"},
      {"", "acl:0:", "no token"},
      {"# only a comment\n\n", "acl:2:", "no token"},
      {"#tok ns read\n", "acl:1:", "no token"}, /* a comment, not a token */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t len = strlen(bad[i].text);
    if (strstr(bad[i].what, "NUL"))
      len = sizeof "tok ns read\nb\0c ns read\n" - 1;
    ecs__acl_t *a = (ecs__acl_t *)1;
    char err[256] = "";
    int rc = ecs__acl_parse(bad[i].text, len, "acl", &a, err, sizeof err);
    if (rc != ECS_EINVAL || a != NULL || !strstr(err, bad[i].where) || !strstr(err, bad[i].what))
      fail_msg("case %zu: rc %d, err '%s' (want %s ... %s)", i, rc, err, bad[i].where, bad[i].what);
  }
}

/* The optional quota field. */
static void test_quota_field(void **state) {
  (void)state;
  const char *text = "q ns read,write stored=16M,pinned=4M,pins=8\nr ns read pins=2\nn ns read\n";
  ecs__acl_t *a = NULL;
  char err[256] = "";
  assert_int_equal(ecs__acl_parse(text, strlen(text), "acl", &a, err, sizeof err), ECS_OK);
  ecs__acl_quota_t q;
  ecs__acl_entry_quota(a, 0, &q);
  assert_int_equal(q.stored, 16u << 20);
  assert_int_equal(q.pinned, 4u << 20);
  assert_int_equal(q.pins, 8);
  ecs__acl_entry_quota(a, 1, &q);
  assert_int_equal(q.stored, 0);
  assert_int_equal(q.pins, 2);
  ecs__acl_entry_quota(a, 2, &q);
  assert_int_equal(q.stored | q.pinned | q.pins, 0);
  ecs__acl_free(a);
}

/* Sizes at and past every limit. */
static void test_limits(void **state) {
  (void)state;
  char *big = malloc(ECS__ACL_MAX_LINE + 64);
  assert_non_null(big);
  char err[256];
  ecs__acl_t *a;
  /* a token of 256 bytes is fine, 257 is not */
  memset(big, 'k', 256);
  snprintf(big + 256, 64, " ns read\n");
  a = parse_ok(big);
  ecs__acl_free(a);
  memset(big, 'k', 257);
  snprintf(big + 257, 64, " ns read\n");
  assert_int_equal(ecs__acl_parse(big, strlen(big), "acl", &a, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "token longer than 256"));
  /* a namespace of 129 bytes */
  snprintf(big, 16, "tok ");
  memset(big + 4, 'n', 129);
  snprintf(big + 4 + 129, 64, " read\n");
  assert_int_equal(ecs__acl_parse(big, strlen(big), "acl", &a, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "namespace must be"));
  /* a line past the bound */
  memset(big, ' ', ECS__ACL_MAX_LINE + 10);
  big[ECS__ACL_MAX_LINE + 10] = '\0';
  assert_int_equal(ecs__acl_parse(big, strlen(big), "acl", &a, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "acl:1: line longer than"));
  free(big);
  /* the entry limit */
  size_t cap = (ECS__ACL_MAX_ENTRIES + 1) * 24;
  char *many = malloc(cap);
  assert_non_null(many);
  size_t used = 0;
  for (int i = 0; i < ECS__ACL_MAX_ENTRIES; i++)
    used += (size_t)snprintf(many + used, cap - used, "t%d ns read\n", i);
  a = parse_ok(many);
  assert_int_equal(ecs__acl_count(a), ECS__ACL_MAX_ENTRIES);
  assert_int_equal(rights(a, "t4095", "ns", NULL), ECS__RIGHT_READ);
  ecs__acl_free(a);
  used += (size_t)snprintf(many + used, cap - used, "one-more ns read\n");
  assert_int_equal(ecs__acl_parse(many, used, "acl", &a, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "more than 4096 tokens"));
  free(many);
}

/* Random and mutated bytes: never a crash (ASan watches), and either a
 * clean refusal or a table whose lookups work. */
static void test_hostile_bytes(void **state) {
  (void)state;
  const char *seed = "reader a,b read\nwriter a read,write # c\nops * all\n";
  size_t sl = strlen(seed);
  char buf[256];
  uint32_t x = 12345;
  for (int iter = 0; iter < 20000; iter++) {
    memcpy(buf, seed, sl);
    size_t len = sl;
    int flips = 1 + iter % 8;
    for (int k = 0; k < flips; k++) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      size_t at = x % len;
      buf[at] = (char)(x >> 8);
      if (iter % 5 == 0)
        len = at + 1 + (x >> 20) % (len - at); /* truncated too */
    }
    if (iter % 97 == 0) { /* pure noise */
      for (size_t k = 0; k < sizeof buf; k++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        buf[k] = (char)x;
      }
      len = sizeof buf;
    }
    ecs__acl_t *a = NULL;
    char err[256];
    int rc = ecs__acl_parse(buf, len, "fuzz", &a, err, sizeof err);
    assert_true(rc == ECS_OK || rc == ECS_EINVAL);
    if (rc == ECS_OK) {
      (void)rights(a, "reader", "a", NULL);
      (void)ecs__acl_rights(a, buf, len > 64 ? 64 : len, "a", NULL);
    } else {
      assert_non_null(strstr(err, "fuzz:"));
    }
    ecs__acl_free(a);
  }
}

/* The loader refuses a file group or others may read, and a missing one,
 * with messages that say what to do. */
static void test_load_permissions(void **state) {
  (void)state;
  char dir[256], path[300];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(path, sizeof path, "%s/acl", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("tok test read\n", f);
  fclose(f);
  ecs__acl_t *a = NULL;
  char err[512];
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(ecs__acl_load(path, &a, err, sizeof err), ECS_EINVAL);
  assert_null(a);
  assert_non_null(strstr(err, "too open"));
  assert_non_null(strstr(err, "chmod 600"));
  assert_int_equal(chmod(path, 0640), 0);
  assert_int_equal(ecs__acl_load(path, &a, err, sizeof err), ECS_EINVAL);
  assert_int_equal(chmod(path, 0600), 0);
  assert_int_equal(ecs__acl_load(path, &a, err, sizeof err), ECS_OK);
  assert_int_equal(rights(a, "tok", "test", NULL), ECS__RIGHT_READ);
  ecs__acl_free(a);
  unlink(path);
  assert_int_equal(ecs__acl_load(path, &a, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "No such file"));
  assert_int_equal(ecs__acl_load(dir, &a, err, sizeof err), ECS_EINVAL); /* a directory */
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_file),     cmocka_unit_test(test_malformed_lines),
      cmocka_unit_test(test_quota_field),   cmocka_unit_test(test_limits),
      cmocka_unit_test(test_hostile_bytes), cmocka_unit_test(test_load_permissions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
