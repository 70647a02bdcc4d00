/*
 * ecs-example-proxy: routes each request of the load generator through
 * the stand-in engine instances, as vLLM's disaggregated proxy does.
 *
 * For each request: hash every image (its mm_hash, ecs_content_key of the
 * bytes), ask the scheduler ecs_ec_has() which are stored already (cache
 * hits skip the encoder; an error counts as "not stored"), send the rest to
 * an encoder, then
 *   1E1PD:   the request to a PD worker, whose tokens stream back;
 *   1E1P1D:  the request to a prefill worker (which publishes the KV) and,
 *            at the same time, to a decode worker (which waits for the KV
 *            with a timeout, then streams the tokens).  When the prefill
 *            worker cannot be reached the proxy aborts the request's KV
 *            (ecs_kv_abort) so decode ends at once with the reason.
 * Instances of each role are taken round-robin.  An encoder failure is not
 * a request failure (the consumer recomputes); a prefill/decode failure
 * ends the request with its reason, which reaches the load generator.
 *
 * Threads: one per load-generator connection, each with its own
 * connections to the workers (opened once, reused).  Every read has a
 * deadline.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ecstore/ec_connector.h"
#include "examples/ex_model.h"
#include "examples/ex_util.h"
#include "examples/ex_wire.h"
#include "store/core/log.h"
#include "store/core/net.h"

#define MAX_INST 16 /* instances of one role */
#define IDLE_TIMEOUT_MS (600 * 1000)

enum { R_ENC, R_PRE, R_DEC, R_PD, R_COUNT };
static const char *role_names[R_COUNT] = {"encoder", "prefill", "decode", "pd"};

/* Instances of one role. */
typedef struct role_set {
  size_t n;                     /* how many */
  char id[MAX_INST][EX_ID_MAX]; /* instance ids */
  char addr[MAX_INST][160];     /* HOST:PORT */
  atomic_uint rr;               /* round-robin counter */
} role_set_t;

typedef struct proxy {
  role_set_t roles[R_COUNT];  /* the instances */
  int split;                  /* 1: 1E1P1D (prefill + decode), 0: PD */
  int timeout_ms;             /* deadline of one hop's I/O */
  int kv_timeout_ms;          /* decode's wait for the KV */
  uint64_t fault_evict_bytes; /* fault test: flood the store after has() */
  ecs_ec_conn_t *conn;        /* scheduler connector (has), and the flood */
  pthread_mutex_t flood_mu;   /* one flood at a time */
  atomic_ullong flood_seq;    /* filler key counter */
} proxy_t;

static proxy_t P;

/* One load-generator connection and its worker connections. */
typedef struct session {
  int fd;                     /* the load generator */
  int wfd[R_COUNT][MAX_INST]; /* worker connections, -1 until opened */
  ex_buf_t in, out;           /* frame buffers */
  ex_job_t *job, *sub;        /* the request, and a copy for one hop */
  uint8_t *img;               /* image scratch */
  size_t img_cap;             /* its size */
} session_t;

static uint64_t deadline(void) {
  return ecs_now_ms() + (uint64_t)P.timeout_ms;
}

static void fail(ex_done_t *d, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(ex_done_t *d, int status, const char *fmt, ...) {
  if (d->status != 0)
    return; /* the first reason wins */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->reason, sizeof d->reason, fmt, ap);
  va_end(ap);
  d->status = status;
}

static void drop(session_t *s, int r, size_t i) {
  if (s->wfd[r][i] >= 0)
    close(s->wfd[r][i]);
  s->wfd[r][i] = -1;
}

/* Sends a job to instance i of role r, (re)connecting as needed: a reused
 * connection the worker closed while idle is retried once on a fresh one. */
static int send_job(session_t *s, int r, size_t i, uint16_t type, const ex_job_t *j) {
  s->out.len = 0;
  ex_job_encode(&s->out, j);
  for (int attempt = 0; attempt < 2; attempt++) {
    int fresh = 0;
    if (s->wfd[r][i] < 0) {
      int rc = ex_connect(P.roles[r].addr[i], P.timeout_ms, &s->wfd[r][i]);
      if (rc != ECS_OK) {
        s->wfd[r][i] = -1;
        return rc;
      }
      fresh = 1;
    }
    int rc = ex_send_buf(s->wfd[r][i], type, &s->out, deadline());
    if (rc == ECS_OK)
      return ECS_OK;
    drop(s, r, i);
    if (fresh)
      return rc;
  }
  return ECS_ECONN;
}

/* Receives frames from instance i of role r until its DONE, relaying
 * TOKEN frames to the load generator when relay is set.  0 or an error
 * (the connection is then dropped). */
static int recv_done(session_t *s, int r, size_t i, int relay, ex_done_t *d) {
  for (;;) {
    uint16_t type;
    size_t len;
    int rc = ex_recv(s->wfd[r][i], &type, &s->in, &len, deadline());
    if (rc != ECS_OK) {
      drop(s, r, i);
      return rc;
    }
    if (type == EX_MSG_TOKEN && relay) {
      /* a load generator that went away does not stop the drain */
      if (s->fd >= 0 && ex_send(s->fd, EX_MSG_TOKEN, s->in.p, len, deadline()) != ECS_OK) {
        close(s->fd);
        s->fd = -1;
      }
      continue;
    }
    if (type == EX_MSG_DONE && ex_done_decode(s->in.p, len, d) == ECS_OK)
      return ECS_OK;
    drop(s, r, i);
    return ECS_EPROTO;
  }
}

static size_t pick(int r) {
  return atomic_fetch_add(&P.roles[r].rr, 1) % P.roles[r].n;
}

/* Fault test: saves fillers of fault_evict_bytes in all so that the
 * pool's FIFO eviction drops what has() just reported stored. */
static void flood(void) {
  const uint64_t chunk = 64 * 1024;
  uint8_t *b = malloc(chunk);
  if (b == NULL)
    return;
  pthread_mutex_lock(&P.flood_mu);
  for (uint64_t done = 0; done < P.fault_evict_bytes; done += chunk) {
    unsigned long long k = atomic_fetch_add(&P.flood_seq, 1);
    memset(b, (int)(k & 0xff), chunk);
    memcpy(b, &k, sizeof k);
    char key[64];
    snprintf(key, sizeof key, "filler-%d-%llu", (int)getpid(), k);
    ecs_tensor_t t = {b, chunk, {ECS_DTYPE_U8, 1, {chunk}}};
    if (ecs_ec_save(P.conn, key, &t) != ECS_OK)
      break;
  }
  /* collect every failure (a filler that did not fit is no matter), so
   * none keeps a queue slot */
  ecs_ec_save_result_t f[16];
  size_t nf;
  while (ecs_ec_wait_for_save(P.conn, -1, f, 16, &nf) == ECS_EIO && nf > 0) {
  }
  pthread_mutex_unlock(&P.flood_mu);
  free(b);
}

static void handle(session_t *s, ex_done_t *res) {
  ex_job_t *j = s->job;
  uint64_t t0 = ex_now_us();
  size_t inb = ex_image_nbytes(j->width, j->height);
  if (inb > s->img_cap) {
    free(s->img);
    s->img = malloc(inb);
    s->img_cap = s->img ? inb : 0;
  }
  if (s->img == NULL) {
    fail(res, ECS_ENOMEM, "proxy: out of memory");
    return;
  }
  const char *keys[EX_MAX_IMAGES];
  int has[EX_MAX_IMAGES];
  for (uint32_t i = 0; i < j->n_images; i++) {
    ex_image_generate(j->seeds[i], j->width, j->height, s->img);
    ex_image_hash(s->img, j->width, j->height, j->hashes[i]);
    keys[i] = j->hashes[i];
  }
  res->st.images = j->n_images;
  if (j->n_images > 0) {
    int rc = ecs_ec_has(P.conn, keys, j->n_images, has);
    if (rc != ECS_OK) {
      res->st.has_errors++;
      ECS_LOG_W("%s: has() failed (%s): every image goes to an encoder", j->req_id, ecs_err_name(rc));
      memset(has, 0, sizeof has);
    }
  }
  /* the encoder gets each image not stored, once */
  ex_job_t *e = s->sub;
  *e = *j;
  e->n_images = 0;
  e->n_prompt = 0;
  int any_hit = 0;
  for (uint32_t i = 0; i < j->n_images; i++) {
    j->cached[i] = has[i] ? 1u : 0u;
    if (has[i]) {
      res->st.has_hits++;
      any_hit = 1;
      continue;
    }
    int dup = 0;
    for (uint32_t k = 0; k < e->n_images && !dup; k++)
      dup = strcmp(e->hashes[k], j->hashes[i]) == 0;
    if (!dup) {
      e->seeds[e->n_images] = j->seeds[i];
      memcpy(e->hashes[e->n_images], j->hashes[i], 33);
      e->cached[e->n_images] = 0;
      e->n_images++;
    }
  }
  if (any_hit && P.fault_evict_bytes > 0)
    flood();
  res->st.proxy_us += ex_now_us() - t0;

  if (e->n_images > 0) {
    size_t ei = pick(R_ENC);
    ex_done_t d;
    memset(&d, 0, sizeof d);
    int rc = send_job(s, R_ENC, ei, EX_MSG_ENCODE, e);
    if (rc == ECS_OK)
      rc = recv_done(s, R_ENC, ei, 0, &d);
    if (rc != ECS_OK || d.status != 0) {
      /* not fatal: the consumer recomputes what was not stored */
      res->st.encoder_errors++;
      ECS_LOG_W("%s: encoder %s: %s", j->req_id, P.roles[R_ENC].id[ei],
                rc != ECS_OK ? ecs_strerror(rc) : d.reason);
    }
    ex_stats_add(&res->st, &d.st);
    if (d.reason[0] != '\0' && res->reason[0] == '\0')
      snprintf(res->reason, sizeof res->reason, "%s", d.reason); /* a note (save failures) */
  }

  if (!P.split) {
    size_t pi = pick(R_PD);
    ex_done_t d;
    memset(&d, 0, sizeof d);
    int rc = send_job(s, R_PD, pi, EX_MSG_PREFILL, j);
    if (rc == ECS_OK)
      rc = recv_done(s, R_PD, pi, 1, &d);
    if (rc != ECS_OK)
      fail(res, rc, "proxy: pd worker %s: %s", P.roles[R_PD].id[pi], ecs_strerror(rc));
    else if (d.status != 0)
      fail(res, d.status, "%s", d.reason);
    ex_stats_add(&res->st, &d.st);
    snprintf(res->path, sizeof res->path, "%s", d.path);
    return;
  }

  /* 1E1P1D: prefill and decode at once; decode waits for the KV */
  size_t pi = pick(R_PRE), di = pick(R_DEC);
  snprintf(j->prefill_instance, sizeof j->prefill_instance, "%s", P.roles[R_PRE].id[pi]);
  j->kv_timeout_ms = (uint32_t)P.kv_timeout_ms;
  ex_done_t dp, dd;
  memset(&dp, 0, sizeof dp);
  memset(&dd, 0, sizeof dd);
  int prc = send_job(s, R_PRE, pi, EX_MSG_PREFILL, j);
  if (prc != ECS_OK) {
    char why[160];
    snprintf(why, sizeof why, "proxy: prefill %s unreachable: %s", P.roles[R_PRE].id[pi], ecs_strerror(prc));
    ecs_kv_abort(P.conn, j->req_id, why);
    fail(res, prc, "%s", why);
  }
  int drc = send_job(s, R_DEC, di, EX_MSG_DECODE, j);
  if (drc == ECS_OK)
    drc = recv_done(s, R_DEC, di, 1, &dd);
  if (drc != ECS_OK)
    fail(res, drc, "proxy: decode %s: %s", P.roles[R_DEC].id[di], ecs_strerror(drc));
  else if (dd.status != 0)
    fail(res, dd.status, "%s", dd.reason);
  if (prc == ECS_OK) {
    prc = recv_done(s, R_PRE, pi, 0, &dp);
    if (prc != ECS_OK)
      fail(res, prc, "proxy: prefill %s: %s", P.roles[R_PRE].id[pi], ecs_strerror(prc));
    else if (dp.status != 0)
      fail(res, dp.status, "%s", dp.reason);
  }
  ex_stats_add(&res->st, &dp.st);
  ex_stats_add(&res->st, &dd.st);
  snprintf(res->path, sizeof res->path, "%s", dp.path[0] ? dp.path : dd.path);
}

static void *session_main(void *arg) {
  session_t *s = arg;
  while (s->fd >= 0) {
    uint16_t type;
    size_t len;
    int rc = ex_recv(s->fd, &type, &s->in, &len, ecs_now_ms() + IDLE_TIMEOUT_MS);
    if (rc != ECS_OK)
      break;
    ex_done_t res;
    memset(&res, 0, sizeof res);
    if (type != EX_MSG_REQUEST || ex_job_decode(s->in.p, len, s->job) != ECS_OK) {
      fail(&res, ECS_EPROTO, "proxy: bad or unexpected message (type %u)", type);
    } else {
      handle(s, &res);
      if (res.status != 0)
        ECS_LOG_W("%s failed: %s", s->job->req_id, res.reason);
    }
    if (s->fd < 0 || ex_send_done(s->fd, &res, deadline()) != ECS_OK || res.status == ECS_EPROTO)
      break;
  }
  if (s->fd >= 0)
    close(s->fd);
  for (int r = 0; r < R_COUNT; r++)
    for (size_t i = 0; i < MAX_INST; i++)
      drop(s, r, i);
  ex_buf_free(&s->in);
  ex_buf_free(&s->out);
  free(s->job);
  free(s->sub);
  free(s->img);
  free(s);
  return NULL;
}

/* "ID=HOST:PORT,..." (or "HOST:PORT,...", ids then role-N) into a role set. */
static int parse_role(int r, const char *arg) {
  char buf[4096];
  char *items[MAX_INST];
  snprintf(buf, sizeof buf, "%s", arg);
  size_t n = ex_split_list(buf, items, MAX_INST);
  role_set_t *rs = &P.roles[r];
  for (size_t i = 0; i < n; i++) {
    char *eq = strchr(items[i], '=');
    if (eq != NULL) {
      *eq = '\0';
      snprintf(rs->id[i], sizeof rs->id[i], "%s", items[i]);
      snprintf(rs->addr[i], sizeof rs->addr[i], "%s", eq + 1);
    } else {
      snprintf(rs->id[i], sizeof rs->id[i], "%s-%zu", role_names[r], i);
      snprintf(rs->addr[i], sizeof rs->addr[i], "%s", items[i]);
    }
  }
  rs->n = n;
  return n > 0 ? 0 : -1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ecs-example-proxy --connector-config FILE --encoders LIST (--pds LIST | --prefills LIST "
             "--decodes LIST) [options]\n"
             "\n"
             "Routes requests through encoder, prefill/decode (or pd) workers (docs/examples.md).\n"
             "A LIST is ID=HOST:PORT[,ID=HOST:PORT...] (or HOST:PORT,...).\n"
             "\n"
             "  --connector-config FILE  EC connector JSON config (the scheduler's has())\n"
             "  --encoders LIST          encoder workers\n"
             "  --pds LIST               PD workers (1E1PD)\n"
             "  --prefills LIST          prefill workers (1E1P1D, with --decodes)\n"
             "  --decodes LIST           decode workers (1E1P1D)\n"
             "  --listen HOST:PORT       where to serve the load generator (default 127.0.0.1:0)\n"
             "  --port-file FILE         write the bound port here once listening\n"
             "  --timeout-ms MS          deadline of one hop's socket I/O (default 60000)\n"
             "  --kv-timeout-ms MS       decode's wait for a request's KV (default 10000)\n"
             "  --fault-evict-bytes SIZE fault test: after has() finds hits, save SIZE bytes of filler\n"
             "                           so FIFO eviction drops them before the consumer loads\n"
             "  --log-level L            error|warn|info|debug (default warn)\n"
             "  --help                   this text\n");
}

int main(int argc, char **argv) {
  const char *config = NULL, *port_file = NULL, *listen_at = "127.0.0.1:0";
  P.timeout_ms = 60000;
  P.kv_timeout_ms = 10000;
  pthread_mutex_init(&P.flood_mu, NULL);
  ecs_log_set_level(ECS_LOG_WARN);
  ecs_log_set_tag("proxy");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (v == NULL) {
      fprintf(stderr, "error: %s needs a value (or is unknown; see --help)\n", a);
      return 2;
    }
    i++;
    int r = strcmp(a, "--encoders") == 0   ? R_ENC
            : strcmp(a, "--prefills") == 0 ? R_PRE
            : strcmp(a, "--decodes") == 0  ? R_DEC
            : strcmp(a, "--pds") == 0      ? R_PD
                                           : -1;
    if (r >= 0) {
      if (parse_role(r, v) != 0) {
        fprintf(stderr, "error: %s: empty list\n", a);
        return 2;
      }
    } else if (strcmp(a, "--connector-config") == 0) {
      config = v;
    } else if (strcmp(a, "--listen") == 0) {
      listen_at = v;
    } else if (strcmp(a, "--port-file") == 0) {
      port_file = v;
    } else if (strcmp(a, "--timeout-ms") == 0) {
      P.timeout_ms = (int)ex_opt_int(a, v, 1, 3600000);
    } else if (strcmp(a, "--kv-timeout-ms") == 0) {
      P.kv_timeout_ms = (int)ex_opt_int(a, v, 1, 3600000);
    } else if (strcmp(a, "--fault-evict-bytes") == 0) {
      P.fault_evict_bytes = (uint64_t)ex_opt_int(a, v, 0, 1ll << 40);
    } else if (strcmp(a, "--log-level") == 0) {
      ecs_log_level_t l;
      if (ecs_log_parse_level(v, &l) != 0) {
        fprintf(stderr, "error: --log-level must be error, warn, info or debug\n");
        return 2;
      }
      ecs_log_set_level(l);
    } else {
      fprintf(stderr, "error: unknown option %s (see --help)\n", a);
      return 2;
    }
  }
  P.split = P.roles[R_PRE].n > 0 || P.roles[R_DEC].n > 0;
  if (config == NULL || P.roles[R_ENC].n == 0 ||
      (P.split ? (P.roles[R_PRE].n == 0 || P.roles[R_DEC].n == 0 || P.roles[R_PD].n > 0)
               : P.roles[R_PD].n == 0)) {
    fprintf(stderr, "error: need --connector-config, --encoders, and either --pds or both --prefills and "
                    "--decodes (see --help)\n");
    return 2;
  }
  ex_signals_install();
  ecs_ec_config_t cfg;
  char err[512];
  ecs_ec_config_init(&cfg);
  int rc = ecs_ec_config_load_file(&cfg, config, err, sizeof err);
  if (rc == ECS_OK)
    rc = ecs_ec_open(&cfg, &P.conn, err, sizeof err);
  if (rc != ECS_OK) {
    fprintf(stderr, "proxy: connector: %s (%s)\n", err, ecs_err_name(rc));
    return 1;
  }
  int lfd, port;
  if ((rc = ex_listen(listen_at, port_file, &lfd, &port)) != ECS_OK) {
    fprintf(stderr, "proxy: cannot listen on %s: %s\n", listen_at, ecs_strerror(rc));
    ecs_ec_close(P.conn);
    return 1;
  }
  ECS_LOG_I("listening on port %d (%s)", port, P.split ? "1E1P1D" : "1E1PD");
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  while (!ex_stop) {
    int fd = ex_accept(lfd, 200);
    if (fd < 0)
      continue;
    session_t *s = calloc(1, sizeof *s);
    if (s != NULL) {
      s->fd = fd;
      for (int r = 0; r < R_COUNT; r++)
        for (size_t i = 0; i < MAX_INST; i++)
          s->wfd[r][i] = -1;
      s->job = malloc(sizeof *s->job);
      s->sub = malloc(sizeof *s->sub);
    }
    pthread_t th;
    if (s == NULL || s->job == NULL || s->sub == NULL || pthread_create(&th, &attr, session_main, s) != 0) {
      ECS_LOG_E("cannot start a session thread");
      close(fd);
      if (s != NULL) {
        free(s->job);
        free(s->sub);
      }
      free(s);
    }
  }
  pthread_attr_destroy(&attr);
  close(lfd);
  /* sessions still running hold the connector: leave it to the exit */
  return 0;
}
