/*
 * A small strict JSON parser (RFC 8259) for connector configuration.
 *
 * It builds a tree: objects, arrays, strings (escapes decoded to UTF-8,
 * surrogate pairs joined, lone surrogates and raw control characters
 * refused, raw bytes checked to be valid UTF-8), numbers, true, false and
 * null.  It is strict where lenient parsers are not: no comments, no
 * trailing commas, no leading zeros, no duplicate keys in an object, nothing
 * after the top-level value.  Input is bounded (ECS_JSON_MAX_INPUT bytes)
 * and so is nesting (ECS_JSON_MAX_DEPTH), so a hostile file cannot exhaust
 * the stack or memory.  Errors name the byte offset where parsing stopped.
 *
 * No I/O: the caller reads the file.
 *
 * Thread safety: pure functions; a tree may be read from several threads.
 */
#ifndef ECS_EC_JSON_H
#define ECS_EC_JSON_H

#include <stddef.h>

#define ECS_JSON_MAX_DEPTH 32
#define ECS_JSON_MAX_INPUT (1u << 20)

typedef enum ecs_json_type {
  ECS_JSON_NULL = 0,
  ECS_JSON_BOOL,
  ECS_JSON_NUMBER,
  ECS_JSON_STRING,
  ECS_JSON_ARRAY,
  ECS_JSON_OBJECT
} ecs_json_type_t;

typedef struct ecs_json {
  ecs_json_type_t type;   /* what this value is */
  int boolean;            /* BOOL: 0 or 1 */
  double number;          /* NUMBER: the value as a double */
  int is_int;             /* NUMBER: 1 when written without fraction/exponent and fits long long */
  long long integer;      /* NUMBER: the exact value when is_int */
  char *str;              /* STRING: decoded bytes, NUL-terminated (owned) */
  size_t len;             /* STRING: byte length (may hold a \u0000) */
  char *key;              /* member of an OBJECT: its key, NUL-terminated (owned) */
  size_t key_len;         /* member of an OBJECT: key byte length */
  size_t offset;          /* byte offset of the value in the input, for messages */
  size_t count;           /* ARRAY/OBJECT: number of children */
  struct ecs_json *child; /* ARRAY/OBJECT: first child */
  struct ecs_json *next;  /* next sibling */
} ecs_json_t;

/* Parses s[0..len).  On success *out owns the tree (free with
 * ecs__json_free).  On failure returns ECS_EINVAL (or ECS_ENOMEM), *out is
 * NULL and err says "offset N: what". */
int ecs__json_parse(const char *s, size_t len, ecs_json_t **out, char *err, size_t errlen);

/* Frees a tree; accepts NULL. */
void ecs__json_free(ecs_json_t *j);

/* The member of an object named key, or NULL. */
const ecs_json_t *ecs__json_get(const ecs_json_t *obj, const char *key);

/* "null", "boolean", "number", "string", "array", "object". */
const char *ecs__json_type_name(ecs_json_type_t t);

#endif
