/*
 * ecs-example-loadgen: sends the workload (ex_model.h, ex_workload_t) to
 * the proxy with a fixed number of requests in flight, times each one
 * (TTFT: send -> first token; TPOT: the mean gap between the later
 * tokens), and prints a serving-benchmark report with the EC figures the
 * workers measured.  It writes every request's tokens (or its failure) to
 * --tokens-out for ecs-example-reference --check, and the figures as
 * key=value lines to --summary-out for bench/bench_examples.sh.
 *
 * Exit status: 0 when every request succeeded, 3 when some failed (the
 * report lists why), 1 on a setup error.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ecstore/error.h"
#include "examples/ex_model.h"
#include "examples/ex_util.h"
#include "examples/ex_wire.h"
#include "store/core/net.h"

/* One request's outcome. */
typedef struct result {
  int done;                                /* finished (ok or failed) */
  int status;                              /* 0 or the error */
  char reason[EX_REASON_MAX];              /* why it failed (or a note) */
  uint64_t t_send, t_first, t_last, t_end; /* microseconds */
  uint32_t ntok;                           /* tokens received */
  uint32_t *tokens;                        /* output_tokens ids */
  ex_stats_t st;                           /* the workers' counters */
  char path[64];                           /* connector backend/path */
} result_t;

static ex_workload_t WL;
static const char *proxy_addr;
static int timeout_ms = 120000;
static result_t *R;
static atomic_uint next_req;

static void *client_main(void *arg) {
  (void)arg;
  int fd = -1;
  ex_buf_t in = {0}, out = {0};
  ex_job_t *j = malloc(sizeof *j);
  if (j == NULL)
    return NULL;
  for (;;) {
    uint32_t i = atomic_fetch_add(&next_req, 1);
    if (i >= WL.requests)
      break;
    result_t *r = &R[i];
    memset(j, 0, sizeof *j);
    ex_wl_request_id(i, j->req_id, sizeof j->req_id);
    j->width = WL.width;
    j->height = WL.height;
    j->n_images = WL.images;
    for (uint32_t k = 0; k < WL.images; k++)
      j->seeds[k] = ex_wl_image_seed(&WL, i, k);
    j->n_prompt = WL.prompt_tokens;
    ex_wl_prompt(&WL, i, j->prompt);
    j->n_output = WL.output_tokens;
    out.len = 0;
    ex_job_encode(&out, j);
    r->t_send = ex_now_us();
    uint64_t dl = ecs_now_ms() + (uint64_t)timeout_ms;
    int rc = fd < 0 ? ex_connect(proxy_addr, timeout_ms, &fd) : ECS_OK;
    if (rc == ECS_OK)
      rc = ex_send_buf(fd, EX_MSG_REQUEST, &out, dl);
    while (rc == ECS_OK) {
      uint16_t type;
      size_t len;
      rc = ex_recv(fd, &type, &in, &len, dl);
      if (rc != ECS_OK)
        break;
      if (type == EX_MSG_TOKEN) {
        uint32_t idx, tok;
        if (ex_token_decode(in.p, len, &idx, &tok) != ECS_OK || idx != r->ntok || idx >= WL.output_tokens) {
          rc = ECS_EPROTO;
          break;
        }
        uint64_t now = ex_now_us();
        if (r->ntok == 0)
          r->t_first = now;
        r->t_last = now;
        r->tokens[r->ntok++] = tok;
      } else if (type == EX_MSG_DONE) {
        ex_done_t d;
        if (ex_done_decode(in.p, len, &d) != ECS_OK) {
          rc = ECS_EPROTO;
          break;
        }
        r->status = d.status;
        snprintf(r->reason, sizeof r->reason, "%s", d.reason);
        r->st = d.st;
        snprintf(r->path, sizeof r->path, "%s", d.path);
        if (r->status == 0 && r->ntok != WL.output_tokens) {
          r->status = ECS_EPROTO;
          snprintf(r->reason, sizeof r->reason, "got %u tokens, expected %u", r->ntok, WL.output_tokens);
        }
        break;
      } else {
        rc = ECS_EPROTO;
      }
    }
    if (rc != ECS_OK) {
      r->status = rc;
      snprintf(r->reason, sizeof r->reason, "load generator: proxy %s: %s", proxy_addr, ecs_strerror(rc));
      if (fd >= 0)
        close(fd);
      fd = -1;
    }
    r->t_end = ex_now_us();
    r->done = 1;
  }
  if (fd >= 0)
    close(fd);
  ex_buf_free(&in);
  ex_buf_free(&out);
  free(j);
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ecs-example-loadgen --proxy HOST:PORT [options]\n"
          "\n"
          "  --proxy HOST:PORT          the proxy\n"
          "  --requests N               requests (default 100)\n"
          "  --images-per-request N     images in each (default 1)\n"
          "  --image-size WxH           (default 700x728)\n"
          "  --prompt-tokens N          (default 150)\n"
          "  --output-tokens N          (default 100)\n"
          "  --unique-images N          distinct images in the run; fewer repeat (default 0: all distinct)\n"
          "  --seed N                   workload seed (default 1)\n"
          "  --concurrency N            requests in flight (default 4)\n"
          "  --timeout-ms MS            deadline of one request (default 120000)\n"
          "  --label TEXT               the setup, printed in the report (e.g. 1E1PD)\n"
          "  --tokens-out FILE          every request's tokens, for ecs-example-reference --check\n"
          "  --summary-out FILE         the figures as key=value lines\n"
          "  --help                     this text\n");
}

/* Figures over the results. */
typedef struct report {
  uint32_t ok, failed;
  double dur_s, ttft[3], tpot[3], load[2], save[2], kvf[2];
  uint64_t in_tok, out_tok;
  ex_stats_t st;
  double hit_rate, load_hit_rate;
  char path[64];
} report_t;

static void compute(report_t *rp, uint64_t t0, uint64_t t1) {
  memset(rp, 0, sizeof *rp);
  double *ttft = calloc(WL.requests + 1, sizeof(double)), *tpot = calloc(WL.requests + 1, sizeof(double));
  double *load = calloc(WL.requests + 1, sizeof(double)), *kvf = calloc(WL.requests + 1, sizeof(double));
  double *save = calloc(WL.requests + 1, sizeof(double));
  size_t nt = 0, np = 0, nl = 0, nk = 0, ns = 0;
  for (uint32_t i = 0; i < WL.requests; i++) {
    result_t *r = &R[i];
    ex_stats_add(&rp->st, &r->st);
    if (r->path[0] != '\0' && rp->path[0] == '\0')
      snprintf(rp->path, sizeof rp->path, "%s", r->path);
    if (r->st.load_items > 0 && load != NULL)
      load[nl++] = (double)r->st.load_us / 1000.0;
    if (r->st.encoded > 0 && save != NULL)
      save[ns++] = (double)r->st.save_us / 1000.0;
    if (r->st.kv_fetch_us > 0 && r->status == 0 && kvf != NULL)
      kvf[nk++] = (double)r->st.kv_fetch_us / 1000.0;
    if (r->status != 0 || !r->done) {
      rp->failed++;
      continue;
    }
    rp->ok++;
    rp->in_tok += (uint64_t)WL.prompt_tokens + (uint64_t)WL.images * ex_image_tokens(WL.width, WL.height);
    rp->out_tok += r->ntok;
    if (ttft != NULL)
      ttft[nt++] = (double)(r->t_first - r->t_send) / 1000.0;
    if (r->ntok > 1 && tpot != NULL)
      tpot[np++] = (double)(r->t_last - r->t_first) / 1000.0 / (double)(r->ntok - 1);
  }
  rp->dur_s = (double)(t1 - t0) / 1e6;
  if (ttft && tpot && load && kvf && save) {
    rp->save[0] = ex_pct(save, ns, 50);
    rp->save[1] = ex_pct(save, ns, 99);
    rp->ttft[0] = ex_mean(ttft, nt);
    rp->ttft[1] = ex_pct(ttft, nt, 50);
    rp->ttft[2] = ex_pct(ttft, nt, 99);
    rp->tpot[0] = ex_mean(tpot, np);
    rp->tpot[1] = ex_pct(tpot, np, 50);
    rp->tpot[2] = ex_pct(tpot, np, 99);
    rp->load[0] = ex_pct(load, nl, 50);
    rp->load[1] = ex_pct(load, nl, 99);
    rp->kvf[0] = ex_pct(kvf, nk, 50);
    rp->kvf[1] = ex_pct(kvf, nk, 99);
  }
  rp->hit_rate = rp->st.images ? (double)rp->st.has_hits / (double)rp->st.images : 0.0;
  rp->load_hit_rate = rp->st.load_items ? (double)rp->st.load_hits / (double)rp->st.load_items : 0.0;
  free(ttft);
  free(tpot);
  free(load);
  free(kvf);
  free(save);
}

static void print_report(const report_t *rp, const char *label, uint32_t conc) {
  const double MB = 1e6;
  int split = rp->st.kv_bytes > 0 || rp->st.kv_fetch_us > 0;
  printf("============ Serving Benchmark Result (%s) ============\n", label);
  printf("%-44s %u\n", "Successful requests:", rp->ok);
  printf("%-44s %u\n", "Failed requests:", rp->failed);
  printf("%-44s %u\n", "Maximum request concurrency:", conc);
  printf("%-44s %.2f\n", "Benchmark duration (s):", rp->dur_s);
  printf("%-44s %llu\n", "Total input tokens:", (unsigned long long)rp->in_tok);
  printf("%-44s %llu\n", "Total generated tokens:", (unsigned long long)rp->out_tok);
  printf("%-44s %.2f\n", "Request throughput (req/s):", rp->dur_s > 0 ? rp->ok / rp->dur_s : 0.0);
  printf("%-44s %.2f\n", "Output token throughput (tok/s):", rp->dur_s > 0 ? rp->out_tok / rp->dur_s : 0.0);
  printf("---------------Time to First Token----------------\n");
  printf("%-44s %.2f\n%-44s %.2f\n%-44s %.2f\n", "Mean TTFT (ms):", rp->ttft[0],
         "Median TTFT (ms):", rp->ttft[1], "P99 TTFT (ms):", rp->ttft[2]);
  printf("-----Time per Output Token (excl. 1st token)------\n");
  printf("%-44s %.3f\n%-44s %.3f\n%-44s %.3f\n", "Mean TPOT (ms):", rp->tpot[0],
         "Median TPOT (ms):", rp->tpot[1], "P99 TPOT (ms):", rp->tpot[2]);
  printf("---------------Encoder cache (EC)-----------------\n");
  printf("%-44s %s\n", "Connector backend/path:", rp->path[0] ? rp->path : "?");
  printf("%-44s %llu / %llu (%.1f%%)\n", "Images / cache hits at has():", (unsigned long long)rp->st.images,
         (unsigned long long)rp->st.has_hits, 100.0 * rp->hit_rate);
  printf("%-44s %llu\n", "Images encoded:", (unsigned long long)rp->st.encoded);
  printf("%-44s %.1f / %.1f\n", "Embedding MB saved / loaded:", (double)rp->st.save_bytes / MB,
         (double)rp->st.load_bytes / MB);
  printf("%-44s %llu / %llu (%.1f%%)\n", "Loads / hits at load:", (unsigned long long)rp->st.load_items,
         (unsigned long long)rp->st.load_hits, 100.0 * rp->load_hit_rate);
  printf("%-44s %.2f / %.2f\n", "EC save + wait_for_save p50 / p99 (ms):", rp->save[0], rp->save[1]);
  printf("%-44s %.2f / %.2f\n", "EC load latency p50 / p99 (ms):", rp->load[0], rp->load[1]);
  printf("%-44s %llu\n", "Recomputed embeddings (misses at load):", (unsigned long long)rp->st.recomputes);
  printf("%-44s %llu\n", "Failed saves (reported by encoders):", (unsigned long long)rp->st.saves_failed);
  if (rp->st.has_errors || rp->st.encoder_errors)
    printf("%-44s %llu / %llu\n", "has() errors / encoder errors:", (unsigned long long)rp->st.has_errors,
           (unsigned long long)rp->st.encoder_errors);
  if (split) {
    printf("---------------KV handoff (P -> D)----------------\n");
    printf("%-44s %.1f\n", "KV MB published + fetched:", (double)rp->st.kv_bytes / MB);
    printf("%-44s %.2f / %.2f\n", "KV fetch latency p50 / p99 (ms):", rp->kvf[0], rp->kvf[1]);
  }
  if (rp->failed > 0) {
    printf("---------------Failed requests--------------------\n");
    uint32_t shown = 0;
    for (uint32_t i = 0; i < WL.requests && shown < 10; i++)
      if (R[i].status != 0 || !R[i].done) {
        char id[32];
        ex_wl_request_id(i, id, sizeof id);
        printf("%s: %s (%s)\n", id, R[i].reason[0] ? R[i].reason : "no reason", ecs_err_name(R[i].status));
        shown++;
      }
    if (shown < rp->failed)
      printf("... and %u more\n", rp->failed - shown);
  }
  for (uint32_t i = 0; i < WL.requests; i++)
    if (R[i].status == 0 && R[i].reason[0] != '\0') {
      printf("%-44s %s\n", "Note (first):", R[i].reason);
      break;
    }
  printf("==================================================\n");
  printf("Model compute is a stand-in (patchify + fixed sparse projection, toy prefill/decode);\n"
         "TTFT/TPOT reflect it.  The store's figures (bytes moved, EC load latency, hits,\n"
         "recomputes, KV handoff) are real measurements of ecstore and the EC connector.\n");
}

static void write_outputs(const report_t *rp, const char *tokens_out, const char *summary_out,
                          const char *label, uint32_t conc) {
  if (tokens_out != NULL) {
    FILE *f = fopen(tokens_out, "w");
    if (f == NULL) {
      perror(tokens_out);
    } else {
      for (uint32_t i = 0; i < WL.requests; i++) {
        char id[32];
        ex_wl_request_id(i, id, sizeof id);
        if (R[i].status != 0 || !R[i].done) {
          fprintf(f, "failed %s %s\n", id, ecs_err_name(R[i].status));
          continue;
        }
        fputs(id, f);
        for (uint32_t k = 0; k < R[i].ntok; k++)
          fprintf(f, " %u", R[i].tokens[k]);
        fputc('\n', f);
      }
      fclose(f);
    }
  }
  if (summary_out != NULL) {
    FILE *f = fopen(summary_out, "w");
    if (f == NULL) {
      perror(summary_out);
      return;
    }
    fprintf(f, "label=%s\npath=%s\nrequests=%u\nconcurrency=%u\nok=%u\nfailed=%u\nduration_s=%.3f\n", label,
            rp->path, WL.requests, conc, rp->ok, rp->failed, rp->dur_s);
    fprintf(f, "req_per_s=%.3f\nttft_mean_ms=%.3f\nttft_median_ms=%.3f\nttft_p99_ms=%.3f\n",
            rp->dur_s > 0 ? rp->ok / rp->dur_s : 0.0, rp->ttft[0], rp->ttft[1], rp->ttft[2]);
    fprintf(f, "tpot_mean_ms=%.4f\ntpot_median_ms=%.4f\ntpot_p99_ms=%.4f\n", rp->tpot[0], rp->tpot[1],
            rp->tpot[2]);
    fprintf(f, "ec_load_p50_ms=%.3f\nec_load_p99_ms=%.3f\nhit_rate=%.4f\nload_hit_rate=%.4f\n", rp->load[0],
            rp->load[1], rp->hit_rate, rp->load_hit_rate);
    fprintf(f, "ec_save_p50_ms=%.3f\nec_save_p99_ms=%.3f\n", rp->save[0], rp->save[1]);
    fprintf(f, "save_mb=%.3f\nload_mb=%.3f\nrecomputes=%llu\nsaves_failed=%llu\n",
            (double)rp->st.save_bytes / 1e6, (double)rp->st.load_bytes / 1e6,
            (unsigned long long)rp->st.recomputes, (unsigned long long)rp->st.saves_failed);
    fprintf(f, "kv_mb=%.3f\nkv_fetch_p50_ms=%.3f\nkv_fetch_p99_ms=%.3f\n", (double)rp->st.kv_bytes / 1e6,
            rp->kvf[0], rp->kvf[1]);
    fclose(f);
  }
}

int main(int argc, char **argv) {
  const char *tokens_out = NULL, *summary_out = NULL, *label = "disaggregated";
  uint32_t conc = 4;
  WL = (ex_workload_t){100, 1, 700, 728, 150, 100, 0, 1};
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
    if (strcmp(a, "--proxy") == 0)
      proxy_addr = v;
    else if (strcmp(a, "--requests") == 0)
      WL.requests = (uint32_t)ex_opt_int(a, v, 1, 1000000);
    else if (strcmp(a, "--images-per-request") == 0)
      WL.images = (uint32_t)ex_opt_int(a, v, 0, EX_MAX_IMAGES);
    else if (strcmp(a, "--image-size") == 0) {
      if (ex_parse_wh(v, &WL.width, &WL.height) != 0) {
        fprintf(stderr, "error: --image-size wants WxH (1..%d each), got '%s'\n", EX_MAX_SIDE, v);
        return 2;
      }
    } else if (strcmp(a, "--prompt-tokens") == 0)
      WL.prompt_tokens = (uint32_t)ex_opt_int(a, v, 0, EX_MAX_PROMPT);
    else if (strcmp(a, "--output-tokens") == 0)
      WL.output_tokens = (uint32_t)ex_opt_int(a, v, 1, EX_MAX_OUTPUT);
    else if (strcmp(a, "--unique-images") == 0)
      WL.unique_images = (uint32_t)ex_opt_int(a, v, 0, 100000000);
    else if (strcmp(a, "--seed") == 0)
      WL.seed = (uint64_t)ex_opt_int(a, v, 0, (1ll << 62));
    else if (strcmp(a, "--concurrency") == 0)
      conc = (uint32_t)ex_opt_int(a, v, 1, 1024);
    else if (strcmp(a, "--timeout-ms") == 0)
      timeout_ms = (int)ex_opt_int(a, v, 1, 3600000);
    else if (strcmp(a, "--label") == 0)
      label = v;
    else if (strcmp(a, "--tokens-out") == 0)
      tokens_out = v;
    else if (strcmp(a, "--summary-out") == 0)
      summary_out = v;
    else {
      fprintf(stderr, "error: unknown option %s (see --help)\n", a);
      return 2;
    }
  }
  if (proxy_addr == NULL) {
    fprintf(stderr, "error: --proxy is required (see --help)\n");
    return 2;
  }
  if (WL.images + WL.prompt_tokens == 0) {
    fprintf(stderr, "error: a request needs at least one image or prompt token\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a dead proxy is ECONN, not a signal */
  R = calloc(WL.requests, sizeof *R);
  uint32_t *tokmem = calloc((size_t)WL.requests * WL.output_tokens, sizeof(uint32_t));
  pthread_t *th = calloc(conc, sizeof *th);
  if (R == NULL || tokmem == NULL || th == NULL) {
    fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  for (uint32_t i = 0; i < WL.requests; i++)
    R[i].tokens = tokmem + (size_t)i * WL.output_tokens;
  uint64_t t0 = ex_now_us();
  uint32_t started = 0;
  for (uint32_t c = 0; c < conc; c++)
    if (pthread_create(&th[c], NULL, client_main, NULL) == 0)
      started++;
    else
      break;
  for (uint32_t c = 0; c < started; c++)
    pthread_join(th[c], NULL);
  uint64_t t1 = ex_now_us();
  report_t rp;
  compute(&rp, t0, t1);
  print_report(&rp, label, conc);
  write_outputs(&rp, tokens_out, summary_out, label, conc);
  fflush(stdout);
  int rc = started == 0 ? 1 : rp.failed > 0 ? 3 : 0;
  free(th);
  free(tokmem);
  free(R);
  return rc;
}
