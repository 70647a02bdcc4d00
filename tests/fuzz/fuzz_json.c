/*
 * Fuzz target: the connector's JSON parser (ec_connector/json.c).
 *
 * Input: JSON text, parsed by ecs__json_parse.
 *
 * Invariants on a tree that parses: nesting within ECS_JSON_MAX_DEPTH;
 * every string and key valid UTF-8 (no surrogate code points), with its
 * NUL terminator where len says; count is the number of children; no two
 * members of an object share a key; and the tree written back as JSON and
 * parsed again is the same tree (types, numbers bit for bit, integers,
 * strings byte for byte).  A failed parse leaves *out NULL and says where.
 */
#include <math.h>
#include <string.h>

#include "ec_connector/json.h"
#include "ecstore/error.h"
#include "fuzz.h"

/* Valid UTF-8, as RFC 3629 has it: shortest forms, no surrogates, at most
 * U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t k;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      k = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      k = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      k = 3, cp = c & 0x07;
    } else {
      return 0;
    }
    if (n - i <= k)
      return 0;
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xc0) != 0x80)
        return 0;
      cp = cp << 6 | (s[i + j] & 0x3fu);
    }
    if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return 0;
    i += k + 1;
  }
  return 1;
}

static void check_tree(const ecs_json_t *j, int depth) {
  FUZZ_CHECK(depth <= ECS_JSON_MAX_DEPTH + 1);
  switch (j->type) {
  case ECS_JSON_STRING:
    FUZZ_CHECK(j->str != NULL && j->str[j->len] == '\0');
    FUZZ_CHECK(utf8_valid((const unsigned char *)j->str, j->len));
    break;
  case ECS_JSON_NUMBER: FUZZ_CHECK(isfinite(j->number)); break;
  case ECS_JSON_BOOL: FUZZ_CHECK(j->boolean == 0 || j->boolean == 1); break;
  case ECS_JSON_ARRAY:
  case ECS_JSON_OBJECT: {
    size_t n = 0;
    for (const ecs_json_t *c = j->child; c; c = c->next, n++) {
      if (j->type == ECS_JSON_OBJECT) {
        FUZZ_CHECK(c->key != NULL && c->key[c->key_len] == '\0');
        FUZZ_CHECK(utf8_valid((const unsigned char *)c->key, c->key_len));
        for (const ecs_json_t *d = c->next; d; d = d->next)
          FUZZ_CHECK(d->key_len != c->key_len || memcmp(d->key, c->key, c->key_len) != 0);
      } else {
        FUZZ_CHECK(c->key == NULL);
      }
      check_tree(c, depth + 1);
    }
    FUZZ_CHECK(n == j->count);
    break;
  }
  case ECS_JSON_NULL: break;
  default: FUZZ_CHECK(0 && "unknown node type");
  }
}

/* A growable text buffer for writing a tree back. */
typedef struct out {
  char *p;
  size_t len, cap;
} out_t;

static void put(out_t *o, const char *s, size_t n) {
  if (o->len + n + 1 > o->cap) {
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + n + 1)
      cap *= 2;
    o->p = realloc(o->p, cap);
    FUZZ_CHECK(o->p != NULL);
    o->cap = cap;
  }
  memcpy(o->p + o->len, s, n);
  o->len += n;
  o->p[o->len] = '\0';
}

static void put_string(out_t *o, const char *s, size_t n) {
  put(o, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == '"' || c == '\\') {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", c);
      put(o, e, 6);
    } else {
      put(o, (const char *)&c, 1);
    }
  }
  put(o, "\"", 1);
}

static void write_tree(out_t *o, const ecs_json_t *j) {
  char num[64];
  switch (j->type) {
  case ECS_JSON_NULL: put(o, "null", 4); break;
  case ECS_JSON_BOOL: j->boolean ? put(o, "true", 4) : put(o, "false", 5); break;
  case ECS_JSON_NUMBER:
    if (j->is_int) {
      snprintf(num, sizeof num, "%lld", j->integer);
    } else {
      snprintf(num, sizeof num, "%.17g", j->number);
      if (!strpbrk(num, ".eE"))
        strcat(num, ".0"); /* stays a non-integer when read back */
    }
    put(o, num, strlen(num));
    break;
  case ECS_JSON_STRING: put_string(o, j->str, j->len); break;
  case ECS_JSON_ARRAY:
  case ECS_JSON_OBJECT:
    put(o, j->type == ECS_JSON_ARRAY ? "[" : "{", 1);
    for (const ecs_json_t *c = j->child; c; c = c->next) {
      if (c != j->child)
        put(o, ",", 1);
      if (j->type == ECS_JSON_OBJECT) {
        put_string(o, c->key, c->key_len);
        put(o, ":", 1);
      }
      write_tree(o, c);
    }
    put(o, j->type == ECS_JSON_ARRAY ? "]" : "}", 1);
    break;
  }
}

static void check_same(const ecs_json_t *a, const ecs_json_t *b) {
  FUZZ_CHECK(a->type == b->type && a->count == b->count);
  FUZZ_CHECK(a->key_len == b->key_len && (!a->key || memcmp(a->key, b->key, a->key_len) == 0));
  switch (a->type) {
  case ECS_JSON_BOOL: FUZZ_CHECK(a->boolean == b->boolean); break;
  case ECS_JSON_NUMBER:
    FUZZ_CHECK(a->is_int == b->is_int);
    FUZZ_CHECK(a->is_int ? a->integer == b->integer : a->number == b->number);
    break;
  case ECS_JSON_STRING: FUZZ_CHECK(a->len == b->len && memcmp(a->str, b->str, a->len) == 0); break;
  default: break;
  }
  const ecs_json_t *x = a->child, *y = b->child;
  for (; x && y; x = x->next, y = y->next)
    check_same(x, y);
  FUZZ_CHECK(x == NULL && y == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ecs_json_t *j = (ecs_json_t *)1;
  char err[200];
  int rc = ecs__json_parse((const char *)data, size, &j, err, sizeof err);
  if (rc != ECS_OK) {
    FUZZ_CHECK(j == NULL && (rc == ECS_EINVAL || rc == ECS_ENOMEM) && err[0] != '\0');
    return 0;
  }
  FUZZ_CHECK(j != NULL && j->key == NULL);
  check_tree(j, 1);
  out_t o = {0};
  write_tree(&o, j);
  ecs_json_t *back = NULL;
  rc = ecs__json_parse(o.p, o.len, &back, err, sizeof err);
  if (rc != ECS_OK)
    fprintf(stderr, "re-parse of the written tree failed: %s\n%s\n", err, o.p);
  FUZZ_CHECK(rc == ECS_OK || o.len > ECS_JSON_MAX_INPUT);
  if (rc == ECS_OK)
    check_same(j, back);
  ecs__json_free(back);
  ecs__json_free(j);
  free(o.p);
  return 0;
}
