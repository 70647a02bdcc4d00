/* ecstore-cli: put, get, exists, rm, stat, ping and wait from the shell. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ecstore/ecstore.h"
#include "store/core/parse.h"
#include "store/redis/rds.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ecstore-cli [options] COMMAND [args]\n"
          "\n"
          "commands:\n"
          "  put KEY FILE [--dtype D --shape A,B,...]  store FILE's bytes under KEY\n"
          "                                           (default dtype u8, shape = file size)\n"
          "  get KEY FILE                             write KEY's bytes to FILE ('-': stdout)\n"
          "  exists KEY...                            one line per key: 'KEY yes' or 'KEY no'\n"
          "  rm KEY...                                remove keys; one line per key\n"
          "  stat [--json]                            counters of every server (--json: one JSON\n"
          "                                           array, an object per server)\n"
          "  ping                                     round trip to every server\n"
          "  wait [SECONDS]                           until every server answers (a server starting\n"
          "                                           up is populating its pool), at most SECONDS\n"
          "                                           (default 60); with servers from Redis, until\n"
          "                                           one is registered in the namespace\n"
          "\n"
          "options:\n"
          "  --server HOST:PORT[,...]  servers (default 127.0.0.1:7700, or $ECSTORE_SERVERS; with\n"
          "                            --redis and no servers: those in Redis's registry)\n"
          "  --redis URL               Redis for 'exists' (default $ECSTORE_REDIS; none: ask the servers)\n"
          "                            its password: $ECSTORE_REDIS_PASSWORD, never in --redis;\n"
          "                            also redis-sentinel://H:P,H:P/MASTER (the sentinels' own\n"
          "                            password: $ECSTORE_SENTINEL_PASSWORD) and\n"
          "                            redis-cluster://H1:P1[,H2:P2...] (seeds, tried in order)\n"
          "  --placement P             where a put goes when the servers come from Redis:\n"
          "                            hash (default), local, least-loaded (docs/multihost.md)\n"
          "  --replicas N              copies of a put on distinct servers (1..8, default 1;\n"
          "                            servers from Redis only)\n"
          "  --ns NAME                 namespace (default 'default', or $ECSTORE_NS)\n"
          "  --auth-token-file FILE    token the servers require\n"
          "  --timeout-ms MS           deadline of each call (default 10000)\n"
          "  --dtype D                 f32 f16 bf16 f8e4m3 f8e5m2 i8 u8 i32 i64\n"
          "                            f64 i16 u16 u32 u64 bool (put)\n"
          "  --shape A,B,...           tensor shape (put)\n"
          "  --help                    this text\n"
          "\n"
          "Exit status: 0 on success, 1 when an operation failed (a missing key for\n"
          "get, a failed put), 2 on bad usage.\n");
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The reason for a failed call: the client's message names the server and
 * the cause; the bare code text only when there is no message. */
static const char *why(ecs_client_t *c, int rc) {
  const char *m = c ? ecs_client_errmsg(c) : "";
  return rc && *m ? m : ecs_strerror(rc);
}

static int die_usage(const char *msg, const char *arg) {
  fprintf(stderr, "ecstore-cli: %s%s%s (see --help)\n", msg, arg ? ": " : "", arg ? arg : "");
  return 2;
}

static int read_file(const char *path, void **data, size_t *len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) {
    fprintf(stderr, "ecstore-cli: %s: %s\n", path, strerror(errno));
    return 1;
  }
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0)
      break;
    if (n == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  int err = ferror(f);
  if (f != stdin)
    fclose(f);
  if (!buf || err) {
    free(buf);
    fprintf(stderr, "ecstore-cli: %s: read failed\n", path);
    return 1;
  }
  *data = buf;
  *len = n;
  return 0;
}

static int read_token(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f || !fgets(out, (int)cap, f)) {
    fprintf(stderr, "ecstore-cli: --auth-token-file %s: %s\n", path, f ? "empty" : strerror(errno));
    if (f)
      fclose(f);
    return 2;
  }
  fclose(f);
  out[strcspn(out, "\r\n")] = '\0';
  return 0;
}

static void print_shape(FILE *f, const ecs_tensor_desc_t *d) {
  for (unsigned i = 0; i < d->ndim; i++)
    fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)d->shape[i]);
}

static int cmd_put(ecs_client_t *c, int argc, char **argv, const char *dtype, const char *shape) {
  if (argc != 2)
    return die_usage("put takes KEY FILE", NULL);
  void *data;
  size_t len;
  if (read_file(argv[1], &data, &len))
    return 1;
  ecs_tensor_t t = {.data = data, .nbytes = len};
  ecs_dtype_t dt = ECS_DTYPE_U8;
  if (dtype && ecs_dtype_parse(dtype, &dt) != ECS_OK) {
    free(data);
    return die_usage("unknown dtype", dtype);
  }
  t.desc.dtype = (uint8_t)dt;
  if (shape) {
    if (ecs_shape_parse(shape, &t.desc) != ECS_OK) {
      free(data);
      return die_usage("bad shape", shape);
    }
  } else {
    size_t es = ecs_dtype_size(dt);
    if (len % es) {
      free(data);
      fprintf(stderr, "ecstore-cli: %s: %zu bytes is not a whole number of %s elements\n", argv[1], len,
              ecs_dtype_name(dt));
      return 1;
    }
    t.desc.ndim = 1;
    t.desc.shape[0] = len / es;
  }
  uint64_t want;
  if (ecs_tensor_nbytes(&t.desc, &want) != ECS_OK || want != len) {
    free(data);
    fprintf(stderr, "ecstore-cli: %s holds %zu bytes but dtype %s and shape %s make %llu\n", argv[1], len,
            ecs_dtype_name(dt), shape ? shape : "?", (unsigned long long)want);
    return 1;
  }
  ecs_key_t k = {argv[0], strlen(argv[0])};
  int st;
  int rc = ecs_put_batch(c, &k, &t, 1, &st);
  free(data);
  if (rc == ECS_OK && st == ECS_EREDIS) { /* stored: only its Redis record is late */
    /* the client's message is the whole sentence ("1 of 1 items stored
     * but not yet published to Redis ...") */
    fprintf(stderr, "ecstore-cli: put %s: %s\n", argv[0], why(c, st));
    return 0;
  }
  if (rc || st) {
    fprintf(stderr, "ecstore-cli: put %s: %s\n", argv[0], why(c, rc ? rc : st));
    return 1;
  }
  size_t stored = 0, wanted = 0;
  ecs_client_put_copies(c, &stored, &wanted);
  if (stored < wanted) /* stored, but with fewer copies than --replicas asked for */
    fprintf(stderr, "ecstore-cli: put %s: %zu of %zu copies stored\n", argv[0], stored, wanted);
  return 0;
}

static int cmd_get(ecs_client_t *c, int argc, char **argv) {
  if (argc != 2)
    return die_usage("get takes KEY FILE", NULL);
  ecs_key_t k = {argv[0], strlen(argv[0])};
  ecs_get_buf_t b;
  memset(&b, 0, sizeof b);
  int rc = ecs_get_batch_alloc(c, &k, &b, 1);
  if (rc || b.status) {
    fprintf(stderr, "ecstore-cli: get %s: %s\n", argv[0], rc ? why(c, rc) : ecs_strerror(b.status));
    ecs_free(b.data);
    return 1;
  }
  int to_stdout = !strcmp(argv[1], "-");
  FILE *f = to_stdout ? stdout : fopen(argv[1], "wb");
  if (!f || (b.nbytes && fwrite(b.data, 1, (size_t)b.nbytes, f) != b.nbytes) ||
      (!to_stdout && fclose(f) != 0)) {
    fprintf(stderr, "ecstore-cli: %s: %s\n", argv[1], strerror(errno));
    ecs_free(b.data);
    return 1;
  }
  ecs_free(b.data);
  FILE *info = to_stdout ? stderr : stdout;
  fprintf(info, "%s: %llu bytes, dtype %s, shape ", argv[0], (unsigned long long)b.nbytes,
          ecs_dtype_name(b.desc.dtype));
  print_shape(info, &b.desc);
  fprintf(info, "\n");
  return 0;
}

static int cmd_keys(ecs_client_t *c, int argc, char **argv, int remove) {
  if (argc < 1)
    return die_usage(remove ? "rm takes KEY..." : "exists takes KEY...", NULL);
  ecs_key_t *keys = calloc((size_t)argc, sizeof *keys);
  int *out = calloc((size_t)argc, sizeof *out);
  if (!keys || !out) {
    free(keys);
    free(out);
    return 1;
  }
  for (int i = 0; i < argc; i++) {
    keys[i].data = argv[i];
    keys[i].len = strlen(argv[i]);
  }
  int rc =
      remove ? ecs_remove_batch(c, keys, (size_t)argc, out) : ecs_exists_batch(c, keys, (size_t)argc, out);
  int ret = 0;
  if (rc) {
    fprintf(stderr, "ecstore-cli: %s: %s\n", remove ? "rm" : "exists", why(c, rc));
    ret = 1;
  } else {
    for (int i = 0; i < argc; i++) {
      if (remove) {
        printf("%s %s\n", argv[i], out[i] == ECS_OK ? "removed" : ecs_strerror(out[i]));
        ret |= out[i] != ECS_OK;
      } else {
        printf("%s %s\n", argv[i], out[i] ? "yes" : "no");
      }
    }
  }
  free(keys);
  free(out);
  return ret;
}

/* s as a JSON string: quotes, backslashes and control bytes escaped. */
static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

/* stat --json: an array with an object per server, in --server order; a
 * server that failed has "error" (and the exit status is 1). */
static int cmd_stat_json(ecs_client_t *c) {
  int ret = 0;
  printf("[");
  for (size_t i = 0; i < ecs_client_server_count(c); i++) {
    ecs_server_stat_t st;
    ecs_server_stat_ext_t ex;
    int rc = ecs_stat_ext(c, i, &st, &ex);
    printf("%s\n  {\"index\": %zu, ", i ? "," : "", i);
    if (rc) {
      printf("\"error\": ");
      json_str(why(c, rc));
      printf("}");
      ret = 1;
      continue;
    }
    printf("\"address\": ");
    json_str(st.address);
    printf(", \"node_id\": ");
    json_str(st.node_id);
    const struct {
      const char *k;
      uint64_t v;
    } f[] = {{"epoch", st.epoch},
             {"pool_size", st.pool_size},
             {"bytes_in_use", st.bytes_in_use},
             {"bytes_requested", st.bytes_requested},
             {"bytes_free", st.bytes_free},
             {"largest_free", st.largest_free},
             {"objects", st.objects},
             {"puts", st.puts},
             {"gets", st.gets},
             {"hits", st.hits},
             {"misses", st.misses},
             {"evictions", st.evictions},
             {"removes", st.removes},
             {"connections", st.connections}};
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
      printf(", \"%s\": %llu", f[k].k, (unsigned long long)f[k].v);
    printf(", \"pool_pinned\": %s, \"pool_cuda_registered\": %s, \"redis_up\": %s}",
           st.pool_locked ? "true" : "false",
           ex.pool_cuda_registered == ECS_STAT_UNKNOWN ? "null"
           : ex.pool_cuda_registered                   ? "true"
                                                       : "false",
           st.redis_ok ? "true" : "false");
  }
  printf("\n]\n");
  return ret;
}

static int cmd_stat(ecs_client_t *c) {
  int ret = 0;
  for (size_t i = 0; i < ecs_client_server_count(c); i++) {
    ecs_server_stat_t st;
    ecs_server_stat_ext_t ex;
    int rc = ecs_stat_ext(c, i, &st, &ex);
    if (rc) {
      fprintf(stderr, "ecstore-cli: stat server %zu: %s\n", i, why(c, rc));
      ret = 1;
      continue;
    }
    double mib = 1024.0 * 1024.0;
    printf("server %s (node %s, epoch %llu)\n", st.address, st.node_id, (unsigned long long)st.epoch);
    printf("  pool        %.1f MiB, %s, %s\n", (double)st.pool_size / mib,
           st.pool_locked ? "pinned" : "not pinned",
           ex.pool_cuda_registered == ECS_STAT_UNKNOWN ? "CUDA registration not reported (an older server)"
           : ex.pool_cuda_registered                   ? "CUDA-registered"
                                                       : "not CUDA-registered");
    printf("  in use      %.1f MiB (requested %.1f MiB), free %.1f MiB, largest free %.1f MiB\n",
           (double)st.bytes_in_use / mib, (double)st.bytes_requested / mib, (double)st.bytes_free / mib,
           (double)st.largest_free / mib);
    printf("  objects     %llu\n", (unsigned long long)st.objects);
    printf("  puts %llu, gets %llu (hits %llu, misses %llu), evictions %llu, removes %llu\n",
           (unsigned long long)st.puts, (unsigned long long)st.gets, (unsigned long long)st.hits,
           (unsigned long long)st.misses, (unsigned long long)st.evictions, (unsigned long long)st.removes);
    printf("  connections %llu, redis %s, path tcp\n", (unsigned long long)st.connections,
           st.redis_ok ? "up" : "DOWN");
  }
  return ret;
}

/* wait [SECONDS]: connects and pings until every server answers, retrying
 * what a server still starting causes (connection refused, no answer yet,
 * not yet in Redis's registry) every 200 ms; anything else (a namespace or
 * token refused) ends it at once.  0 when ready, 1 otherwise. */
static int cmd_wait(ecs_client_config_t *cfg, int argc, char **argv) {
  long long secs = 60;
  if (argc > 1 || (argc == 1 && ecs_parse_int(argv[0], 1, 86400, &secs)))
    return die_usage("wait takes [SECONDS], 1..86400", argc ? argv[0] : NULL);
  int discover = (!cfg->servers || !*cfg->servers) && cfg->redis_url && *cfg->redis_url;
  uint64_t t0 = mono_ms(), deadline = t0 + (uint64_t)secs * 1000u;
  char last[300] = "";
  for (;;) {
    uint64_t now = mono_ms();
    if (now >= deadline)
      break;
    int left = (int)(deadline - now);
    cfg->connect_timeout_ms = left < 1000 ? left : 1000;
    cfg->timeout_ms = left < 2000 ? left : 2000;
    ecs_client_t *c = NULL;
    char err[300] = "";
    int rc = ecs_client_connect(cfg, &c, err, sizeof err);
    if (rc == ECS_OK && discover && ecs_client_server_count(c) == 0) {
      char shown[256];
      snprintf(last, sizeof last, "no servers registered in namespace '%s' (Redis %s)",
               cfg->ns && *cfg->ns ? cfg->ns : "default",
               ecs__rds_url_redact(cfg->redis_url, shown, sizeof shown));
      rc = ECS_ECONN;
    } else if (rc == ECS_OK) {
      rc = ecs_ping(c);
      if (rc == ECS_OK) {
        printf("ready: %zu server%s answered in %.1f s\n", ecs_client_server_count(c),
               ecs_client_server_count(c) == 1 ? "" : "s", (double)(mono_ms() - t0) / 1000.0);
        ecs_client_close(c);
        return 0;
      }
      snprintf(last, sizeof last, "%s", why(c, rc));
    } else {
      snprintf(last, sizeof last, "%s", err[0] ? err : ecs_strerror(rc));
    }
    ecs_client_close(c);
    if (rc != ECS_ECONN && rc != ECS_ETIMEDOUT) {
      fprintf(stderr, "ecstore-cli: wait: %s\n", last);
      return 1;
    }
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "ecstore-cli: wait: not ready after %lld s: %s\n", secs, last[0] ? last : "no answer");
  return 1;
}

int main(int argc, char **argv) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  if (getenv("ECSTORE_SERVERS"))
    cfg.servers = getenv("ECSTORE_SERVERS");
  if (getenv("ECSTORE_REDIS"))
    cfg.redis_url = getenv("ECSTORE_REDIS");
  if (getenv("ECSTORE_NS"))
    cfg.ns = getenv("ECSTORE_NS");
  const char *dtype = NULL, *shape = NULL;
  static char token[300];
  enum {
    O_SERVER = 256,
    O_REDIS,
    O_NS,
    O_AUTH,
    O_TIMEOUT,
    O_DTYPE,
    O_SHAPE,
    O_JSON,
    O_HELP,
    O_PLACE,
    O_REPL
  };
  int json = 0;
  static const struct option opts[] = {{"server", required_argument, 0, O_SERVER},
                                       {"redis", required_argument, 0, O_REDIS},
                                       {"ns", required_argument, 0, O_NS},
                                       {"placement", required_argument, 0, O_PLACE},
                                       {"replicas", required_argument, 0, O_REPL},
                                       {"auth-token-file", required_argument, 0, O_AUTH},
                                       {"timeout-ms", required_argument, 0, O_TIMEOUT},
                                       {"dtype", required_argument, 0, O_DTYPE},
                                       {"shape", required_argument, 0, O_SHAPE},
                                       {"json", no_argument, 0, O_JSON},
                                       {"help", no_argument, 0, O_HELP},
                                       {0, 0, 0, 0}};
  opterr = 0;
  int o;
  long long v;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case O_SERVER: cfg.servers = optarg; break;
    case O_REDIS:
      if (ecs__rds_url_has_password(optarg)) { /* never echoed: it is the secret */
        fprintf(stderr,
                "ecstore-cli: --redis: a password on the command line is visible to every local user; "
                "give it in ECSTORE_REDIS_PASSWORD (or the whole URL in ECSTORE_REDIS)\n");
        return 2;
      }
      cfg.redis_url = strcmp(optarg, "none") ? optarg : NULL;
      break;
    case O_NS: cfg.ns = optarg; break;
    case O_PLACE: cfg.placement = optarg; break;
    case O_REPL:
      if (ecs_parse_int(optarg, 1, ECS_MAX_REPLICAS, &v))
        return die_usage("--replicas expects 1..8", optarg);
      cfg.replicas = (int)v;
      break;
    case O_AUTH:
      if (read_token(optarg, token, sizeof token))
        return 2;
      cfg.auth_token = token;
      break;
    case O_TIMEOUT:
      if (ecs_parse_int(optarg, 1, 3600000, &v))
        return die_usage("--timeout-ms expects 1..3600000", optarg);
      cfg.timeout_ms = (int)v;
      cfg.connect_timeout_ms = (int)v < cfg.connect_timeout_ms ? (int)v : cfg.connect_timeout_ms;
      break;
    case O_DTYPE: dtype = optarg; break;
    case O_SHAPE: shape = optarg; break;
    case O_JSON: json = 1; break;
    case 'h':
    case O_HELP: usage(stdout); return 0;
    default: return die_usage("unknown or incomplete option", argv[optind - 1]);
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[optind];
  int cargc = argc - optind - 1;
  char **cargv = argv + optind + 1;
  static const char *known[] = {"put", "get", "exists", "rm", "stat", "ping", "wait"};
  int ok = 0;
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    ok |= !strcmp(cmd, known[i]);
  if (!ok)
    return die_usage("unknown command", cmd);
  if ((dtype || shape) && strcmp(cmd, "put"))
    return die_usage("--dtype and --shape go with put", NULL);
  if (json && strcmp(cmd, "stat"))
    return die_usage("--json goes with stat", NULL);

  if (cfg.redis_url && *cfg.redis_url) { /* a port out of range: say which, not "bad Redis URL" */
    char shown[256], port[256];
    ecs__rds_url_t u;
    const char *bad = ecs__rds_url_parse(cfg.redis_url, &u) != ECS_OK
                          ? ecs__rds_url_port_problem(cfg.redis_url, port, sizeof port)
                          : NULL;
    memset(&u, 0, sizeof u); /* it may hold the password */
    if (bad) {
      fprintf(stderr, "ecstore-cli: Redis URL '%s': %s\n",
              ecs__rds_url_redact(cfg.redis_url, shown, sizeof shown), bad);
      return 2;
    }
  }
  if (!strcmp(cmd, "wait"))
    return cmd_wait(&cfg, cargc, cargv);
  ecs_client_t *c;
  char err[300];
  int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
  if (rc) {
    fprintf(stderr, "ecstore-cli: %s\n", err[0] ? err : ecs_strerror(rc));
    return 1;
  }
  /* Servers from Redis's registry, and none there: a wrong --ns (or a
   * Redis other than the servers') would otherwise read as an empty
   * store (stat printing nothing, ping answering pong). */
  if ((!cfg.servers || !*cfg.servers) && cfg.redis_url && *cfg.redis_url && ecs_client_server_count(c) == 0) {
    char shown[256];
    fprintf(stderr,
            "ecstore-cli: no servers registered in namespace '%s' (Redis %s); check --ns (or "
            "ECSTORE_NS) against the servers' --ns, or name them with --server\n",
            cfg.ns && *cfg.ns ? cfg.ns : "default", ecs__rds_url_redact(cfg.redis_url, shown, sizeof shown));
    ecs_client_close(c);
    return 1;
  }
  int ret;
  if (!strcmp(cmd, "put"))
    ret = cmd_put(c, cargc, cargv, dtype, shape);
  else if (!strcmp(cmd, "get"))
    ret = cmd_get(c, cargc, cargv);
  else if (!strcmp(cmd, "exists"))
    ret = cmd_keys(c, cargc, cargv, 0);
  else if (!strcmp(cmd, "rm"))
    ret = cmd_keys(c, cargc, cargv, 1);
  else if (!strcmp(cmd, "stat"))
    ret = json ? cmd_stat_json(c) : cmd_stat(c);
  else {
    rc = ecs_ping(c);
    if (rc)
      fprintf(stderr, "ecstore-cli: ping: %s\n", why(c, rc));
    else
      printf("pong\n");
    ret = rc ? 1 : 0;
  }
  ecs_client_close(c);
  return ret;
}
