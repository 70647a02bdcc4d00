/*
 * Strict JSON parser: recursive descent with an explicit depth bound.
 * See json.h for what "strict" means here.
 */
#include "ec_connector/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/error.h"

typedef struct jp {
  const char *s; /* input */
  size_t len;    /* input length */
  size_t pos;    /* next byte */
  int depth;     /* current nesting */
  int oom;       /* an allocation failed */
  char *err;     /* where the message goes */
  size_t errlen; /* its capacity */
} jp_t;

/* A growable byte buffer for decoded strings. */
typedef struct jbuf {
  char *p;
  size_t len, cap;
} jbuf_t;

__attribute__((format(printf, 2, 3))) static int jp_fail(jp_t *p, const char *fmt, ...) {
  if (p->err && p->errlen) {
    int k = snprintf(p->err, p->errlen, "offset %zu: ", p->pos);
    if (k >= 0 && (size_t)k < p->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  return ECS_EINVAL;
}

static int jbuf_put(jbuf_t *b, const char *src, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 32;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *q = realloc(b->p, cap);
    if (q == NULL)
      return ECS_ENOMEM;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
  b->p[b->len] = '\0';
  return ECS_OK;
}

static void skip_ws(jp_t *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      break;
    p->pos++;
  }
}

static ecs_json_t *node_new(jp_t *p, ecs_json_type_t t) {
  ecs_json_t *j = calloc(1, sizeof *j);
  if (j == NULL) {
    p->oom = 1;
    return NULL;
  }
  j->type = t;
  j->offset = p->pos;
  return j;
}

static int parse_value(jp_t *p, ecs_json_t **out);

static int hex4(jp_t *p, uint32_t *out) {
  if (p->len - p->pos < 4)
    return jp_fail(p, "truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->s[p->pos + (size_t)i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (uint32_t)(c - 'A' + 10);
    else
      return jp_fail(p, "bad hex digit in \\u escape");
  }
  p->pos += 4;
  *out = v;
  return ECS_OK;
}

static int put_utf8(jbuf_t *b, uint32_t cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) {
    u[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12));
    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  return jbuf_put(b, u, n);
}

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when invalid
 * (overlong forms, surrogates and values above U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t k;
  uint32_t cp, min;
  if (c < 0x80)
    return 1;
  if ((c & 0xE0) == 0xC0) {
    k = 2;
    cp = c & 0x1F;
    min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    k = 3;
    cp = c & 0x0F;
    min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    k = 4;
    cp = c & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  if (n < k)
    return 0;
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return k;
}

/* Parses a string at p->pos (which is at the opening quote). */
static int parse_string(jp_t *p, char **out, size_t *out_len) {
  jbuf_t b = {0};
  int rc;
  p->pos++; /* opening quote */
  if (jbuf_put(&b, "", 0) != ECS_OK)
    goto oom;
  for (;;) {
    if (p->pos >= p->len) {
      rc = jp_fail(p, "unterminated string");
      goto fail;
    }
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"') {
      p->pos++;
      break;
    }
    if (c < 0x20) {
      rc = jp_fail(p, "raw control character 0x%02x in string", c);
      goto fail;
    }
    if (c != '\\') {
      size_t k = utf8_seq((const unsigned char *)p->s + p->pos, p->len - p->pos);
      if (k == 0) {
        rc = jp_fail(p, "invalid UTF-8 in string");
        goto fail;
      }
      if (jbuf_put(&b, p->s + p->pos, k) != ECS_OK)
        goto oom;
      p->pos += k;
      continue;
    }
    p->pos++;
    if (p->pos >= p->len) {
      rc = jp_fail(p, "unterminated escape");
      goto fail;
    }
    char e = p->s[p->pos++];
    char lit;
    switch (e) {
    case '"': lit = '"'; break;
    case '\\': lit = '\\'; break;
    case '/': lit = '/'; break;
    case 'b': lit = '\b'; break;
    case 'f': lit = '\f'; break;
    case 'n': lit = '\n'; break;
    case 'r': lit = '\r'; break;
    case 't': lit = '\t'; break;
    case 'u': {
      uint32_t cp;
      if ((rc = hex4(p, &cp)) != ECS_OK)
        goto fail;
      if (cp >= 0xDC00 && cp <= 0xDFFF) {
        rc = jp_fail(p, "lone low surrogate in \\u escape");
        goto fail;
      }
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t lo;
        if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
          rc = jp_fail(p, "high surrogate not followed by a low one");
          goto fail;
        }
        p->pos += 2;
        if ((rc = hex4(p, &lo)) != ECS_OK)
          goto fail;
        if (lo < 0xDC00 || lo > 0xDFFF) {
          rc = jp_fail(p, "high surrogate not followed by a low one");
          goto fail;
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      if (put_utf8(&b, cp) != ECS_OK)
        goto oom;
      continue;
    }
    default:
      p->pos--;
      rc = jp_fail(p, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
      goto fail;
    }
    if (jbuf_put(&b, &lit, 1) != ECS_OK)
      goto oom;
  }
  *out = b.p;
  *out_len = b.len;
  return ECS_OK;
oom:
  p->oom = 1;
  rc = ECS_ENOMEM;
fail:
  free(b.p);
  return rc;
}

/* RFC 8259 number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int parse_number(jp_t *p, ecs_json_t *j) {
  size_t start = p->pos, i = p->pos;
  int frac = 0;
  if (i < p->len && p->s[i] == '-')
    i++;
  if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
    p->pos = i;
    return jp_fail(p, "expected a digit");
  }
  if (p->s[i] == '0') {
    i++;
    if (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') {
      p->pos = i;
      return jp_fail(p, "leading zero in number");
    }
  } else {
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
      i++;
  }
  if (i < p->len && p->s[i] == '.') {
    frac = 1;
    i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
      p->pos = i;
      return jp_fail(p, "expected a digit after '.'");
    }
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
      i++;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    frac = 1;
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
      i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
      p->pos = i;
      return jp_fail(p, "expected a digit in exponent");
    }
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
      i++;
  }
  char tmp[64];
  size_t n = i - start;
  if (n >= sizeof tmp)
    return jp_fail(p, "number too long");
  memcpy(tmp, p->s + start, n);
  tmp[n] = '\0';
  j->number = strtod(tmp, NULL);
  if (!isfinite(j->number))
    return jp_fail(p, "number out of range");
  if (!frac) {
    errno = 0;
    long long v = strtoll(tmp, NULL, 10);
    if (errno == 0) {
      j->is_int = 1;
      j->integer = v;
    }
  }
  p->pos = i;
  return ECS_OK;
}

static int parse_literal(jp_t *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
    return jp_fail(p, "unexpected character");
  p->pos += n;
  return ECS_OK;
}

/* Parses the members of an array or object after its opening bracket. */
static int parse_container(jp_t *p, ecs_json_t *j) {
  int is_obj = j->type == ECS_JSON_OBJECT;
  char close = is_obj ? '}' : ']';
  ecs_json_t **tail = &j->child;
  int rc;
  if (++p->depth > ECS_JSON_MAX_DEPTH)
    return jp_fail(p, "nesting deeper than %d", ECS_JSON_MAX_DEPTH);
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    p->depth--;
    return ECS_OK;
  }
  for (;;) {
    char *key = NULL;
    size_t key_len = 0;
    skip_ws(p);
    if (is_obj) {
      if (p->pos >= p->len || p->s[p->pos] != '"')
        return jp_fail(p, "expected a string key");
      size_t key_off = p->pos;
      if ((rc = parse_string(p, &key, &key_len)) != ECS_OK)
        return rc;
      for (ecs_json_t *c = j->child; c; c = c->next) {
        if (c->key_len == key_len && memcmp(c->key, key, key_len) == 0) {
          p->pos = key_off;
          rc = jp_fail(p, "duplicate key \"%s\"", key);
          free(key);
          return rc;
        }
      }
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        free(key);
        return jp_fail(p, "expected ':'");
      }
      p->pos++;
    }
    ecs_json_t *v = NULL;
    rc = parse_value(p, &v);
    if (rc != ECS_OK) {
      free(key);
      return rc;
    }
    v->key = key;
    v->key_len = key_len;
    *tail = v;
    tail = &v->next;
    j->count++;
    skip_ws(p);
    if (p->pos >= p->len)
      return jp_fail(p, "unterminated %s", is_obj ? "object" : "array");
    if (p->s[p->pos] == ',') {
      p->pos++;
      skip_ws(p);
      if (p->pos < p->len && p->s[p->pos] == close)
        return jp_fail(p, "trailing comma");
      continue;
    }
    if (p->s[p->pos] == close) {
      p->pos++;
      p->depth--;
      return ECS_OK;
    }
    return jp_fail(p, "expected ',' or '%c'", close);
  }
}

static int parse_value(jp_t *p, ecs_json_t **out) {
  skip_ws(p);
  if (p->pos >= p->len)
    return jp_fail(p, "unexpected end of input");
  char c = p->s[p->pos];
  ecs_json_t *j;
  int rc;
  switch (c) {
  case '{':
  case '[':
    j = node_new(p, c == '{' ? ECS_JSON_OBJECT : ECS_JSON_ARRAY);
    if (j == NULL)
      return ECS_ENOMEM;
    rc = parse_container(p, j);
    break;
  case '"':
    j = node_new(p, ECS_JSON_STRING);
    if (j == NULL)
      return ECS_ENOMEM;
    rc = parse_string(p, &j->str, &j->len);
    break;
  case 't':
  case 'f':
    j = node_new(p, ECS_JSON_BOOL);
    if (j == NULL)
      return ECS_ENOMEM;
    j->boolean = c == 't';
    rc = parse_literal(p, c == 't' ? "true" : "false");
    break;
  case 'n':
    j = node_new(p, ECS_JSON_NULL);
    if (j == NULL)
      return ECS_ENOMEM;
    rc = parse_literal(p, "null");
    break;
  default:
    if (c != '-' && (c < '0' || c > '9'))
      return jp_fail(p, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? c : '?');
    j = node_new(p, ECS_JSON_NUMBER);
    if (j == NULL)
      return ECS_ENOMEM;
    rc = parse_number(p, j);
    break;
  }
  if (rc != ECS_OK) {
    ecs__json_free(j);
    return rc;
  }
  *out = j;
  return ECS_OK;
}

int ecs__json_parse(const char *s, size_t len, ecs_json_t **out, char *err, size_t errlen) {
  jp_t p = {.s = s, .len = len, .err = err, .errlen = errlen};
  *out = NULL;
  if (err && errlen)
    err[0] = '\0';
  if (s == NULL)
    return jp_fail(&p, "no input");
  if (len > ECS_JSON_MAX_INPUT)
    return jp_fail(&p, "input of %zu bytes exceeds the %u byte limit", len, ECS_JSON_MAX_INPUT);
  ecs_json_t *j = NULL;
  int rc = parse_value(&p, &j);
  if (rc == ECS_OK) {
    skip_ws(&p);
    if (p.pos != p.len) {
      ecs__json_free(j);
      rc = jp_fail(&p, "unexpected data after the value");
    }
  }
  if (rc != ECS_OK) {
    if (p.oom) {
      if (err && errlen)
        snprintf(err, errlen, "out of memory");
      return ECS_ENOMEM;
    }
    return rc;
  }
  *out = j;
  return ECS_OK;
}

void ecs__json_free(ecs_json_t *j) {
  /* Iterative over siblings, recursive over depth (bounded by MAX_DEPTH). */
  while (j) {
    ecs_json_t *next = j->next;
    ecs__json_free(j->child);
    free(j->str);
    free(j->key);
    free(j);
    j = next;
  }
}

const ecs_json_t *ecs__json_get(const ecs_json_t *obj, const char *key) {
  if (obj == NULL || obj->type != ECS_JSON_OBJECT)
    return NULL;
  size_t n = strlen(key);
  for (const ecs_json_t *c = obj->child; c; c = c->next)
    if (c->key_len == n && memcmp(c->key, key, n) == 0)
      return c;
  return NULL;
}

const char *ecs__json_type_name(ecs_json_type_t t) {
  switch (t) {
  case ECS_JSON_NULL: return "null";
  case ECS_JSON_BOOL: return "boolean";
  case ECS_JSON_NUMBER: return "number";
  case ECS_JSON_STRING: return "string";
  case ECS_JSON_ARRAY: return "array";
  case ECS_JSON_OBJECT: return "object";
  }
  return "?";
}
