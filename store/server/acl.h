/*
 * Authorization: which token may do what in which namespace (--acl-file).
 *
 * An ACL file has one line per token, three fields separated by spaces or
 * tabs, and an optional fourth, the token's quota (ecs__acl_quota_t):
 *
 *     # TOKEN              NAMESPACES          RIGHTS
 *     reader-7f3a9c...     model-a,model-b     read
 *     writer-0c41e2...     model-a             read,write
 *     ops-91bd07...        *                   all
 *
 * NAMESPACES is a comma-separated list of namespaces (1..128 bytes each)
 * or '*' for any; RIGHTS a comma-separated list of read, write, overwrite,
 * remove and admin, or 'all'.  '#' starts a comment at a line's start or after
 * whitespace (as in the config files of store/core/parse.h), so a token may
 * hold a '#' but not begin with one.  A token is 1..256 bytes without
 * whitespace and appears once.  Anything else is refused with
 * "FILE:LINE: what", and nothing is loaded.
 *
 * Lookups compare the presented token with every entry in constant time
 * (ecs_ct_equal), without stopping at the first match, so the time a
 * lookup takes says nothing about which tokens exist.
 *
 * Thread safety: a loaded ACL is immutable; lookups may run concurrently.
 */
#ifndef ECS_STORE_ACL_H
#define ECS_STORE_ACL_H

#include <stddef.h>
#include <stdint.h>

/* Rights, as bits (a connection's rights, an opcode's requirement). */
enum {
  ECS__RIGHT_READ = 1u,       /* get, exists, lease, release, attach, rdma_connect, stat */
  ECS__RIGHT_WRITE = 2u,      /* put, reserve, commit, attach for writing */
  ECS__RIGHT_REMOVE = 4u,     /* remove */
  ECS__RIGHT_ADMIN = 8u,      /* stat, debug */
  ECS__RIGHT_OVERWRITE = 16u, /* upsert: replace a key that holds other content */
  ECS__RIGHT_ALL = 31u
};

#define ECS__ACL_MAX_TOKEN 256    /* bytes of one token */
#define ECS__ACL_MAX_NS 128       /* bytes of one namespace */
#define ECS__ACL_MAX_ENTRIES 4096 /* tokens in one file */
#define ECS__ACL_MAX_LINE 8192    /* bytes of one line */

typedef struct ecs__acl ecs__acl_t;

/* A token's quota (the optional fourth field, "stored=SIZE,pinned=SIZE,
 * pins=N"; 0: no limit): bytes of objects it stored that the server
 * holds, bytes and count of the objects its connections hold pinned
 * (leases and reservations, all its connections together). */
typedef struct ecs__acl_quota {
  uint64_t stored, pinned, pins;
} ecs__acl_quota_t;

/* Parses len bytes of text (name: the file name for messages).  ECS_OK
 * with *out (free with ecs__acl_free), ECS_EINVAL with "NAME:LINE: what"
 * in err (a file without any entry is refused too), or ECS_ENOMEM. */
int ecs__acl_parse(const char *text, size_t len, const char *name, ecs__acl_t **out, char *err,
                   size_t errlen);

/* Reads and parses the file at path (at most 4 MiB).  A file that group
 * or others may access is refused (as the token file: the tokens are the
 * servers' authentication), with the chmod that fixes it in err. */
int ecs__acl_load(const char *path, ecs__acl_t **out, char *err, size_t errlen);

void ecs__acl_free(ecs__acl_t *a);

/* The rights of token (len bytes) in namespace ns: 0 when the token is
 * unknown or not allowed in ns.  *known (may be NULL) is set to 1 when the
 * token is in the file at all, so a caller can tell a bad token (counted
 * by the failed-auth throttle) from a good one in the wrong namespace. */
unsigned ecs__acl_rights(const ecs__acl_t *a, const void *token, size_t len, const char *ns, int *known);

/* Entries loaded. */
size_t ecs__acl_count(const ecs__acl_t *a);

/* Entry i (< ecs__acl_count): its token (*len bytes) and, in *rights, its
 * rights in namespace ns (0: not allowed there).  For the server's table
 * of derived keys (server_auth.c), built once at start. */
const char *ecs__acl_entry(const ecs__acl_t *a, size_t i, const char *ns, size_t *len, unsigned *rights);

/* Entry i's quota. */
void ecs__acl_entry_quota(const ecs__acl_t *a, size_t i, ecs__acl_quota_t *q);

/* "read,write" etc. for rights into buf (for logs). */
const char *ecs__acl_rights_str(unsigned rights, char *buf, size_t cap);

#endif
