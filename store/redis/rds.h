/*
 * The Redis link: the one piece of code that connects to Redis, waits for
 * its replies and says what went wrong, for the metadata layer
 * (store/redis/meta_*.c: object records, node registry) and the connector (the
 * redis backend and the KV handoff).
 *
 * Connects within connect_timeout_ms; every reply is awaited until a
 * deadline (the socket timeout is set to what is left of it before each
 * blocking read); any I/O error, timeout or malformed reply drops the link
 * (a pipeline cut half-way leaves the stream out of step), and the next
 * call reconnects.  Keys and values go through the Argv forms only, so
 * they are binary-safe.  Deadlines are on the monotonic clock of
 * ecs_now_ms() (store/core/net.h).
 *
 * Errors, one mapping for every caller (docs/redis-schema.md, "Errors"):
 *   ECS_ECONN      refused, reset, closed, unreachable, or the link is down:
 *                  transient, the next call reconnects
 *   ECS_ETIMEDOUT  no connection or no reply by the deadline (a stopped
 *                  Redis): transient, the link is dropped
 *   ECS_EREDIS     Redis answered with an error reply (-ERR, WRONGTYPE,
 *                  OOM: the link stays up), or with bytes that are not
 *                  RESP (the link is dropped)
 *   ECS_EAUTH      Redis refused the AUTH of the handshake (wrong password
 *                  or user): the link is dropped
 *   ECS_ENOMEM, ECS_EINVAL (a bad URL)
 * ecs__rds_errmsg() says what happened, naming the Redis address.
 *
 * Thread safety: none; one link per thread or a lock around it.
 */
#ifndef ECS_STORE_RDS_H
#define ECS_STORE_RDS_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

/* A Redis URL taken apart (ecs__rds_url_parse).  user and pass are
 * secrets' neighbours: never logged (ecs__rds_url_redact for messages). */
typedef struct ecs__rds_url {
  char host[256]; /* name or address (an IPv6 literal without its brackets) */
  int port;       /* 6379 when the URL has none */
  int db;         /* SELECTed after connect when nonzero */
  char user[128]; /* ACL user for AUTH ("": the default user) */
  char pass[256]; /* password ("": none in the URL) */
  /* redis-sentinel://: the sentinels ("H1:P1,H2:P2", host and port as in
   * a plain URL) and the master's name; "" for a plain URL.  host and port
   * then name the first sentinel, until ecs__rds_sentinel_resolve. */
  char sentinels[512];
  char master[128];
  /* redis-sentinel://: the sentinels' own AUTH (docs/redis-ha.md): the
   * URL's "?sentinel_user=U&sentinel_password=P", else the environment's
   * ECSTORE_SENTINEL_PASSWORD; "" for none (the master's is not tried) */
  char suser[128];
  char spass[256];
  int cluster; /* redis-cluster://HOST:PORT: a Redis Cluster (its slots probed from the first connect) */
  /* redis-cluster://H1:P1,H2:P2,...: the seed nodes ("" for one node);
   * host and port then name the first seed */
  char seeds[512];
} ecs__rds_url_t;

typedef struct ecs__rds {
  redisContext *c;        /* NULL while down */
  char host[256];         /* from the URL */
  int port;               /* from the URL */
  int db;                 /* SELECTed after connect when nonzero */
  char user[128];         /* AUTH user ("": the default user) */
  char pass[256];         /* AUTH password ("": no AUTH): the URL's, else ECSTORE_REDIS_PASSWORD */
  int connect_timeout_ms; /* one connect attempt */
  int timeout_ms;         /* default wait for one reply */
  uint64_t until;         /* 0, or a monotonic ms that every step ends by (ecs__rds_set_until) */
  unsigned discard;       /* replies owed to ecs__rds_send_noreply, dropped before the next one read */
  int used;               /* a reply arrived since the connect (a later EOF may be a stale link) */
  char sentinels[512];    /* redis-sentinel://: the sentinels ("" for a plain URL) */
  char master[128];       /* ...and the master's name: host and port are re-resolved at each connect */
  char suser[128];        /* the sentinels' AUTH user ("": the default user) */
  char spass[256];        /* the sentinels' AUTH password ("": none); never logged */
  char seeds[512];        /* redis-cluster:// with several nodes: tried in order when a connect fails */
  int readonly;           /* a READONLY reply (a demoted master): the next append reconnects */
  char route[200];        /* Redis Cluster: a key of the slot this link serves ("": none) */
  int cluster;            /* a redis-cluster:// URL, or a MOVED seen: connects probe the route key */
  int moved;              /* a MOVED reply: the next append reconnects to mhost:mport */
  char mhost[64];         /* ...the node MOVED named */
  int mport;
  int ask; /* an ASK reply: ecs__rds_cmd retries once at ahost:aport */
  char ahost[64];
  int aport;
  char url[1024]; /* the URL given to init (an async link of the same Redis parses it again) */
  char err[256];  /* last error */
} ecs__rds_t;

/* Parses url: "redis://[USERINFO@]HOST:PORT[/DB]", "[USERINFO@]HOST:PORT[/DB]"
 * or "HOST" (port 6379); HOST may be a bracketed IPv6 literal; USERINFO
 * is "USER:PASS", ":PASS" (the default user) or "USER" (the password comes
 * from elsewhere), %XX-escaped where it holds ':', '@' or '/' (the last
 * '@' ends it).  "redis-cluster://" instead of "redis://" names one node
 * of a Redis Cluster, or up to ECS_RDS_MAX_SEEDS seed nodes,
 * "redis-cluster://[USERINFO@]H1:P1,H2:P2[,...][/DB]" (docs/redis-ha.md).
 * Or Redis Sentinel:
 * "redis-sentinel://[USERINFO@]H1:P1[,H2:P2...]/MASTERNAME[/DB][?QUERY]", at
 * most ECS_RDS_MAX_SENTINELS sentinels, MASTERNAME of letters, digits,
 * '.', '_' and '-'; USERINFO is the master's AUTH; QUERY, after the last
 * '?', is "sentinel_user=U&sentinel_password=P" (either or both,
 * %XX-escaped): the sentinels' own AUTH (a '?' followed by anything else
 * is no query).  Returns ECS_OK or ECS_EINVAL.  The
 * reusable half of the link, for any Redis client of the project (the
 * async link included). */
int ecs__rds_url_parse(const char *url, ecs__rds_url_t *u);

#define ECS_RDS_MAX_SENTINELS 8
/* The most seed nodes of a redis-cluster:// URL. */
#define ECS_RDS_MAX_SEEDS 8

/* Redis Sentinel's client protocol, the discovery half: asks the sentinels
 * of u in turn (SENTINEL get-master-addr-by-name) for the address of u's
 * master, each with a connect and a reply deadline of per_ms; the first
 * answer wins.  With u->spass, each sentinel is sent AUTH [suser] spass
 * first.  Blocks at most 2 * per_ms per sentinel (3 with AUTH).  ECS_OK
 * with host/port; ECS_EAUTH when a sentinel refused the AUTH or answered
 * NOAUTH (no password given) and none answered; else ECS_ECONN (no
 * sentinel answered, or none knows the master); the reasons in err, one
 * per sentinel, naming it (never a password).  The caller then verifies
 * the role (ROLE says "master") after its handshake. */
int ecs__rds_sentinel_resolve(const ecs__rds_url_t *u, int per_ms, char *host, size_t hostcap, int *port,
                              char *err, size_t errlen);
/* As ecs__rds_sentinel_resolve, and every connect and reply of it also
 * ends by the monotonic until (0: no such bound): a sentinel is asked
 * with what is left, none once nothing is (ECS_ETIMEDOUT when the time
 * ran out before any sentinel answered). */
int ecs__rds_sentinel_resolve_by(const ecs__rds_url_t *u, int per_ms, uint64_t until, char *host,
                                 size_t hostcap, int *port, char *err, size_t errlen);

/* Whether reply (ROLE's) names a master: 1, else 0. */
int ecs__rds_role_is_master(const redisReply *reply);

/* A Redis Cluster redirection, the error reply's text (len bytes at s):
 * "MOVED SLOT HOST:PORT" (returns 1) or "ASK SLOT HOST:PORT" (returns 2),
 * with host (cap bytes; an empty HOST in the reply leaves host as it was)
 * and port; 0 when it is neither or malformed. */
int ecs__rds_redirect(const char *s, size_t len, char *host, size_t cap, int *port);

/* Redis Cluster (docs/redis-ha.md): key is one key of the slot this link
 * serves (a namespace's keys share one slot, their hash tag).  On a
 * cluster (a redis-cluster:// URL, or once a MOVED reply was seen), each
 * connect then probes it (EXISTS key) and follows MOVED to the slot's
 * master before the caller's first command, so that pipelines and SCAN go
 * to the right node; a MOVED reply later (a slot migrated) makes the next
 * call reconnect to the node it names, and ecs__rds_cmd follows up to 3
 * redirections of a command: MOVED (to the node named, which the link
 * keeps) and ASK (ASKING first, on a one-off link, once).  Without a
 * route key MOVED is still followed by ecs__rds_cmd and the next call.
 * Harmless on a Redis that is not a cluster (the probe finds no MOVED). */
void ecs__rds_set_route(ecs__rds_t *r, const char *key);

/* ecs__rds_url_parse, then the password policy every link applies: the
 * URL's password, else the environment's ECSTORE_REDIS_PASSWORD (where
 * ecstore-server puts the one of --redis-password-file or of its config
 * file's URL); a user with no password anywhere is refused.  ECS_OK, or
 * ECS_EINVAL with the reason in err (the URL redacted).  What an async
 * link calls before its AUTH (ecs__rds_auth_argv). */
int ecs__rds_url_resolve(const char *url, ecs__rds_url_t *u, char *err, size_t errlen);

/* Why url's HOST:PORT part(s) do not parse, when it is a port: empty, not
 * a number, or outside 1..65535 ("port 99999 of '127.0.0.1:99999' is out
 * of range (1..65535)"), into out; NULL when the ports are fine.  For
 * messages about a URL that ecs__rds_url_parse refused; the userinfo (a
 * password) is never part of what it quotes. */
const char *ecs__rds_url_port_problem(const char *url, char *out, size_t cap);

/* url with its password replaced by "***" (and nothing else changed), for
 * messages and logs; a URL that does not parse is shown as "<bad url>"
 * when it holds an '@'.  Returns out. */
const char *ecs__rds_url_redact(const char *url, char *out, size_t cap);

/* u as a URL, "redis://[USER[:PASS]@]HOST:PORT/DB" (with_pass 0: without
 * the password), user and password %XX-escaped where needed.  ECS_OK, or
 * ECS_EINVAL when it does not fit in cap. */
int ecs__rds_url_format(const ecs__rds_url_t *u, int with_pass, char *out, size_t cap);

/* Whether url carries a password (1), for callers that refuse one on a
 * command line. */
int ecs__rds_url_has_password(const char *url);

/* The AUTH command of u, when it needs one: fills argv/lens (3 entries)
 * and returns argc (2: AUTH PASS, 3: AUTH USER PASS), or 0 without a
 * password.  For the handshake here and in an async link. */
int ecs__rds_auth_argv(const ecs__rds_url_t *u, const char *argv[3], size_t lens[3]);

/* Reads a secret (a Redis password) from the first line of path into out
 * (cap bytes, NUL-terminated, line end dropped).  A file group or others
 * may access is refused, as the token files are.  ECS_OK, or ECS_EINVAL
 * with the reason (and the chmod that fixes it) in err. */
int ecs__rds_read_secret(const char *path, char *out, size_t cap, char *err, size_t errlen);

/*
 * Bounds on what the project reads from Redis.  hiredis 0.14 (Debian 12's)
 * puts none on a reply: "*300000000\r\n" makes its reader calloc 2.4 GB
 * for the element vector before any element arrives, and a bulk string is
 * buffered whatever length its header announces.  Every link of the
 * project (ecs__rds_connect, ecs__rdsa_connect) puts its reader under
 * these bounds with ecs__rds_bound_reader; a reply over one is refused,
 * "reply too large (N elements, limit M)" (or "(N-byte string, limit M)",
 * "(nesting ...)" ...), ECS_EREDIS, and the link is dropped.
 *
 *   ECS_RDS_MAX_ELEMENTS  one array, and all the arrays of one reply
 *                         together: the largest legitimate reply is a
 *                         lookup script's over META_CHUNK (1000) keys of
 *                         ~10 fields, or a SCAN page of ~COUNT (1000) keys;
 *                         ECS_PROTO_MAX_ITEMS is 4096.  1 Mi: 50x margin.
 *   ECS_RDS_MAX_STRING    one string (bulk, status, error or integer line)
 *                         on a blocking link: the connector's redis backend
 *                         GETs whole tensors, and a Redis string is at most
 *                         512 MB (proto-max-bulk-len), so that is the bound.
 *   ECS_RDS_MAX_STRING_SMALL  the same on the server's async link, which
 *                         reads records, script results and SCAN keys only.
 *   ECS_RDS_MAX_REPLY     bytes one reply may hold in memory (strings plus
 *                         element vectors, as the reader allocates them).
 *   ECS_RDS_MAX_LINE      a status, error or integer line.
 * Nesting: hiredis 0.14 itself refuses arrays nested deeper than 7.
 */
#define ECS_RDS_MAX_ELEMENTS (1 << 20)
#define ECS_RDS_MAX_STRING (512ull << 20)
#define ECS_RDS_MAX_STRING_SMALL (1ull << 20)
#define ECS_RDS_MAX_REPLY (576ull << 20)
#define ECS_RDS_MAX_REPLY_SMALL (64ull << 20)
/* A status, error or integer line: Redis's are a few hundred bytes. */
#define ECS_RDS_MAX_LINE (64 << 10)

/* Puts rd under the bounds above: its reply functions become hiredis's
 * own, wrapped so that an array or string over a bound is refused before
 * it is allocated.  small: the async link's tighter string bound.  Call
 * once right after the context is made, before any reply is read. */
void ecs__rds_bound_reader(redisReader *rd, int small);

/* Looks at the bytes rd has buffered but not parsed yet: a header that
 * announces an array or a string over rd's bounds (or a line longer than
 * ECS_RDS_MAX_LINE) sets rd's error (REDIS_ERR_PROTOCOL, "reply too
 * large ...") so that the parse that follows fails at once, before the
 * reader allocates for it or buffers its bytes.  Call it after each read
 * into rd and before its parse.  A reader not under ecs__rds_bound_reader
 * is left alone. */
void ecs__rds_reader_guard(redisReader *rd);

/* What to say for a reader error err/errstr: when the reader stopped
 * because a reply function of ecs__rds_bound_reader refused an object on
 * this thread (hiredis reports that as REDIS_ERR_OOM, "Out of memory"),
 * the refusal ("reply too large ..."), else errstr. */
const char *ecs__rds_reader_errstr(int err, const char *errstr);

/* Parses url for the host, port and db alone (credentials are accepted and
 * ignored).  Returns ECS_OK or ECS_EINVAL. */
int ecs__rds_parse_url(const char *url, char *host, size_t hostcap, int *port, int *db);

/* A number as Redis sends it: decimal digits only (no sign, at most 20, no
 * overflow), len bytes at s, not NUL-terminated.  0, or -1 when it is not
 * one. */
int ecs__rds_parse_u64(const char *s, size_t len, uint64_t *out);

/* "HOST[:PORT]" (HOST maybe a bracketed IPv6 literal), hp_len bytes at
 * url, into host (cap bytes) and port (6379 when absent).  0, or -1; a
 * host holds none of a URL's delimiters ('/', '?', '#', '@', ','). */
int ecs__rds_hostport(const char *url, size_t hp_len, char *host, size_t cap, int *port);

/* Parses url (as above) into r; does not connect.  The password is the
 * URL's, else the environment's ECSTORE_REDIS_PASSWORD (so a secret need
 * never be on a command line); a URL naming a user with no password
 * anywhere is refused. */
int ecs__rds_init(ecs__rds_t *r, const char *url, int connect_timeout_ms, int timeout_ms);

/* Sets the AUTH password (from a file the caller read), replacing the
 * URL's or the environment's; takes effect at the next connect. */
int ecs__rds_set_password(ecs__rds_t *r, const char *pass);

/* Bounds the link by a call's deadline: from now on every step of a
 * (re)connect (each sentinel's connect, AUTH and reply, the connect to
 * Redis, AUTH, SELECT, ROLE, the cluster probe, each seed) and every reply
 * wait ends by the monotonic until_ms, each step taking what is left of it
 * (never more than connect_timeout_ms or timeout_ms); a step with nothing
 * left fails with ECS_ETIMEDOUT before it starts.  0 lifts the bound.  A
 * chain of steps used to give each its full timeout, so a reconnect
 * through three stopped sentinels took three times the call's budget
 * (review finding C1). */
void ecs__rds_set_until(ecs__rds_t *r, uint64_t until_ms);

/* Drops the link; the struct may be re-used (the next call reconnects). */
void ecs__rds_close(ecs__rds_t *r);

/* 1 while connected. */
int ecs__rds_up(const ecs__rds_t *r);

/* Connects when down, then the handshake: AUTH (with the user when one
 * is named) when there is a password, then SELECT when db is nonzero.
 * Through Sentinel, the master is resolved first (the sentinels in turn,
 * each within connect_timeout_ms) and its ROLE must say master, else
 * ECS_ECONN ("... is not a master"); an error reply starting READONLY (a
 * master demoted under us) drops the link at the next call, so that it
 * re-resolves.  A
 * refused AUTH is ECS_EAUTH, "redis HOST:PORT: authentication failed"
 * (the password is never in a message); so is one the sentinels refused.
 * With a redis-cluster:// seed list, a node in use that does not answer
 * (ECS_ECONN, ECS_ETIMEDOUT) makes the link try the seeds in the order
 * listed until one does, each within connect_timeout_ms. */
int ecs__rds_connect(ecs__rds_t *r);

/* The most arguments a command given without lengths may have. */
#define ECS_RDS_MAX_ARGS 16

/* lens when given, else argv's strlen()s in tmp; NULL when argc is over
 * ECS_RDS_MAX_ARGS.  For both links' "lens NULL: NUL-terminated". */
const size_t *ecs__rds_arglens(int argc, const char **argv, const size_t *lens, size_t tmp[ECS_RDS_MAX_ARGS]);

/* Queues one command (pipelining: replies are read with ecs__rds_reply),
 * connecting first when down.  lens NULL: NUL-terminated arguments. */
int ecs__rds_append(ecs__rds_t *r, int argc, const char **argv, const size_t *lens);

/* Fire and forget: queues one command on a link that is up and writes it
 * at once, without waiting for its reply (the next reply read first drops
 * it, whatever it says).  Never connects and never waits: the socket's
 * send buffer is empty between calls (every earlier command was answered),
 * so the write of a short command does not block.  ECS_OK; ECS_ENOTCONN
 * when the link is down (nothing is sent); a failed write drops the link
 * (ECS_ECONN).  lens NULL: NUL-terminated arguments. */
int ecs__rds_send_noreply(ecs__rds_t *r, int argc, const char **argv, const size_t *lens);

/* Reads the next reply, waiting until the monotonic deadline_ms.  An
 * error reply is returned as ECS_EREDIS with the reply freed. */
int ecs__rds_reply(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out);

/* As ecs__rds_reply, but an error reply is a reply (ECS_OK), for callers
 * that look inside it (NOSCRIPT, a failed item of a pipeline). */
int ecs__rds_reply_any(ecs__rds_t *r, uint64_t deadline_ms, redisReply **out);

/* append + reply with the default timeout.  lens NULL: NUL-terminated. */
int ecs__rds_cmd(ecs__rds_t *r, redisReply **out, int argc, const char **argv, const size_t *lens);

/* Monotonic deadline timeout_ms from now, or the link's until when sooner. */
uint64_t ecs__rds_deadline(const ecs__rds_t *r);

/* Records a message of the caller's (a reply it could not use). */
__attribute__((format(printf, 2, 3))) void ecs__rds_seterr(ecs__rds_t *r, const char *fmt, ...);

const char *ecs__rds_errmsg(const ecs__rds_t *r);

/*
 * The asynchronous link (store/redis/rds_async.c), for the server: the same
 * Redis, the same URL and the same error mapping as above, but no call
 * ever waits.  hiredis's async API runs on the caller's epoll instance
 * through a small adapter (hiredis 0.14 has none for a raw epoll loop):
 * the link's socket is added to epfd with data.ptr == the ecs__rdsa_t,
 * and the loop hands such events to ecs__rdsa_event().  Commands queued
 * on a connected link leave when the loop calls ecs__rdsa_kick() (after
 * each batch of events), not on their own.
 *
 * Deadlines are enforced here, since hiredis 0.14 has no async timeout:
 * ecs__rdsa_poll(), called by the loop at least every ~100 ms, drops the
 * link when the oldest command without a reply (or the connect and its
 * handshake) is older than timeout_ms.  Dropping the link fails every
 * pending callback at once:
 *   ECS_ETIMEDOUT  the deadline passed (a stopped Redis)
 *   ECS_ECONN      refused, reset, closed, unreachable, or closed by us
 *   ECS_EREDIS     an error reply (the link stays up), or bytes that are
 *                  not RESP (the link is dropped)
 * Reconnecting is the caller's choice (ecs__rdsa_connect, which never
 * blocks but for Sentinel, below); the connect and the handshake (AUTH,
 * SELECT db, and ROLE through Sentinel) are one function, and the link
 * counts as up only once the handshake is answered.
 *
 * Through Sentinel (a redis-sentinel:// URL), ecs__rdsa_connect asks the
 * sentinels for the master's address first, synchronously, with a
 * deadline of min(timeout_ms, 200) ms for each connect and each reply:
 * the loop waits at most 400 ms per sentinel listed (600 ms with the
 * sentinels' AUTH, one more reply), and only at a
 * (re)connect, at most once per reconnect interval of the caller.  The
 * handshake then checks ROLE (a replica the sentinels still name is
 * dropped, ECS_ECONN), and an error reply starting READONLY (a master
 * demoted under us) drops the link, so that the next connect asks the
 * sentinels again.  The sentinels should answer with addresses: a name
 * is looked up by hiredis with a blocking getaddrinfo().
 *
 * Thread safety: none; the loop's thread only.
 */
typedef struct redisAsyncContext redisAsyncContext;

/* Called with the outcome of one command: rc as above; reply is the
 * reply (an error reply when rc is ECS_EREDIS and the link is up) or
 * NULL, valid only during the call (hiredis frees it). */
typedef void (*ecs__rdsa_fn)(void *ctx, int rc, redisReply *reply);

typedef struct ecs__rdsa_cmd ecs__rdsa_cmd_t;

enum { ECS_RDSA_DOWN, ECS_RDSA_CONNECTING, ECS_RDSA_UP };

typedef struct ecs__rdsa {
  redisAsyncContext *ac;              /* NULL while down */
  int state;                          /* ECS_RDSA_DOWN, _CONNECTING (connect or handshake pending) or _UP */
  int epfd;                           /* the loop's epoll instance */
  int fd;                             /* ac's socket while it is in epfd, else -1 */
  uint32_t events;                    /* what epfd watches on fd */
  int want_write;                     /* connected, and hiredis has bytes to send (ecs__rdsa_kick) */
  char host[256];                     /* from the URL */
  char addr[64];                      /* host resolved once by init: reconnects never wait on DNS */
  int port;                           /* from the URL */
  int db;                             /* SELECTed by the handshake */
  char user[128];                     /* AUTH user ("": the default user) */
  char pass[256];                     /* AUTH password ("": no AUTH); never logged */
  char sentinels[512];                /* redis-sentinel://: the sentinels ("" for a plain URL) */
  char master[128];                   /* ...and the master's name, resolved at each connect */
  char suser[128];                    /* the sentinels' AUTH user ("": the default user) */
  char spass[256];                    /* the sentinels' AUTH password ("": none); never logged */
  char seeds[ECS_RDS_MAX_SEEDS][64];  /* redis-cluster:// seeds, as addresses resolved by init */
  int seed_port[ECS_RDS_MAX_SEEDS];   /* ...their ports */
  int nseeds;                         /* how many (0: one node, no seed list) */
  int seed_next;                      /* the seed the next failed connect moves to */
  int seed_tries;                     /* failed connects in a row (a full round waits for the caller) */
  char route[200];                    /* Redis Cluster: a key of the slot served (ecs__rdsa_set_route) */
  int cluster;                        /* a redis-cluster:// URL, or a MOVED seen: the handshake probes */
  int redirected;                     /* dropped for a MOVED, or a seed failed: reconnect at once */
  int timeout_ms;                     /* deadline of the connect and of each reply */
  uint64_t connect_t0_ms;             /* when the connect began (monotonic) */
  int fail_rc;                        /* code for callbacks failed by the drop under way */
  ecs__rdsa_cmd_t *head;              /* commands awaiting their reply, oldest first */
  ecs__rdsa_cmd_t *tail;              /* ...and the newest */
  size_t npending;                    /* their number */
  void (*on_up)(void *ctx);           /* the handshake succeeded */
  void (*on_down)(void *ctx, int rc); /* the link dropped (once per connect) */
  void *cb_ctx;                       /* for on_up and on_down */
  char err[256];                      /* last error, naming the Redis address */
} ecs__rdsa_t;

/* Parses url into r (not connected), with the password policy of
 * ecs__rds_url_resolve, and resolves its host once, here (a blocking
 * lookup: call it before the loop runs); connects use that address, so a
 * reconnect never waits for DNS (a Redis that moves to another address
 * needs a server restart, or Sentinel).  ECS_OK or ECS_EINVAL. */
int ecs__rdsa_init(ecs__rdsa_t *r, const char *url, int timeout_ms, int epfd, void (*on_up)(void *ctx),
                   void (*on_down)(void *ctx, int rc), void *cb_ctx);

/* Redis Cluster, as ecs__rds_set_route: the handshake ends with EXISTS
 * key; a MOVED reply there, or to any later command, drops the link
 * (ECS_ECONN; the command that met it fails with ECS_EREDIS) and points
 * the next connect at the node MOVED named.  ASK is not followed here
 * (the command fails with ECS_EREDIS; a slot migration is brief). */
void ecs__rdsa_set_route(ecs__rdsa_t *r, const char *key);

/* The credentials the handshake sends (AUTH [USER] PASS before SELECT),
 * those the blocking link resolved (ecs__rds_url_resolve: the URL's
 * password, else ECSTORE_REDIS_PASSWORD); pass "" for none.  A refused
 * AUTH drops the link with ECS_EAUTH, "authentication failed". */
void ecs__rdsa_set_auth(ecs__rdsa_t *r, const char *user, const char *pass);

/* Starts a connect and its handshake (AUTH when set, SELECT db) when down; returns at
 * once.  on_up or on_down follows from the loop.  ECS_OK, or ECS_ECONN /
 * ECS_ENOMEM (ECS_EAUTH: the sentinels refused our AUTH) when it could not
 * even start (on_down is not called).  With a redis-cluster:// seed list,
 * a connect that fails before the link is up (refused, timed out) points
 * the next one at the next seed and sets redirected (reconnect at once)
 * until every seed has failed in a row. */
int ecs__rdsa_connect(ecs__rdsa_t *r);

/* Sends one command while the link is up or connecting (then it follows
 * the handshake); pipelined: commands sent in one loop iteration leave in
 * one write.  ECS_OK: fn will be called exactly
 * once; else (ECS_ENOTCONN when not up, ECS_ENOMEM) fn is never called.
 * fn may be NULL.  lens NULL: NUL-terminated arguments. */
int ecs__rdsa_command(ecs__rdsa_t *r, ecs__rdsa_fn fn, void *ctx, int argc, const char **argv,
                      const size_t *lens);

/* Whether an epoll event's data.ptr is this link's, and its handler. */
int ecs__rdsa_owns(const ecs__rdsa_t *r, const void *p);
void ecs__rdsa_event(ecs__rdsa_t *r, uint32_t events);

/* Sends what commands queued on a connected link now, from the calling
 * thread (which holds whatever lock guards r), and watches for EPOLLOUT
 * only when the socket would block.  The loops call it at the end of each
 * batch of events: the records of a put leave from the thread that ran
 * it, in one write with every other command of the batch, without waking
 * the loop that owns the link. */
void ecs__rdsa_kick(ecs__rdsa_t *r);

/* Enforces the deadlines at monotonic now_ms.  Returns the ms until the
 * next deadline, or -1 when none is running. */
int ecs__rdsa_poll(ecs__rdsa_t *r, uint64_t now_ms);

/* Drops the link, failing every pending callback with rc (on_down is
 * called when the link was not already down).  Safe when down. */
void ecs__rdsa_close(ecs__rdsa_t *r, int rc);

/* 1 once the handshake is answered, until the link drops. */
int ecs__rdsa_up(const ecs__rdsa_t *r);

const char *ecs__rdsa_errmsg(const ecs__rdsa_t *r);

#endif
