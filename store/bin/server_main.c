/* ecstore-server: command line, config file and signals around store/server/server.c. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "store/server/acl.h"
#include "store/core/log.h"
#include "store/core/net.h"
#include "store/core/parse.h"
#include "store/redis/rds.h"
#include "store/server/server.h"

static ecs_server_t *g_server;
static ecs__acl_t *g_acl;         /* --acl-file, loaded once */
static char g_redis_pw_file[512]; /* --redis-password-file */
static char g_sent_pw_file[512];  /* --sentinel-password-file */

static void on_signal(int sig) {
  (void)sig;
  if (g_server)
    ecs_server_stop(g_server);
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: ecstore-server [options]\n"
      "\n"
      "Serves tensors by key from one pinned memory pool; publishes object\n"
      "records and its own registration to Redis.\n"
      "\n"
      "  --listen HOST:PORT        address to serve on (default 127.0.0.1:7700; port 0 picks one)\n"
      "  --advertise HOST:PORT     address clients should use, put in the registry (default: listen)\n"
      "  --pool-size SIZE          pool bytes, e.g. 512M, 4G, 1.5G (default 1G); at most the\n"
      "                            memory available (MemAvailable), else refused at start\n"
      "  --min-block SIZE          smallest pool block, a power of two >= 4K (default 4K)\n"
      "  --hugepages off|try|require  back the pool with huge pages (default off)\n"
      "  --no-mlock                do not pin the pool\n"
      "  --cuda-register           cudaHostRegister the pool when libcudart is present\n"
      "  --redis URL               redis://HOST:PORT[/DB] or HOST:PORT; 'none' to run without\n"
      "                            (default 127.0.0.1:6379); redis-cluster://H1:P1[,H2:P2...]; or\n"
      "                            redis-sentinel://H1:P1,H2:P2/MASTER[/DB] (docs/redis-ha.md)\n"
      "                            a password: in a --config file's URL (redis://USER:PASS@HOST:PORT),\n"
      "                            --redis-password-file or ECSTORE_REDIS_PASSWORD, never on the\n"
      "                            command line (refused there)\n"
      "  --redis-password-file FILE  Redis AUTH password, first line of FILE (chmod 600)\n"
      "  --sentinel-password-file FILE  the sentinels' own AUTH password (redis-sentinel://),\n"
      "                            first line of FILE (chmod 600); else ECSTORE_SENTINEL_PASSWORD;\n"
      "                            the master's password is never sent to a sentinel\n"
      "  --ns NAME                 namespace served, e.g. the model name (default 'default')\n"
      "  --node-id ID              node id in Redis (default HOST:PORT)\n"
      "  --auth-token-file FILE    clients must present this token (first line of FILE, which\n"
      "                            group and others must not access: chmod 600)\n"
      "  --acl-file FILE           rights per token and namespace: 'TOKEN NAMESPACES RIGHTS' lines,\n"
      "                            rights read, write, overwrite, remove, admin or all (docs/security.md);\n"
      "                            chmod 600 as the token file\n"
      "  --unprotected             allow a non-loopback --listen without --auth-token-file\n"
      "                            (refused by default: anyone who can connect could read and write)\n"
      "  --hello-timeout-ms MS     close a connection that has not said HELLO by then (default 5000)\n"
      "  --max-preauth-conns N     connections yet to say HELLO; the oldest is closed to admit\n"
      "                            a new one (default 64)\n"
      "  --auth-fail-delay-ms MS   an address may send 5 bad tokens, then one per MS; HELLOs\n"
      "                            past that are refused unchecked (default 1000)\n"
      "  --io-timeout-ms MS        drop a request stalled this long (default 30000)\n"
      "  --redis-timeout-ms MS     bound on each Redis call (default 500)\n"
      "  --registry-ttl-ms MS      registry TTL: a server that stops heart-beating (every TTL/3,\n"
      "                            at least once a second) leaves the namespace after MS\n"
      "                            (default 10000; at least 1000: three heartbeats per TTL;\n"
      "                            keep it above 2x --redis-timeout-ms + 1000, or one slow\n"
      "                            Redis reply may expire the entry and force a re-publish)\n"
      "  --heartbeat-ttl S         the same in seconds (2..3600)\n"
      "  --high-watermark F        background eviction starts above this fill (default 0.95)\n"
      "  --low-watermark F         ...and stops at this fill (default 0.85)\n"
      "  --max-request SIZE        largest payload of one request (default 4G)\n"
      "  --max-conns N             connection limit (default 1024)\n"
      "  --threads N               event-loop threads (default: the cores available)\n"
      "  --scrub-freed             zero an object's pool bytes when it is removed, evicted or\n"
      "                            aborted (costs a memset per free)\n"
      "  --max-objects N           objects held, empty ones included; the oldest are evicted\n"
      "                            past it (default: pool size / min block)\n"
      "  --shm-socket PATH|off     Unix socket for clients on this host: shared-memory gets and puts\n"
      "                            (default ecstore-PORT.sock in /run/ecstore as root, else in\n"
      "                            $XDG_RUNTIME_DIR/ecstore or /tmp/ecstore-UID; its directory must\n"
      "                            be the server's or root's and not group/world-writable)\n"
      "  --shm-allow-uid LIST      uids that may map the pool read-only besides the server's and\n"
      "                            root's.  A reader maps the WHOLE pool: it can read every object,\n"
      "                            whatever its namespace.  Other uids use the socket by copy.\n"
      "  --shm-write-uid LIST      uids that may map the pool writable (default: the server's own\n"
      "                            and root); others put by copy over the socket\n"
      "  --lease-timeout-ms MS     drop a shm/RDMA lease or reservation held this long (default 30000)\n"
      "  --pull-timeout-ms MS      the longest a PULL may wait for a holder (default 5000)\n"
      "  --pull-threads N          threads that fetch PULLed objects from their holders (default 4;\n"
      "                            0: the server refuses PULL)\n"
      "  --pull-token-file FILE    token this server presents to the holders it pulls from\n"
      "                            (default: the --auth-token-file token, else none)\n"
      "  --max-pins-per-conn N     leases plus reservations one connection may hold (default 4096)\n"
      "  --soft-pin-ttl-ms MS      a soft-pinned put (Mooncake's soft pin) is evicted only after\n"
      "                            every unpinned object for this long (default 1800000; 0: no pins)\n"
      "  --hard-pin-max SIZE       bytes hard-pinned puts (never evicted until removed) may hold\n"
      "                            in all (default: half the pool); a tenant with a stored= quota\n"
      "                            may hard-pin the same share of its quota\n"
      "  --max-pinned-per-conn SIZE  bytes one connection may hold pinned (default: 3/4 of\n"
      "                            the pool; one object always)\n"
      "  --rdma auto|on|off        register the pool for RDMA clients: auto uses a device when one\n"
      "                            exists (default), on refuses to start without one\n"
      "  --rdma-device NAME        RDMA device (default: the first one)\n"
      "  --rdma-port N             RDMA port (default 1)\n"
      "  --rdma-gid-index N        RoCE GID index (default 0)\n"
      "  --port-file FILE          write the bound port to FILE once listening (a new file\n"
      "                            renamed over FILE: a symlink there is replaced, not followed)\n"
      "  --metrics-listen HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics (default off)\n"
      "  --log-level LEVEL         error, warn, info or debug (default info)\n"
      "  --config FILE             read options from FILE ('name = value' lines);\n"
      "                            command-line options override it\n"
      "  --enable-debug-ops        allow test-only requests (corrupting objects); never in production\n"
      "  --help                    this text\n"
      "\n"
      "SIGTERM or SIGINT stops the server gracefully and removes its records from Redis.\n");
}

enum {
  O_LISTEN = 256,
  O_ADVERTISE,
  O_POOL,
  O_MINBLOCK,
  O_HUGE,
  O_NOMLOCK,
  O_CUDA,
  O_REDIS,
  O_NS,
  O_NODE,
  O_AUTH,
  O_IOTO,
  O_RTO,
  O_TTL,
  O_TTLMS,
  O_HIGH,
  O_LOW,
  O_MAXREQ,
  O_MAXCONN,
  O_THREADS,
  O_PORTFILE,
  O_LOG,
  O_CONFIG,
  O_DEBUGOPS,
  O_SHMSOCK,
  O_SHMUID,
  O_SHMWUID,
  O_LEASETO,
  O_RDMA,
  O_RDMADEV,
  O_RDMAPORT,
  O_RDMAGID,
  O_METRICS,
  O_HELLOTO,
  O_MAXPREAUTH,
  O_AUTHDELAY,
  O_UNPROT,
  O_MAXPINS,
  O_SOFTPINTTL,
  O_HARDPINMAX,
  O_MAXPINBYTES,
  O_MAXOBJ,
  O_SCRUB,
  O_ACL,
  O_REDISPW,
  O_SENTPW,
  O_PULLTO,
  O_PULLTH,
  O_PULLTOK,
  O_HELP
};

static const struct option long_opts[] = {
    {"listen", required_argument, 0, O_LISTEN},
    {"advertise", required_argument, 0, O_ADVERTISE},
    {"pool-size", required_argument, 0, O_POOL},
    {"min-block", required_argument, 0, O_MINBLOCK},
    {"hugepages", required_argument, 0, O_HUGE},
    {"no-mlock", no_argument, 0, O_NOMLOCK},
    {"cuda-register", no_argument, 0, O_CUDA},
    {"redis", required_argument, 0, O_REDIS},
    {"ns", required_argument, 0, O_NS},
    {"node-id", required_argument, 0, O_NODE},
    {"auth-token-file", required_argument, 0, O_AUTH},
    {"io-timeout-ms", required_argument, 0, O_IOTO},
    {"redis-timeout-ms", required_argument, 0, O_RTO},
    {"heartbeat-ttl", required_argument, 0, O_TTL},
    {"registry-ttl-ms", required_argument, 0, O_TTLMS},
    {"high-watermark", required_argument, 0, O_HIGH},
    {"low-watermark", required_argument, 0, O_LOW},
    {"max-request", required_argument, 0, O_MAXREQ},
    {"max-conns", required_argument, 0, O_MAXCONN},
    {"threads", required_argument, 0, O_THREADS},
    {"port-file", required_argument, 0, O_PORTFILE},
    {"shm-socket", required_argument, 0, O_SHMSOCK},
    {"shm-allow-uid", required_argument, 0, O_SHMUID},
    {"shm-write-uid", required_argument, 0, O_SHMWUID},
    {"lease-timeout-ms", required_argument, 0, O_LEASETO},
    {"rdma", required_argument, 0, O_RDMA},
    {"rdma-device", required_argument, 0, O_RDMADEV},
    {"rdma-port", required_argument, 0, O_RDMAPORT},
    {"rdma-gid-index", required_argument, 0, O_RDMAGID},
    {"metrics-listen", required_argument, 0, O_METRICS},
    {"log-level", required_argument, 0, O_LOG},
    {"config", required_argument, 0, O_CONFIG},
    {"enable-debug-ops", no_argument, 0, O_DEBUGOPS},
    {"hello-timeout-ms", required_argument, 0, O_HELLOTO},
    {"max-preauth-conns", required_argument, 0, O_MAXPREAUTH},
    {"auth-fail-delay-ms", required_argument, 0, O_AUTHDELAY},
    {"unprotected", no_argument, 0, O_UNPROT},
    {"max-pins-per-conn", required_argument, 0, O_MAXPINS},
    {"soft-pin-ttl-ms", required_argument, 0, O_SOFTPINTTL},
    {"hard-pin-max", required_argument, 0, O_HARDPINMAX},
    {"max-pinned-per-conn", required_argument, 0, O_MAXPINBYTES},
    {"max-objects", required_argument, 0, O_MAXOBJ},
    {"scrub-freed", no_argument, 0, O_SCRUB},
    {"acl-file", required_argument, 0, O_ACL},
    {"redis-password-file", required_argument, 0, O_REDISPW},
    {"sentinel-password-file", required_argument, 0, O_SENTPW},
    {"pull-timeout-ms", required_argument, 0, O_PULLTO},
    {"pull-threads", required_argument, 0, O_PULLTH},
    {"pull-token-file", required_argument, 0, O_PULLTOK},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static int bad(const char *opt, const char *val, const char *why) {
  fprintf(stderr, "ecstore-server: --%s '%.300s%s': %s\n", opt, val, strlen(val) > 300 ? "..." : "", why);
  return 2;
}

/* 1 when s holds a byte that a name in Redis keys, logs and the registry
 * must not: whitespace, a control character or DEL. */
static int has_space_or_control(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s <= ' ' || *s == 0x7f)
      return 1;
  return 0;
}

static char g_config_pw_path[512]; /* a --config file whose --redis URL holds a password */

/* Reads the token from the first line of path.  A file that anyone but
 * its owner may read or write is refused, as ssh refuses a private key:
 * the token is the whole of the servers' authentication, and a copy
 * readable by every local user is no secret.  The message says the chmod
 * that fixes it. */
static int read_token(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "ecstore-server: --auth-token-file '%s': %s\n", path, strerror(errno));
    return 2;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    fprintf(stderr, "ecstore-server: --auth-token-file '%s': %s\n", path, strerror(errno));
    fclose(f);
    return 2;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    fclose(f);
    fprintf(stderr,
            "ecstore-server: --auth-token-file '%s': permissions %04o are too open (group or others "
            "may access it); run: chmod 600 '%s'\n",
            path, (unsigned)(st.st_mode & 07777), path);
    return 2;
  }
  char line[512];
  if (!fgets(line, sizeof line, f)) {
    fclose(f);
    fprintf(stderr, "ecstore-server: --auth-token-file '%s': empty file\n", path);
    return 2;
  }
  fclose(f);
  line[strcspn(line, "\r\n")] = '\0';
  if (!line[0] || strlen(line) >= cap)
    return bad("auth-token-file", path, "token must be 1..256 bytes on the first line");
  snprintf(out, cap, "%s", line);
  return 0;
}

/* Applies one option.  Returns 0, or an exit status. */
/* Writes "PORT\n" to path without following a link there: into a new
 * file (O_EXCL) beside it, then renamed over it.  rename() replaces a
 * symlink at path itself, so one planted there (the server often runs as
 * root, the directory may be shared) cannot aim the write at another file;
 * and a reader never sees a half-written port.  0, or -1 with errno. */
static int write_port_file(const char *path, int port) {
  char tmp[600];
  if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp)
    return errno = ENAMETOOLONG, -1;
  int fd = mkstemp(tmp); /* O_CREAT | O_EXCL, mode 0600 */
  if (fd < 0)
    return -1;
  char line[16];
  int n = snprintf(line, sizeof line, "%d\n", port);
  int rc = fchmod(fd, 0644) == 0 && write(fd, line, (size_t)n) == n ? 0 : -1;
  int err = errno;
  if (close(fd) != 0 && rc == 0)
    rc = -1, err = errno;
  if (rc == 0 && rename(tmp, path) != 0)
    rc = -1, err = errno;
  if (rc != 0) {
    unlink(tmp);
    errno = err;
  }
  return rc;
}

static int apply(ecs_server_opts_t *o, int c, const char *arg, char *port_file, size_t pf_cap) {
  long long v;
  uint64_t sz;
  double d;
  switch (c) {
  case O_LISTEN:
    if (ecs_net_parse_hostport(arg, o->listen_host, sizeof o->listen_host, &o->listen_port))
      return bad("listen", arg, "expected HOST:PORT");
    return 0;
  case O_ADVERTISE: {
    char h[128];
    int p;
    if (ecs_net_parse_hostport(arg, h, sizeof h, &p) || p == 0)
      return bad("advertise", arg, "expected HOST:PORT");
    snprintf(o->advertise, sizeof o->advertise, "%s", arg);
    return 0;
  }
  case O_POOL:
    if (ecs_parse_size(arg, &sz) || sz < (1u << 20))
      return bad("pool-size", arg, "expected a size of at least 1M, e.g. 512M, 4G or 1.5G");
    o->pool_size = sz;
    return 0;
  case O_MINBLOCK:
    if (ecs_parse_size(arg, &sz) || sz < 4096 || (sz & (sz - 1)))
      return bad("min-block", arg, "expected a power of two >= 4K");
    o->min_block = sz;
    return 0;
  case O_HUGE:
    if (!strcmp(arg, "off"))
      o->hugepages = 0;
    else if (!strcmp(arg, "try"))
      o->hugepages = 1;
    else if (!strcmp(arg, "require"))
      o->hugepages = 2;
    else
      return bad("hugepages", arg, "expected off, try or require");
    return 0;
  case O_NOMLOCK: o->lock_pool = 0; return 0;
  case O_CUDA: o->cuda_register = 1; return 0;
  case O_REDIS:
    if (strlen(arg) >= sizeof o->redis_url)
      return bad("redis", arg, "too long");
    snprintf(o->redis_url, sizeof o->redis_url, "%s", arg);
    return 0;
  case O_REDISPW:
    if (!*arg || strlen(arg) >= sizeof g_redis_pw_file)
      return bad("redis-password-file", arg, "expected a path");
    snprintf(g_redis_pw_file, sizeof g_redis_pw_file, "%s", arg);
    return 0;
  case O_SENTPW:
    if (!*arg || strlen(arg) >= sizeof g_sent_pw_file)
      return bad("sentinel-password-file", arg, "expected a path");
    snprintf(g_sent_pw_file, sizeof g_sent_pw_file, "%s", arg);
    return 0;
  case O_NS:
    if (!*arg || strlen(arg) >= sizeof o->ns)
      return bad("ns", arg, "expected 1..128 bytes");
    if (strpbrk(arg, "{}") != NULL) /* the namespace is its Redis keys' hash tag */
      return bad("ns", arg, "no braces: the namespace is a Redis Cluster hash tag (docs/redis-ha.md)");
    if (has_space_or_control(arg))
      return bad("ns", arg, "no spaces or control characters: name it like 'qwen2.5-vl-3b'");
    snprintf(o->ns, sizeof o->ns, "%s", arg);
    return 0;
  case O_NODE:
    if (!*arg || strlen(arg) >= sizeof o->node_id)
      return bad("node-id", arg, "expected 1..63 bytes");
    if (has_space_or_control(arg))
      return bad("node-id", arg,
                 "no spaces, newlines or control characters (it is a Redis key and a log field)");
    snprintf(o->node_id, sizeof o->node_id, "%s", arg);
    return 0;
  case O_AUTH: return read_token(arg, o->auth_token, sizeof o->auth_token);
  case O_PULLTOK: return read_token(arg, o->pull_token, sizeof o->pull_token);
  case O_ACL: {
    char err[512];
    ecs__acl_free(g_acl);
    g_acl = NULL;
    o->acl = NULL;
    if (ecs__acl_load(arg, &g_acl, err, sizeof err) != ECS_OK) {
      fprintf(stderr, "ecstore-server: --acl-file: %s\n", err);
      return 2;
    }
    o->acl = g_acl;
    return 0;
  }
  case O_IOTO:
    if (ecs_parse_int(arg, 100, 3600000, &v))
      return bad("io-timeout-ms", arg, "expected 100..3600000");
    o->io_timeout_ms = (int)v;
    return 0;
  case O_RTO:
    if (ecs_parse_int(arg, 10, 60000, &v))
      return bad("redis-timeout-ms", arg, "expected 10..60000");
    o->redis_timeout_ms = (int)v;
    return 0;
  case O_TTL:
    if (ecs_parse_int(arg, 2, 3600, &v))
      return bad("heartbeat-ttl", arg, "expected 2..3600 seconds");
    o->registry_ttl_ms = (int)v * 1000;
    return 0;
  case O_TTLMS:
    if (ecs_parse_int(arg, 1000, 3600000, &v))
      return bad("registry-ttl-ms", arg, "expected 1000..3600000");
    o->registry_ttl_ms = (int)v;
    return 0;
  case O_HIGH:
    if (ecs_parse_double(arg, 0.05, 1.0, &d))
      return bad("high-watermark", arg, "expected 0.05..1.0");
    o->high_watermark = d;
    return 0;
  case O_LOW:
    if (ecs_parse_double(arg, 0.0, 1.0, &d))
      return bad("low-watermark", arg, "expected 0..1.0");
    o->low_watermark = d;
    return 0;
  case O_MAXREQ:
    if (ecs_parse_size(arg, &sz) || sz < (1u << 20))
      return bad("max-request", arg, "expected a size of at least 1M");
    o->max_request = sz;
    return 0;
  case O_THREADS:
    if (ecs_parse_int(arg, 1, ECS_SERVER_MAX_THREADS, &v))
      return bad("threads", arg, "expected 1..256");
    o->threads = (int)v;
    return 0;
  case O_MAXCONN:
    if (ecs_parse_int(arg, 1, 65536, &v))
      return bad("max-conns", arg, "expected 1..65536");
    o->max_conns = (int)v;
    return 0;
  case O_HELLOTO:
    if (ecs_parse_int(arg, 100, 3600000, &v))
      return bad("hello-timeout-ms", arg, "expected 100..3600000");
    o->hello_timeout_ms = (int)v;
    return 0;
  case O_MAXPREAUTH:
    if (ecs_parse_int(arg, 1, 65536, &v))
      return bad("max-preauth-conns", arg, "expected 1..65536");
    o->max_preauth_conns = (int)v;
    return 0;
  case O_AUTHDELAY:
    if (ecs_parse_int(arg, 0, 60000, &v))
      return bad("auth-fail-delay-ms", arg, "expected 0..60000");
    o->auth_fail_delay_ms = (int)v;
    return 0;
  case O_UNPROT: o->unprotected = 1; return 0;
  case O_MAXPINS:
    if (ecs_parse_int(arg, 1, 1 << 24, &v))
      return bad("max-pins-per-conn", arg, "expected 1..16777216");
    o->max_pins = (uint32_t)v;
    return 0;
  case O_SOFTPINTTL:
    if (ecs_parse_int(arg, 0, 1ll << 40, &v))
      return bad("soft-pin-ttl-ms", arg, "expected 0..2^40");
    o->soft_pin_ttl_ms = (uint64_t)v;
    return 0;
  case O_HARDPINMAX:
    if (ecs_parse_size(arg, &sz))
      return bad("hard-pin-max", arg, "expected a size such as 256M (0: half the pool)");
    o->hard_pin_max = sz;
    return 0;
  case O_MAXPINBYTES:
    if (ecs_parse_size(arg, &sz) || sz == 0)
      return bad("max-pinned-per-conn", arg, "expected a size such as 256M");
    o->max_pinned_bytes = sz;
    return 0;
  case O_SCRUB: o->scrub_freed = 1; return 0;
  case O_MAXOBJ:
    if (ecs_parse_int(arg, 1, 1ll << 40, &v))
      return bad("max-objects", arg, "expected 1..2^40");
    o->max_objects = (uint64_t)v;
    return 0;
  case O_PORTFILE:
    if (!*arg || strlen(arg) >= pf_cap) /* before: written to the path cut at 511 bytes */
      return bad("port-file", arg, "expected a path of 1..511 bytes");
    snprintf(port_file, pf_cap, "%s", arg);
    return 0;
  case O_LOG: {
    ecs_log_level_t l;
    if (ecs_log_parse_level(arg, &l))
      return bad("log-level", arg, "expected error, warn, info or debug");
    ecs_log_set_level(l);
    return 0;
  }
  case O_DEBUGOPS: o->enable_debug_ops = 1; return 0;
  case O_SHMSOCK:
    if (!*arg || strlen(arg) >= sizeof o->shm_socket)
      return bad("shm-socket", arg, "expected a path shorter than 108 bytes, or 'off'");
    snprintf(o->shm_socket, sizeof o->shm_socket, "%s", arg);
    return 0;
  case O_SHMUID:
  case O_SHMWUID: {
    int w = c == O_SHMWUID;
    unsigned *list = w ? o->shm_write_uids : o->shm_allow_uids;
    int *n = w ? &o->n_shm_write_uids : &o->n_shm_allow_uids;
    char buf[256];
    if (strlen(arg) >= sizeof buf) /* before: cut at 255 bytes, so 1001 could become 100 */
      return bad(w ? "shm-write-uid" : "shm-allow-uid", arg, "list longer than 255 bytes (16 uids at most)");
    snprintf(buf, sizeof buf, "%s", arg);
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      if (*n == 16 || ecs_parse_int(t, 0, 4294967294LL, &v))
        return bad(w ? "shm-write-uid" : "shm-allow-uid", arg, "expected up to 16 comma-separated uids");
      list[(*n)++] = (unsigned)v;
    }
    return 0;
  }
  case O_RDMA:
    if (strcmp(arg, "auto") && strcmp(arg, "on") && strcmp(arg, "off"))
      return bad("rdma", arg, "expected auto, on or off");
    snprintf(o->rdma, sizeof o->rdma, "%s", arg);
    return 0;
  case O_RDMADEV:
    if (!*arg || strlen(arg) >= sizeof o->rdma_device)
      return bad("rdma-device", arg, "expected a device name");
    snprintf(o->rdma_device, sizeof o->rdma_device, "%s", arg);
    return 0;
  case O_RDMAPORT:
    if (ecs_parse_int(arg, 1, 255, &v))
      return bad("rdma-port", arg, "expected 1..255");
    o->rdma_port = (int)v;
    return 0;
  case O_RDMAGID:
    if (ecs_parse_int(arg, 0, 255, &v))
      return bad("rdma-gid-index", arg, "expected 0..255");
    o->rdma_gid_index = (int)v;
    return 0;
  case O_METRICS: {
    char h[128];
    int p;
    if (ecs_net_parse_hostport(arg, h, sizeof h, &p) || strlen(arg) >= sizeof o->metrics_listen)
      return bad("metrics-listen", arg, "expected HOST:PORT");
    snprintf(o->metrics_listen, sizeof o->metrics_listen, "%s", arg);
    return 0;
  }
  case O_LEASETO:
    if (ecs_parse_int(arg, 100, 3600000, &v))
      return bad("lease-timeout-ms", arg, "expected 100..3600000");
    o->lease_timeout_ms = (int)v;
    return 0;
  case O_PULLTO:
    if (ecs_parse_int(arg, 10, 600000, &v))
      return bad("pull-timeout-ms", arg, "expected 10..600000");
    o->pull_timeout_ms = (int)v;
    return 0;
  case O_PULLTH:
    if (ecs_parse_int(arg, 0, 64, &v))
      return bad("pull-threads", arg, "expected 0..64");
    o->pull_threads = (int)v;
    return 0;
  default: return 2;
  }
}

/* The Redis password, wherever it was given (the --redis URL of a config
 * file, --redis-password-file, ECSTORE_REDIS_PASSWORD; the file wins),
 * ends up in this process's ECSTORE_REDIS_PASSWORD, where the Redis link
 * takes it from (store/redis/rds.h), and out of the URL, which the server logs.
 * The sentinels' password likewise (the URL's sentinel_password,
 * --sentinel-password-file, ECSTORE_SENTINEL_PASSWORD; the file wins) ends
 * up in ECSTORE_SENTINEL_PASSWORD.  0, or an exit status. */
static int settle_redis_password(ecs_server_opts_t *o) {
  if (!o->redis_url[0] || !strcmp(o->redis_url, "none"))
    return 0;
  ecs__rds_url_t u;
  if (ecs__rds_url_parse(o->redis_url, &u) != ECS_OK) {
    char shown[256], port[256];
    const char *why = ecs__rds_url_port_problem(o->redis_url, port, sizeof port);
    if (why)
      fprintf(stderr, "ecstore-server: --redis '%s': %s\n",
              ecs__rds_url_redact(o->redis_url, shown, sizeof shown), why);
    else
      fprintf(stderr,
              "ecstore-server: --redis '%s': expected redis://[USER:PASS@]HOST:PORT[/DB] or "
              "redis-sentinel://[USER:PASS@]H1:P1,H2:P2/MASTER[/DB]\n",
              ecs__rds_url_redact(o->redis_url, shown, sizeof shown));
    return 2;
  }
  int rc = 0;
  if (g_redis_pw_file[0]) {
    char err[600];
    if (ecs__rds_read_secret(g_redis_pw_file, u.pass, sizeof u.pass, err, sizeof err) != ECS_OK) {
      fprintf(stderr, "ecstore-server: --redis-password-file %s\n", err);
      rc = 2;
    }
  }
  if (rc == 0 && g_sent_pw_file[0]) {
    char err[600];
    if (!u.master[0]) {
      fprintf(stderr, "ecstore-server: --sentinel-password-file needs a redis-sentinel:// --redis URL\n");
      rc = 2;
    } else if (ecs__rds_read_secret(g_sent_pw_file, u.spass, sizeof u.spass, err, sizeof err) != ECS_OK) {
      fprintf(stderr, "ecstore-server: --sentinel-password-file %s\n", err);
      rc = 2;
    }
  }
  if (rc == 0 && (u.pass[0] || u.spass[0])) {
    if ((u.pass[0] && setenv("ECSTORE_REDIS_PASSWORD", u.pass, 1) != 0) ||
        (u.spass[0] && setenv("ECSTORE_SENTINEL_PASSWORD", u.spass, 1) != 0) ||
        ecs__rds_url_format(&u, 0, o->redis_url, sizeof o->redis_url) != ECS_OK) {
      fprintf(stderr, "ecstore-server: --redis: cannot keep the passwords out of the URL\n");
      rc = 2;
    }
  }
  memset(&u, 0, sizeof u);
  return rc;
}

static const char *g_config_path = ""; /* the --config file being read */

static int redis_url_parses(const char *url) {
  ecs__rds_url_t u;
  int ok = ecs__rds_url_parse(url, &u) == ECS_OK;
  memset(&u, 0, sizeof u);
  return ok;
}

/* Whether the userinfo of url holds %00. */
static int redis_url_nul(const char *url) {
  const char *at = strrchr(url, '@');
  for (const char *p = url; at && p + 2 < at; p++)
    if (p[0] == '%' && p[1] == '0' && p[2] == '0')
      return 1;
  return 0;
}

/* A --config file holding a Redis password must be private, as password
 * and token files are (before: accepted at mode 0644).  0 or 2. */
static int config_pw_private(void) {
  struct stat st;
  if (!g_config_pw_path[0])
    return 0;
  if (stat(g_config_pw_path, &st) != 0 || !(st.st_mode & (S_IRWXG | S_IRWXO)))
    return 0;
  fprintf(stderr,
          "ecstore-server: --config '%s' holds a Redis password (in its redis URL) and its permissions "
          "%04o let group or others read it; run: chmod 600 '%s'\n",
          g_config_pw_path, (unsigned)(st.st_mode & 07777), g_config_pw_path);
  return 2;
}

static int parse(ecs_server_opts_t *o, int argc, char **argv, char *port_file, size_t pf_cap,
                 int from_config) {
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
    if (c == 'h' || c == O_HELP) {
      usage(stdout);
      exit(0);
    }
    if (c == '?' || c == ':') {
      fprintf(stderr, "ecstore-server: %s option '%s' (see --help)\n",
              c == ':' ? "missing value for" : "unknown or incomplete", argv[optind - 1]);
      return 2;
    }
    if (c == O_CONFIG) {
      if (from_config) {
        fprintf(stderr, "ecstore-server: --config inside a config file is not allowed\n");
        return 2;
      }
      continue; /* read before the command line */
    }
    if (c == O_REDIS && strchr(optarg, '@') != NULL && !redis_url_parses(optarg)) {
      /* a URL that does not parse is no proof of a password on the command line */
      fprintf(stderr,
              "ecstore-server: --redis: the URL's user or password part does not parse%s; write "
              "redis://USER@HOST:PORT/DB with the password elsewhere, %%XX-escaping ':', '@', '/' and '%%'\n",
              redis_url_nul(optarg) ? " (%00 would put a NUL byte in it)" : "");
      return 2;
    }
    if (c == O_REDIS && from_config && ecs__rds_url_has_password(optarg))
      snprintf(g_config_pw_path, sizeof g_config_pw_path, "%s", g_config_path);
    if (c == O_REDIS && !from_config && ecs__rds_url_has_password(optarg)) {
      fprintf(stderr,
              "ecstore-server: --redis: a password on the command line is visible to every local "
              "user (ps, /proc/PID/cmdline); put it in --redis-password-file FILE, in the environment "
              "(ECSTORE_REDIS_PASSWORD) or in the URL of a --config file\n");
      return 2;
    }
    int rc = apply(o, c, optarg, port_file, pf_cap);
    if (rc)
      return rc;
  }
  if (optind < argc) {
    fprintf(stderr, "ecstore-server: unexpected argument '%s' (see --help)\n", argv[optind]);
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  ecs_server_opts_t o;
  ecs_server_opts_init(&o);
  ecs_log_set_tag("server");
  char port_file[512] = "";

  /* The config file first, so that the command line overrides it. */
  for (int i = 1; i < argc; i++) {
    const char *path = NULL;
    if (!strcmp(argv[i], "--config") && i + 1 < argc)
      path = argv[i + 1];
    else if (!strncmp(argv[i], "--config=", 9))
      path = argv[i] + 9;
    if (!path)
      continue;
    int cargc;
    char **cargv;
    char err[600];
    if (ecs_conf_to_argv(path, &cargc, &cargv, err, sizeof err) != ECS_OK) {
      fprintf(stderr, "ecstore-server: config: %s\n", err);
      return 2;
    }
    char **full = calloc((size_t)cargc + 2, sizeof *full);
    if (!full)
      return 1;
    full[0] = argv[0];
    memcpy(full + 1, cargv, (size_t)cargc * sizeof *full);
    g_config_path = path;
    int rc = parse(&o, cargc + 1, full, port_file, sizeof port_file, 1);
    if (rc == 0)
      rc = config_pw_private();
    free(full);
    ecs_conf_free_argv(cargc, cargv);
    if (rc) {
      fprintf(stderr, "ecstore-server: (in config file %s)\n", path);
      return rc;
    }
  }
  int rc = parse(&o, argc, argv, port_file, sizeof port_file, 0);
  if (rc)
    return rc;
  rc = settle_redis_password(&o);
  if (rc)
    return rc;
  if (o.min_block > o.pool_size) { /* before: a pool of min-block bytes, silently */
    fprintf(stderr,
            "ecstore-server: --min-block (%llu bytes) is larger than --pool-size (%llu bytes): give a "
            "--min-block of at most the pool's size (default 4K), or a larger --pool-size\n",
            (unsigned long long)o.min_block, (unsigned long long)o.pool_size);
    return 2;
  }
  if (o.low_watermark > o.high_watermark) {
    fprintf(stderr, "ecstore-server: --low-watermark must not exceed --high-watermark\n");
    return 2;
  }

  rc = ecs_server_create(&o, &g_server);
  if (rc)
    return 1; /* the reason is logged already, in one line */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (port_file[0] && write_port_file(port_file, ecs_server_port(g_server)) != 0) {
    fprintf(stderr, "ecstore-server: cannot write --port-file '%s': %s\n", port_file, strerror(errno));
    ecs_server_destroy(g_server);
    return 1;
  }
  rc = ecs_server_run(g_server);
  ecs_server_destroy(g_server);
  g_server = NULL;
  ecs__acl_free(g_acl);
  return rc ? 1 : 0;
}
