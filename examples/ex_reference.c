/*
 * ecs-example-reference: the single-process run of the examples' workload
 * (no store, no sockets: encode, prefill and decode in one process, as a
 * plain non-disaggregated engine would).
 *
 *   --out FILE    writes every request's tokens, one line each
 *   --check FILE  compares a disaggregated run's tokens (ecs-example-loadgen
 *                 --tokens-out) with it, request by request and token by
 *                 token, and prints "correctness: PASS (...)" or
 *                 "correctness: FAIL: ..." naming the first request that
 *                 differs; exit 0 on PASS, 1 on FAIL.  Requests the run
 *                 reported failed are counted, not compared.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/ex_model.h"
#include "examples/ex_util.h"

static ex_workload_t WL;
static uint32_t *ref; /* requests x output_tokens, computed */
static atomic_uint next_req;
static atomic_int oom;

static void *ref_main(void *arg) {
  (void)arg;
  for (;;) {
    uint32_t i = atomic_fetch_add(&next_req, 1);
    if (i >= WL.requests)
      break;
    if (ex_reference_request(&WL, i, ref + (size_t)i * WL.output_tokens) != 0)
      atomic_store(&oom, 1);
  }
  return NULL;
}

/* Compares the run's tokens file with ref; prints the verdict. */
static int check(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    printf("correctness: FAIL: cannot read the run's tokens (%s)\n", path);
    return 1;
  }
  char *seen = calloc(WL.requests, 1);
  size_t cap = 16 + (size_t)WL.output_tokens * 12, nok = 0, nfailed = 0;
  char *line = malloc(cap);
  int bad = 0;
  if (seen == NULL || line == NULL) {
    printf("correctness: FAIL: out of memory\n");
    bad = 1;
  }
  while (!bad && fgets(line, (int)cap, f) != NULL) {
    char *save = NULL, *tok = strtok_r(line, " \n", &save);
    if (tok == NULL)
      continue;
    int failed = strcmp(tok, "failed") == 0;
    if (failed)
      tok = strtok_r(NULL, " \n", &save);
    unsigned idx;
    if (tok == NULL || sscanf(tok, "req-%u", &idx) != 1 || idx >= WL.requests || seen[idx]) {
      printf("correctness: FAIL: unexpected line in %s (request '%s')\n", path, tok ? tok : "");
      bad = 1;
      break;
    }
    seen[idx] = 1;
    if (failed) {
      nfailed++;
      continue;
    }
    const uint32_t *want = ref + (size_t)idx * WL.output_tokens;
    uint32_t k = 0;
    for (char *t = strtok_r(NULL, " \n", &save); t != NULL; t = strtok_r(NULL, " \n", &save), k++) {
      unsigned long got = strtoul(t, NULL, 10);
      if (k >= WL.output_tokens || got != want[k]) {
        if (k >= WL.output_tokens)
          printf("correctness: FAIL: %s has more than %u tokens\n", tok, WL.output_tokens);
        else
          printf("correctness: FAIL: %s differs from the single-process run at token %u (got %lu, "
                 "expected %u)\n",
                 tok, k, got, want[k]);
        bad = 1;
        break;
      }
    }
    if (!bad && k != WL.output_tokens) {
      printf("correctness: FAIL: %s has %u tokens, the single-process run %u\n", tok, k, WL.output_tokens);
      bad = 1;
    }
    nok++;
  }
  fclose(f);
  for (uint32_t i = 0; !bad && i < WL.requests; i++)
    if (!seen[i]) {
      printf("correctness: FAIL: req-%06u is missing from %s\n", i, path);
      bad = 1;
    }
  if (!bad && nok == 0) {
    printf("correctness: FAIL: no request succeeded, nothing to compare\n");
    bad = 1;
  }
  if (!bad) {
    printf("correctness: PASS (%zu requests match the single-process run", nok);
    if (nfailed > 0)
      printf("; %zu failed requests not compared", nfailed);
    printf(")\n");
  }
  free(line);
  free(seen);
  return bad;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ecs-example-reference [workload options] (--out FILE | --check FILE)\n"
             "\n"
             "  --requests N, --images-per-request N, --image-size WxH, --prompt-tokens N,\n"
             "  --output-tokens N, --unique-images N, --seed N   the workload (as ecs-example-loadgen)\n"
             "  --threads N      compute threads (default 2)\n"
             "  --out FILE       write the tokens\n"
             "  --check FILE     compare a run's tokens with the single-process run\n"
             "  --help           this text\n");
}

int main(int argc, char **argv) {
  const char *out = NULL, *chk = NULL;
  unsigned threads = 2;
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
    if (strcmp(a, "--requests") == 0)
      WL.requests = (uint32_t)ex_opt_int(a, v, 1, 1000000);
    else if (strcmp(a, "--images-per-request") == 0)
      WL.images = (uint32_t)ex_opt_int(a, v, 0, EX_MAX_IMAGES);
    else if (strcmp(a, "--image-size") == 0) {
      if (ex_parse_wh(v, &WL.width, &WL.height) != 0) {
        fprintf(stderr, "error: --image-size wants WxH, got '%s'\n", v);
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
    else if (strcmp(a, "--threads") == 0)
      threads = (unsigned)ex_opt_int(a, v, 1, 64);
    else if (strcmp(a, "--out") == 0)
      out = v;
    else if (strcmp(a, "--check") == 0)
      chk = v;
    else {
      fprintf(stderr, "error: unknown option %s (see --help)\n", a);
      return 2;
    }
  }
  if ((out == NULL) == (chk == NULL)) {
    fprintf(stderr, "error: give one of --out FILE or --check FILE (see --help)\n");
    return 2;
  }
  ref = calloc((size_t)WL.requests * WL.output_tokens, sizeof(uint32_t));
  pthread_t th[64];
  if (ref == NULL) {
    fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  unsigned started = 0;
  for (unsigned t = 0; t < threads; t++)
    if (pthread_create(&th[t], NULL, ref_main, NULL) == 0)
      started++;
  if (started == 0)
    ref_main(NULL);
  for (unsigned t = 0; t < started; t++)
    pthread_join(th[t], NULL);
  if (atomic_load(&oom)) {
    fprintf(stderr, "error: out of memory computing the reference\n");
    free(ref);
    return 1;
  }
  int rc = 0;
  if (out != NULL) {
    FILE *f = fopen(out, "w");
    if (f == NULL) {
      perror(out);
      rc = 1;
    } else {
      for (uint32_t i = 0; i < WL.requests; i++) {
        fprintf(f, "req-%06u", i);
        for (uint32_t k = 0; k < WL.output_tokens; k++)
          fprintf(f, " %u", ref[(size_t)i * WL.output_tokens + k]);
        fputc('\n', f);
      }
      rc = fclose(f) == 0 ? 0 : 1;
    }
  } else {
    rc = check(chk);
  }
  free(ref);
  return rc;
}
