/*
 * ecs-example-worker: one engine instance of the examples, in one of four
 * roles, built on the EC connector (include/ecstore/ec_connector.h):
 *
 *   encoder  ENCODE jobs: regenerate each image from its seed, encode it
 *            (ex_encode), ecs_ec_save() it under its mm_hash, then
 *            ecs_ec_wait_for_save(); failed saves are counted and named
 *            in the reply, never fatal (the consumer recomputes).
 *   prefill  PREFILL jobs: ecs_ec_start_load() every image's embedding into
 *            its own buffer, ecs_ec_wait_for_load(); a miss (absent,
 *            evicted, corrupt, unreachable) is recomputed here and counted;
 *            then KV (ex_prefill) and ecs_kv_publish() for a decode worker.
 *   decode   DECODE jobs: ecs_kv_fetch() the request's KV with a timeout
 *            (a failure ends the request with its reason), decode and
 *            stream the tokens, ecs_kv_release().
 *   pd       PREFILL jobs with EX_JOB_DECODE: prefill, then decode here.
 *
 * One thread per connection (the proxy keeps its connections open); one
 * connector per process, shared by those threads.  Every socket read has
 * a deadline.  SIGTERM/SIGINT stop it: no new connections, the requests
 * in flight get a few seconds, then the connector closes.
 */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ecstore/ec_connector.h"
#include "examples/ex_model.h"
#include "examples/ex_util.h"
#include "examples/ex_wire.h"
#include "store/core/log.h"
#include "store/core/net.h"

enum { ROLE_ENCODER = 1, ROLE_PREFILL, ROLE_DECODE, ROLE_PD };

#define IDLE_TIMEOUT_MS (600 * 1000) /* an idle proxy connection is closed after this */
#define SAVE_FAIL_RING 512           /* failed saves remembered for the requests waiting */

/* The worker's settings and shared state. */
typedef struct worker {
  int role;                 /* ROLE_* */
  char instance[EX_ID_MAX]; /* instance id (KV registry) */
  char listen[160];         /* HOST:PORT */
  char advertise[160];      /* HOST:PORT with the bound port */
  const char *port_file;    /* where to write the port, or NULL */
  const char *config;       /* connector config file */
  int timeout_ms;           /* deadline of one request's I/O */
  int fault_stall_ms;       /* prefill: stall before publishing ... */
  int fault_every;          /* ... every Nth request (0: never) */
  ecs_ec_conn_t *conn;      /* the connector (one per process) */
  char path[64];            /* backend/path in use, e.g. "ecstore/shm" */
  ecs_kv_worker_t kvw;      /* our registration (prefill, decode) */
  int registered;           /* kvw is registered */
  pthread_mutex_t amu;      /* active */
  pthread_cond_t acv;       /* signalled when active drops to 0 */
  int active;               /* requests being handled */
  atomic_uint jobs;         /* requests seen (fault_every) */
  pthread_mutex_t fmu;      /* the failed-save ring */
  struct {
    char hash[ECS_MAX_KEY + 1]; /* key */
    int status;                 /* why */
    uint64_t seq;               /* when (failure sequence number) */
  } failed[SAVE_FAIL_RING];
  uint64_t fseq; /* failures recorded so far */
} worker_t;

static worker_t W;

/* One connection's handler. */
typedef struct conn_ctx {
  int fd;        /* the proxy's connection */
  ex_buf_t in;   /* frame buffer */
  ex_job_t *job; /* the decoded job */
} conn_ctx_t;

static uint64_t deadline(void) {
  return ecs_now_ms() + (uint64_t)W.timeout_ms;
}

static void set_reason(ex_done_t *d, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_reason(ex_done_t *d, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->reason, sizeof d->reason, fmt, ap);
  va_end(ap);
  d->status = status;
}

/* ---------------------------------------------------------------- */
/* Encoder                                                            */

/* Records failed saves that wait_for_save handed us, whoever queued them,
 * so every waiting request can find its own. */
static void record_failures(const ecs_ec_save_result_t *f, size_t n) {
  pthread_mutex_lock(&W.fmu);
  for (size_t i = 0; i < n; i++) {
    size_t slot = W.fseq % SAVE_FAIL_RING;
    size_t kl = strnlen(f[i].mm_hash, ECS_MAX_KEY);
    memcpy(W.failed[slot].hash, f[i].mm_hash, kl);
    W.failed[slot].hash[kl] = '\0';
    W.failed[slot].status = f[i].status;
    W.failed[slot].seq = W.fseq++;
  }
  pthread_mutex_unlock(&W.fmu);
}

/* The status of a failure of hash recorded at or after seq, or 0. */
static int find_failure(const char *hash, uint64_t since) {
  int st = 0;
  pthread_mutex_lock(&W.fmu);
  for (size_t i = 0; i < SAVE_FAIL_RING; i++)
    if (W.failed[i].seq >= since && W.failed[i].hash[0] != '\0' && strcmp(W.failed[i].hash, hash) == 0)
      st = W.failed[i].status;
  pthread_mutex_unlock(&W.fmu);
  return st;
}

static void handle_encode(const ex_job_t *j, ex_done_t *d) {
  size_t inb = ex_image_nbytes(j->width, j->height);
  uint64_t eb = ex_embed_nbytes(j->width, j->height);
  uint8_t *img = malloc(inb);
  uint16_t *emb = malloc(eb);
  if (img == NULL || emb == NULL) {
    set_reason(d, ECS_ENOMEM, "encoder %s: out of memory", W.instance);
    goto out;
  }
  pthread_mutex_lock(&W.fmu);
  uint64_t since = W.fseq;
  pthread_mutex_unlock(&W.fmu);
  int saved[EX_MAX_IMAGES] = {0};
  for (uint32_t i = 0; i < j->n_images; i++) {
    uint64_t t0 = ex_now_us();
    char h[33];
    ex_image_generate(j->seeds[i], j->width, j->height, img);
    ex_image_hash(img, j->width, j->height, h);
    if (strcmp(h, j->hashes[i]) != 0) {
      set_reason(d, ECS_EINVAL, "encoder %s: image %u of %s hashes to %s, proxy said %s", W.instance, i,
                 j->req_id, h, j->hashes[i]);
      goto out;
    }
    ex_encode(img, j->width, j->height, emb);
    uint64_t t1 = ex_now_us();
    d->st.encoded++;
    d->st.encode_us += t1 - t0;
    ecs_tensor_t t = {emb, eb, {ECS_DTYPE_BF16, 2, {ex_image_tokens(j->width, j->height), EX_HIDDEN}}};
    int rc = ecs_ec_save(W.conn, j->hashes[i], &t);
    d->st.save_us += ex_now_us() - t1;
    if (rc != ECS_OK) {
      d->st.saves_failed++;
      ECS_LOG_W("%s: save of %s refused: %s", j->req_id, j->hashes[i], ecs_strerror(rc));
      if (d->reason[0] == '\0')
        snprintf(d->reason, sizeof d->reason, "encoder %s: save of %.12s refused: %s", W.instance,
                 j->hashes[i], ecs_err_name(rc));
    } else {
      saved[i] = 1;
    }
  }
  /* the consumer must find the embeddings once we reply: wait for every
   * queued save (ours and other requests'), collecting all failures */
  uint64_t t2 = ex_now_us();
  int wrc;
  do {
    ecs_ec_save_result_t f[32];
    size_t nf = 0;
    wrc = ecs_ec_wait_for_save(W.conn, -1, f, 32, &nf);
    record_failures(f, nf);
    if (nf < 32)
      break;
  } while (wrc == ECS_EIO);
  d->st.save_us += ex_now_us() - t2;
  for (uint32_t i = 0; i < j->n_images; i++) {
    if (!saved[i])
      continue;
    int st = find_failure(j->hashes[i], since);
    if (st == 0 && wrc == ECS_ETIMEDOUT)
      st = ECS_ETIMEDOUT; /* not confirmed in time: the consumer will see */
    if (st != 0) {
      d->st.saves_failed++;
      ECS_LOG_W("%s: save of %s failed: %s", j->req_id, j->hashes[i], ecs_strerror(st));
      if (d->reason[0] == '\0')
        snprintf(d->reason, sizeof d->reason, "encoder %s: save of %.12s failed: %s", W.instance,
                 j->hashes[i], ecs_err_name(st));
    } else {
      d->st.save_bytes += eb;
    }
  }
out:
  free(emb);
  free(img);
}

/* ---------------------------------------------------------------- */
/* Prefill / PD / decode                                              */

/* Loads every image's embedding into emb (n_images x eb bytes); misses
 * are recomputed here.  0 or an ECS_E* code with d->reason set. */
static int load_embeddings(const ex_job_t *j, uint16_t *emb, ex_done_t *d) {
  uint64_t eb = ex_embed_nbytes(j->width, j->height);
  uint32_t it = ex_image_tokens(j->width, j->height);
  ecs_ec_load_item_t items[EX_MAX_IMAGES];
  ecs_ec_load_result_t res[EX_MAX_IMAGES];
  for (uint32_t i = 0; i < j->n_images; i++) {
    items[i].mm_hash = j->hashes[i];
    items[i].dst = (uint8_t *)emb + i * eb;
    items[i].capacity = eb;
    items[i].expected_nbytes = eb;
    res[i].status = ECS_EBUSY;
  }
  uint64_t t0 = ex_now_us();
  ecs_ec_load_t *ld = NULL;
  int rc = ecs_ec_start_load(W.conn, items, j->n_images, &ld);
  if (rc == ECS_OK) {
    rc = ecs_ec_wait_for_load(ld, -1, res);
    ecs_ec_load_release(ld); /* after this the connector never touches emb */
  } else {
    for (uint32_t i = 0; i < j->n_images; i++)
      res[i].status = rc;
  }
  d->st.load_us += ex_now_us() - t0;
  d->st.load_items += j->n_images;
  uint8_t *img = NULL;
  for (uint32_t i = 0; i < j->n_images; i++) {
    int st = res[i].status;
    if (st == ECS_OK &&
        (res[i].nbytes != eb || res[i].desc.dtype != ECS_DTYPE_BF16 || res[i].desc.ndim != 2 ||
         res[i].desc.shape[0] != it || res[i].desc.shape[1] != EX_HIDDEN))
      st = ECS_EDTYPE; /* stored under our key with another shape: not ours */
    if (st == ECS_OK) {
      d->st.load_hits++;
      d->st.load_bytes += eb;
      continue;
    }
    /* a miss: recompute the embedding from the image, as an engine would */
    uint64_t t1 = ex_now_us();
    if (img == NULL && (img = malloc(ex_image_nbytes(j->width, j->height))) == NULL) {
      set_reason(d, ECS_ENOMEM, "%s: out of memory", W.instance);
      return ECS_ENOMEM;
    }
    char h[33];
    ex_image_generate(j->seeds[i], j->width, j->height, img);
    ex_image_hash(img, j->width, j->height, h);
    if (strcmp(h, j->hashes[i]) != 0) {
      free(img);
      set_reason(d, ECS_EINVAL, "%s: image %u of %s hashes to %s, proxy said %s", W.instance, i, j->req_id, h,
                 j->hashes[i]);
      return ECS_EINVAL;
    }
    ex_encode(img, j->width, j->height, (uint16_t *)items[i].dst);
    d->st.recomputes++;
    d->st.recompute_us += ex_now_us() - t1;
    ECS_LOG_I("%s: embedding %.12s missed (%s): recomputed", j->req_id, j->hashes[i], ecs_err_name(st));
  }
  free(img);
  return ECS_OK;
}

/* Streams n_output tokens decoded from kv; 0 or an ECS_E* code. */
static int decode_stream(int fd, const ex_job_t *j, uint16_t *const kv[EX_KV_BLOCKS], uint32_t T,
                         ex_done_t *d) {
  ex_decoder_t dec;
  if (ex_decoder_init(&dec, kv, T) != 0) {
    set_reason(d, ECS_ENOMEM, "%s: decoder: out of memory", W.instance);
    return ECS_ENOMEM;
  }
  int rc = ECS_OK;
  for (uint32_t k = 0; k < j->n_output && rc == ECS_OK; k++) {
    uint64_t t0 = ex_now_us();
    uint32_t tok = ex_decoder_step(&dec);
    d->st.decode_us += ex_now_us() - t0;
    uint8_t p[8] = {(uint8_t)k,   (uint8_t)(k >> 8),   (uint8_t)(k >> 16),   (uint8_t)(k >> 24),
                    (uint8_t)tok, (uint8_t)(tok >> 8), (uint8_t)(tok >> 16), (uint8_t)(tok >> 24)};
    rc = ex_send(fd, EX_MSG_TOKEN, p, sizeof p, deadline());
  }
  ex_decoder_free(&dec);
  if (rc != ECS_OK)
    set_reason(d, rc, "%s: streaming tokens to the proxy: %s", W.instance, ecs_strerror(rc));
  return rc;
}

static void handle_prefill(int fd, const ex_job_t *j, ex_done_t *d) {
  uint64_t eb = ex_embed_nbytes(j->width, j->height);
  uint32_t it = ex_image_tokens(j->width, j->height);
  uint32_t T = ex_seq_tokens(j->n_images, j->width, j->height, j->n_prompt);
  uint64_t kb = ex_kv_block_nbytes(T);
  uint16_t *emb = malloc(eb * (j->n_images ? j->n_images : 1));
  uint16_t *kvmem = malloc(kb * EX_KV_BLOCKS);
  uint16_t *kv[EX_KV_BLOCKS];
  const uint16_t *embeds[EX_MAX_IMAGES];
  if (emb == NULL || kvmem == NULL || T == 0) {
    set_reason(d, ECS_ENOMEM, "%s: out of memory (or an empty request)", W.instance);
    goto out;
  }
  if (j->n_images > 0 && load_embeddings(j, emb, d) != ECS_OK)
    goto out;
  for (uint32_t i = 0; i < j->n_images; i++)
    embeds[i] = emb + (size_t)i * it * EX_HIDDEN;
  for (int b = 0; b < EX_KV_BLOCKS; b++)
    kv[b] = kvmem + (size_t)b * T * EX_KV_DIM;
  uint64_t t0 = ex_now_us();
  if (ex_prefill(embeds, j->n_images, it, j->prompt, j->n_prompt, kv) != 0) {
    set_reason(d, ECS_ENOMEM, "%s: prefill: out of memory", W.instance);
    goto out;
  }
  d->st.prefill_us += ex_now_us() - t0;
  if (j->flags & EX_JOB_PUBLISH_KV) {
    unsigned n = atomic_fetch_add(&W.jobs, 1) + 1;
    if (W.fault_every > 0 && n % (unsigned)W.fault_every == 0) {
      ECS_LOG_W("%s: fault injection: stalling %d ms before publishing KV", j->req_id, W.fault_stall_ms);
      struct timespec ts = {W.fault_stall_ms / 1000, (long)(W.fault_stall_ms % 1000) * 1000000L};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
    }
    ecs_tensor_t blocks[EX_KV_BLOCKS];
    for (int b = 0; b < EX_KV_BLOCKS; b++) {
      blocks[b].data = kv[b];
      blocks[b].nbytes = kb;
      blocks[b].desc = (ecs_tensor_desc_t){ECS_DTYPE_BF16, 2, {T, EX_KV_DIM}};
    }
    char why[ECS_KV_REASON_MAX] = "";
    uint64_t t1 = ex_now_us();
    int rc = ecs_kv_publish(W.conn, j->req_id, blocks, EX_KV_BLOCKS, why, sizeof why);
    d->st.kv_publish_us += ex_now_us() - t1;
    if (rc != ECS_OK) {
      set_reason(d, rc, "prefill %s: KV publish of %s failed: %s", W.instance, j->req_id, why);
      goto out;
    }
    d->st.kv_bytes += kb * EX_KV_BLOCKS;
  }
  if (j->flags & EX_JOB_DECODE)
    decode_stream(fd, j, kv, T, d);
out:
  free(kvmem);
  free(emb);
}

static void handle_decode(int fd, const ex_job_t *j, ex_done_t *d) {
  uint32_t T = ex_seq_tokens(j->n_images, j->width, j->height, j->n_prompt);
  uint64_t kb = ex_kv_block_nbytes(T);
  uint16_t *kvmem = malloc(kb * EX_KV_BLOCKS);
  uint16_t *kv[EX_KV_BLOCKS];
  char why[ECS_KV_REASON_MAX] = "";
  if (kvmem == NULL || T == 0) {
    set_reason(d, ECS_ENOMEM, "decode %s: out of memory (or an empty request)", W.instance);
    goto out;
  }
  /* the bootstrap step: the prefill instance the proxy chose must be
   * registered, with our tensor-parallel size */
  ecs_kv_worker_t peer;
  int rc = ecs_kv_lookup(W.conn, &W.kvw, j->prefill_instance, 0, 0, &peer, why, sizeof why);
  if (rc != ECS_OK) {
    set_reason(d, rc, "decode %s: prefill instance %s: %s", W.instance, j->prefill_instance, why);
    goto out;
  }
  ecs_get_buf_t bufs[EX_KV_BLOCKS];
  memset(bufs, 0, sizeof bufs);
  for (int b = 0; b < EX_KV_BLOCKS; b++) {
    kv[b] = kvmem + (size_t)b * T * EX_KV_DIM;
    bufs[b].data = kv[b];
    bufs[b].capacity = kb;
  }
  size_t nb = 0;
  uint64_t t0 = ex_now_us();
  rc = ecs_kv_fetch(W.conn, j->req_id, (int)j->kv_timeout_ms, bufs, EX_KV_BLOCKS, &nb, why, sizeof why);
  d->st.kv_fetch_us += ex_now_us() - t0;
  if (rc != ECS_OK) {
    set_reason(d, rc, "decode %s: KV fetch of %s failed after %.0f ms: %s", W.instance, j->req_id,
               (double)(ex_now_us() - t0) / 1000.0, why);
    goto out;
  }
  if (nb != EX_KV_BLOCKS) {
    set_reason(d, ECS_EPROTO, "decode %s: %s has %zu KV blocks, expected %d", W.instance, j->req_id, nb,
               EX_KV_BLOCKS);
    goto out_release;
  }
  for (int b = 0; b < EX_KV_BLOCKS; b++)
    if (bufs[b].status != ECS_OK || bufs[b].nbytes != kb) {
      set_reason(d, ECS_EDTYPE, "decode %s: KV block %d of %s: %s, %llu bytes (expected %llu)", W.instance, b,
                 j->req_id, ecs_err_name(bufs[b].status), (unsigned long long)bufs[b].nbytes,
                 (unsigned long long)kb);
      goto out_release;
    }
  d->st.kv_bytes += kb * EX_KV_BLOCKS;
  decode_stream(fd, j, kv, T, d);
out_release:
  ecs_kv_release(W.conn, j->req_id, nb);
out:
  free(kvmem);
}

/* ---------------------------------------------------------------- */
/* Connections                                                        */

static void *conn_main(void *arg) {
  conn_ctx_t *cx = arg;
  for (;;) {
    uint16_t type;
    size_t len;
    int rc = ex_recv(cx->fd, &type, &cx->in, &len, ecs_now_ms() + IDLE_TIMEOUT_MS);
    if (rc != ECS_OK) {
      if (rc != ECS_ECONN)
        ECS_LOG_W("connection dropped: %s", ecs_strerror(rc));
      break;
    }
    pthread_mutex_lock(&W.amu);
    W.active++;
    pthread_mutex_unlock(&W.amu);
    ex_done_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.path, sizeof d.path, "%s", W.path);
    int want = W.role == ROLE_ENCODER  ? EX_MSG_ENCODE
               : W.role == ROLE_DECODE ? EX_MSG_DECODE
                                       : EX_MSG_PREFILL;
    if (type != want || ex_job_decode(cx->in.p, len, cx->job) != ECS_OK) {
      set_reason(&d, ECS_EPROTO, "worker %s: bad or unexpected message (type %u)", W.instance, type);
    } else if (W.role == ROLE_ENCODER) {
      handle_encode(cx->job, &d);
    } else if (W.role == ROLE_DECODE) {
      handle_decode(cx->fd, cx->job, &d);
    } else {
      if (W.role == ROLE_PD)
        cx->job->flags = (cx->job->flags & ~EX_JOB_PUBLISH_KV) | EX_JOB_DECODE;
      else
        cx->job->flags = (cx->job->flags & ~EX_JOB_DECODE) | EX_JOB_PUBLISH_KV;
      handle_prefill(cx->fd, cx->job, &d);
    }
    if (d.status != 0)
      ECS_LOG_W("%s: %s", cx->job->req_id, d.reason);
    rc = ex_send_done(cx->fd, &d, deadline());
    pthread_mutex_lock(&W.amu);
    if (--W.active == 0)
      pthread_cond_broadcast(&W.acv);
    pthread_mutex_unlock(&W.amu);
    if (rc != ECS_OK || d.status == ECS_EPROTO)
      break;
  }
  close(cx->fd);
  ex_buf_free(&cx->in);
  free(cx->job);
  free(cx);
  return NULL;
}

/* The data path in use, as the connector reports it (the transport the
 * client took, e.g. "ecstore/shm"), marked "(auto)" when auto chose it. */
static void resolve_path(const ecs_ec_config_t *cfg) {
  int autop = cfg->backend == ECS_EC_BACKEND_ECSTORE && strcmp(cfg->protocol, "auto") == 0;
  snprintf(W.path, sizeof W.path, "%s%s", ecs_ec_describe(W.conn), autop ? " (auto)" : "");
}

static void usage(FILE *f) {
  fprintf(f, "usage: ecs-example-worker --role encoder|prefill|decode|pd --connector-config FILE [options]\n"
             "\n"
             "A stand-in engine instance of the ecstore examples (docs/examples.md).\n"
             "\n"
             "  --role R                 encoder, prefill, decode or pd\n"
             "  --connector-config FILE  EC connector JSON config (backend, servers, redis_url, ...)\n"
             "  --listen HOST:PORT       where to serve the proxy (default 127.0.0.1:0)\n"
             "  --port-file FILE         write the bound port here once listening\n"
             "  --instance-id ID         name in the KV registry (default ROLE-PID)\n"
             "  --timeout-ms MS          deadline of one request's socket I/O (default 60000)\n"
             "  --fault-stall-ms MS      prefill: sleep MS before publishing the KV of ...\n"
             "  --fault-every N          ... every Nth request (fault tests; default never)\n"
             "  --log-level L            error|warn|info|debug (default warn)\n"
             "  --help                   this text\n");
}

int main(int argc, char **argv) {
  W.timeout_ms = 60000;
  snprintf(W.listen, sizeof W.listen, "127.0.0.1:0");
  pthread_mutex_init(&W.fmu, NULL);
  pthread_mutex_init(&W.amu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&W.acv, &ca);
  pthread_condattr_destroy(&ca);
  ecs_log_set_level(ECS_LOG_WARN);
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
    if (strcmp(a, "--role") == 0) {
      W.role = strcmp(v, "encoder") == 0   ? ROLE_ENCODER
               : strcmp(v, "prefill") == 0 ? ROLE_PREFILL
               : strcmp(v, "decode") == 0  ? ROLE_DECODE
               : strcmp(v, "pd") == 0      ? ROLE_PD
                                           : -1;
      if (W.role < 0) {
        fprintf(stderr, "error: --role must be encoder, prefill, decode or pd, got '%s'\n", v);
        return 2;
      }
    } else if (strcmp(a, "--connector-config") == 0) {
      W.config = v;
    } else if (strcmp(a, "--listen") == 0) {
      snprintf(W.listen, sizeof W.listen, "%s", v);
    } else if (strcmp(a, "--port-file") == 0) {
      W.port_file = v;
    } else if (strcmp(a, "--instance-id") == 0) {
      snprintf(W.instance, sizeof W.instance, "%s", v);
    } else if (strcmp(a, "--timeout-ms") == 0) {
      W.timeout_ms = (int)ex_opt_int(a, v, 1, 3600000);
    } else if (strcmp(a, "--fault-stall-ms") == 0) {
      W.fault_stall_ms = (int)ex_opt_int(a, v, 0, 600000);
    } else if (strcmp(a, "--fault-every") == 0) {
      W.fault_every = (int)ex_opt_int(a, v, 0, 1000000);
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
  if (W.role == 0 || W.config == NULL) {
    fprintf(stderr, "error: --role and --connector-config are required (see --help)\n");
    return 2;
  }
  static const char *names[] = {"", "encoder", "prefill", "decode", "pd"};
  if (W.instance[0] == '\0')
    snprintf(W.instance, sizeof W.instance, "%s-%d", names[W.role], (int)getpid());
  ecs_log_set_tag(W.instance);
  ex_signals_install();

  ecs_ec_config_t cfg;
  char err[512];
  ecs_ec_config_init(&cfg);
  int rc = ecs_ec_config_load_file(&cfg, W.config, err, sizeof err);
  if (rc == ECS_OK)
    rc = ecs_ec_open(&cfg, &W.conn, err, sizeof err);
  if (rc != ECS_OK) {
    fprintf(stderr, "%s: connector: %s (%s)\n", W.instance, err, ecs_err_name(rc));
    return 1;
  }
  resolve_path(&cfg);
  int lfd, port;
  if ((rc = ex_listen(W.listen, NULL, &lfd, &port)) != ECS_OK) {
    fprintf(stderr, "%s: cannot listen on %s: %s\n", W.instance, W.listen, ecs_strerror(rc));
    ecs_ec_close(W.conn);
    return 1;
  }
  char host[128];
  int ignored;
  ecs_net_parse_hostport(W.listen, host, sizeof host, &ignored);
  snprintf(W.advertise, sizeof W.advertise, "%s:%d", host, port);
  if (W.role == ROLE_PREFILL || W.role == ROLE_DECODE) {
    snprintf(W.kvw.instance_id, sizeof W.kvw.instance_id, "%s", W.instance);
    W.kvw.role = W.role == ROLE_PREFILL ? ECS_KV_PREFILL : ECS_KV_DECODE;
    W.kvw.tp_size = 1;
    snprintf(W.kvw.address, sizeof W.kvw.address, "%s", W.advertise);
    char why[ECS_KV_REASON_MAX] = "";
    if ((rc = ecs_kv_register(W.conn, &W.kvw, why, sizeof why)) != ECS_OK) {
      fprintf(stderr, "%s: KV registration failed: %s (%s)\n", W.instance, why, ecs_err_name(rc));
      close(lfd);
      ecs_ec_close(W.conn);
      return 1;
    }
    W.registered = 1;
  }
  /* the port file last: once it exists the worker is ready */
  if (W.port_file != NULL) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", W.port_file);
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, W.port_file) != 0) {
      fprintf(stderr, "%s: cannot write %s\n", W.instance, W.port_file);
      return 1;
    }
  }
  ECS_LOG_I("%s listening on %s (%s)", names[W.role], W.advertise, W.path);

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  while (!ex_stop) {
    int fd = ex_accept(lfd, 200);
    if (fd < 0)
      continue;
    conn_ctx_t *cx = calloc(1, sizeof *cx);
    if (cx != NULL)
      cx->job = malloc(sizeof *cx->job);
    pthread_t th;
    if (cx != NULL)
      cx->fd = fd;
    if (cx == NULL || cx->job == NULL || pthread_create(&th, &attr, conn_main, cx) != 0) {
      ECS_LOG_E("cannot start a connection thread");
      close(fd);
      if (cx != NULL)
        free(cx->job);
      free(cx);
      continue;
    }
  }
  pthread_attr_destroy(&attr);
  close(lfd);
  /* let the requests in flight finish (bounded), then close */
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += 5;
  pthread_mutex_lock(&W.amu);
  while (W.active > 0 && pthread_cond_timedwait(&W.acv, &W.amu, &until) == 0) {
  }
  int busy = W.active;
  pthread_mutex_unlock(&W.amu);
  if (W.registered) {
    char why[ECS_KV_REASON_MAX];
    ecs_kv_unregister(W.conn, &W.kvw, why, sizeof why);
  }
  if (busy == 0)
    ecs_ec_close(W.conn); /* else exit with requests still running: the OS frees it all */
  return 0;
}
