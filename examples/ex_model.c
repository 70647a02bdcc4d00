/*
 * The stand-in model (see ex_model.h).  Costs on one core of the 2-core
 * development machine, -O2: encode of a 700x728 image ~10 ms, prefill of
 * ~800 tokens a few ms, one decode step ~0.5 ms.
 */
#include "examples/ex_model.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/tensor.h"

#define EX_REGION (EX_PATCH * EX_MERGE)          /* 28: pixels per token side */
#define EX_PATCH_VEC (EX_REGION * EX_REGION * 3) /* 2352 values per merged patch */
#define EX_ENC_TAPS 4                            /* taps per embedding output */
#define EX_IN_TAPS 8                             /* taps per hidden value (2048 -> 256) */
#define EX_KV_TAPS 4                             /* taps per K/V value (256 -> 256) */
#define EX_WEIGHT_SEED 0x5eedc0de2025ull

/* The fixed weights: index and weight of every tap. */
typedef struct ex_weights {
  uint16_t enc_idx[EX_HIDDEN][EX_ENC_TAPS];             /* patch vector positions */
  float enc_w[EX_HIDDEN][EX_ENC_TAPS];                  /* their weights */
  float enc_b[EX_HIDDEN];                               /* bias per output */
  uint16_t in_idx[EX_KV_DIM][EX_IN_TAPS];               /* embedding positions */
  float in_w[EX_KV_DIM][EX_IN_TAPS];                    /* their weights */
  uint16_t kv_idx[EX_LAYERS][2][EX_KV_DIM][EX_KV_TAPS]; /* hidden positions of K, V */
  float kv_w[EX_LAYERS][2][EX_KV_DIM][EX_KV_TAPS];      /* their weights */
} ex_weights_t;

static ex_weights_t ex_w;
static pthread_once_t ex_w_once = PTHREAD_ONCE_INIT;

uint64_t ex_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A float in [-1, 1) from a 64-bit value. */
static float ex_unit(uint64_t r) {
  return (float)((double)(r >> 40) / (double)(1ull << 23) - 1.0);
}

static void ex_weights_build(void) {
  uint64_t s = EX_WEIGHT_SEED;
  for (int o = 0; o < EX_HIDDEN; o++) {
    for (int k = 0; k < EX_ENC_TAPS; k++) {
      s = ex_mix64(s);
      ex_w.enc_idx[o][k] = (uint16_t)(s % EX_PATCH_VEC);
      s = ex_mix64(s);
      ex_w.enc_w[o][k] = ex_unit(s) * 0.5f;
    }
    s = ex_mix64(s);
    ex_w.enc_b[o] = ex_unit(s) * 0.1f;
  }
  for (int o = 0; o < EX_KV_DIM; o++)
    for (int k = 0; k < EX_IN_TAPS; k++) {
      s = ex_mix64(s);
      ex_w.in_idx[o][k] = (uint16_t)(s % EX_HIDDEN);
      s = ex_mix64(s);
      ex_w.in_w[o][k] = ex_unit(s) * 0.5f;
    }
  for (int l = 0; l < EX_LAYERS; l++)
    for (int kv = 0; kv < 2; kv++)
      for (int o = 0; o < EX_KV_DIM; o++)
        for (int k = 0; k < EX_KV_TAPS; k++) {
          s = ex_mix64(s);
          ex_w.kv_idx[l][kv][o][k] = (uint16_t)(s % EX_KV_DIM);
          s = ex_mix64(s);
          ex_w.kv_w[l][kv][o][k] = ex_unit(s) * 0.7f;
        }
}

static const ex_weights_t *ex_weights(void) {
  pthread_once(&ex_w_once, ex_weights_build);
  return &ex_w;
}

uint16_t ex_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float ex_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

size_t ex_image_nbytes(uint32_t w, uint32_t h) {
  return (size_t)w * h * 3u;
}

/* Smooth-ish noise: a per-row and per-column gradient plus a random
 * byte, so patches differ from each other and from image to image. */
void ex_image_generate(uint64_t seed, uint32_t w, uint32_t h, uint8_t *img) {
  size_t n = ex_image_nbytes(w, h);
  uint64_t s = ex_mix64(seed ^ 0x1a6e0000ull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s = ex_mix64(s);
    memcpy(img + i, &s, 8);
  }
  if (i < n) {
    s = ex_mix64(s);
    memcpy(img + i, &s, n - i);
  }
  uint8_t base = (uint8_t)(seed >> 17);
  for (uint32_t y = 0; y < h; y++) {
    uint8_t *row = img + (size_t)y * w * 3u;
    uint8_t g = (uint8_t)(base + y / 4u);
    for (uint32_t x = 0; x < w * 3u; x++)
      row[x] = (uint8_t)((row[x] >> 2) + g + (uint8_t)(x / 12u));
  }
}

void ex_image_hash(const uint8_t *img, uint32_t w, uint32_t h, char out[33]) {
  ecs_content_key(img, ex_image_nbytes(w, h), out);
}

uint32_t ex_image_tokens(uint32_t w, uint32_t h) {
  return ((w + EX_REGION - 1) / EX_REGION) * ((h + EX_REGION - 1) / EX_REGION);
}

uint64_t ex_embed_nbytes(uint32_t w, uint32_t h) {
  return (uint64_t)ex_image_tokens(w, h) * EX_HIDDEN * 2u;
}

/* The merged patch at token (gx, gy) as floats in [-1, 1); pixels past
 * the image's edge are 0 (mid grey). */
static void ex_patch_vector(const uint8_t *img, uint32_t w, uint32_t h, uint32_t gx, uint32_t gy, float *pv) {
  for (uint32_t py = 0; py < EX_MERGE; py++)
    for (uint32_t px = 0; px < EX_MERGE; px++) {
      float *sub = pv + (py * EX_MERGE + px) * (EX_PATCH * EX_PATCH * 3);
      for (uint32_t r = 0; r < EX_PATCH; r++) {
        uint32_t y = gy * EX_REGION + py * EX_PATCH + r;
        for (uint32_t c = 0; c < EX_PATCH; c++) {
          uint32_t x = gx * EX_REGION + px * EX_PATCH + c;
          float *dst = sub + (r * EX_PATCH + c) * 3;
          if (y < h && x < w) {
            const uint8_t *p = img + ((size_t)y * w + x) * 3u;
            dst[0] = ((float)p[0] - 128.0f) * (1.0f / 128.0f);
            dst[1] = ((float)p[1] - 128.0f) * (1.0f / 128.0f);
            dst[2] = ((float)p[2] - 128.0f) * (1.0f / 128.0f);
          } else {
            dst[0] = dst[1] = dst[2] = 0.0f;
          }
        }
      }
    }
}

void ex_encode(const uint8_t *img, uint32_t w, uint32_t h, uint16_t *out) {
  const ex_weights_t *W = ex_weights();
  float pv[EX_PATCH_VEC];
  uint32_t gw = (w + EX_REGION - 1) / EX_REGION, gh = (h + EX_REGION - 1) / EX_REGION;
  for (uint32_t gy = 0; gy < gh; gy++)
    for (uint32_t gx = 0; gx < gw; gx++) {
      ex_patch_vector(img, w, h, gx, gy, pv);
      uint16_t *row = out + ((size_t)gy * gw + gx) * EX_HIDDEN;
      for (int o = 0; o < EX_HIDDEN; o++) {
        float acc = W->enc_b[o];
        for (int k = 0; k < EX_ENC_TAPS; k++)
          acc += W->enc_w[o][k] * pv[W->enc_idx[o][k]];
        /* a cheap non-linearity, so the embedding is not linear in pixels */
        acc = acc > 0.0f ? acc : 0.125f * acc;
        row[o] = ex_f32_to_bf16(acc);
      }
    }
}

uint32_t ex_seq_tokens(uint32_t n_images, uint32_t w, uint32_t h, uint32_t n_prompt) {
  return n_images * ex_image_tokens(w, h) + n_prompt;
}

uint64_t ex_kv_block_nbytes(uint32_t tokens) {
  return (uint64_t)tokens * EX_KV_DIM * 2u;
}

/* The input vector of a text token: pseudo-random from its id. */
static void ex_token_embed(uint32_t id, float *h) {
  uint64_t s = ex_mix64(0x70c0000000ull + id);
  for (int d = 0; d < EX_KV_DIM; d++) {
    s = ex_mix64(s);
    h[d] = ex_unit(s) * 0.5f;
  }
}

int ex_prefill(const uint16_t *const *embeds, uint32_t n_images, uint32_t img_tokens, const uint32_t *prompt,
               uint32_t n_prompt, uint16_t *const kv[EX_KV_BLOCKS]) {
  const ex_weights_t *W = ex_weights();
  uint32_t T = n_images * img_tokens + n_prompt;
  float *hid = malloc((size_t)T * EX_KV_DIM * sizeof(float));
  if (hid == NULL)
    return -1;
  /* layer-0 input: a sparse projection of each embedding row, or the
   * token's own vector */
  for (uint32_t t = 0; t < T; t++) {
    float *h = hid + (size_t)t * EX_KV_DIM;
    if (t < n_images * img_tokens) {
      const uint16_t *e = embeds[t / img_tokens] + (size_t)(t % img_tokens) * EX_HIDDEN;
      for (int o = 0; o < EX_KV_DIM; o++) {
        float acc = 0.0f;
        for (int k = 0; k < EX_IN_TAPS; k++)
          acc += W->in_w[o][k] * ex_bf16_to_f32(e[W->in_idx[o][k]]);
        h[o] = acc;
      }
    } else {
      ex_token_embed(prompt[t - n_images * img_tokens], h);
    }
  }
  /* each layer: K and V by sparse projection, then a causal running mean
   * of V mixed back into the hidden state (attention's poor cousin) */
  float mean[EX_KV_DIM];
  for (int l = 0; l < EX_LAYERS; l++) {
    uint16_t *K = kv[2 * l], *V = kv[2 * l + 1];
    memset(mean, 0, sizeof mean);
    for (uint32_t t = 0; t < T; t++) {
      float *h = hid + (size_t)t * EX_KV_DIM;
      float v[EX_KV_DIM];
      for (int o = 0; o < EX_KV_DIM; o++) {
        float ak = 0.0f, av = 0.0f;
        for (int k = 0; k < EX_KV_TAPS; k++) {
          ak += W->kv_w[l][0][o][k] * h[W->kv_idx[l][0][o][k]];
          av += W->kv_w[l][1][o][k] * h[W->kv_idx[l][1][o][k]];
        }
        K[(size_t)t * EX_KV_DIM + o] = ex_f32_to_bf16(ak);
        V[(size_t)t * EX_KV_DIM + o] = ex_f32_to_bf16(av);
        v[o] = av;
      }
      float inv = 1.0f / (float)(t + 1);
      for (int o = 0; o < EX_KV_DIM; o++) {
        mean[o] += (v[o] - mean[o]) * inv;
        h[o] = 0.5f * h[o] + 0.5f * mean[o];
      }
    }
  }
  free(hid);
  return 0;
}

int ex_decoder_init(ex_decoder_t *d, uint16_t *const kv[EX_KV_BLOCKS], uint32_t tokens) {
  memset(d, 0, sizeof *d);
  if (tokens == 0)
    return -1;
  for (int b = 0; b < EX_KV_BLOCKS; b++)
    d->kv[b] = kv[b];
  d->tokens = tokens;
  d->scores = malloc((size_t)tokens * sizeof(float));
  if (d->scores == NULL)
    return -1;
  const uint16_t *last = kv[EX_KV_BLOCKS - 1] + (size_t)(tokens - 1) * EX_KV_DIM;
  for (int i = 0; i < EX_KV_DIM; i++)
    d->q[i] = ex_bf16_to_f32(last[i]);
  return 0;
}

/* One step: attention of q over each layer's K/V (softmax), residual, and
 * a token drawn by hashing the quantised state. */
uint32_t ex_decoder_step(ex_decoder_t *d) {
  for (int l = 0; l < EX_LAYERS; l++) {
    const uint16_t *K = d->kv[2 * l], *V = d->kv[2 * l + 1];
    float mx = -INFINITY;
    for (uint32_t t = 0; t < d->tokens; t++) {
      const uint16_t *k = K + (size_t)t * EX_KV_DIM;
      float s = 0.0f;
      for (int i = 0; i < EX_KV_DIM; i++)
        s += d->q[i] * ex_bf16_to_f32(k[i]);
      s *= 0.0625f;
      d->scores[t] = s;
      if (s > mx)
        mx = s;
    }
    float sum = 0.0f, o[EX_KV_DIM];
    memset(o, 0, sizeof o);
    for (uint32_t t = 0; t < d->tokens; t++) {
      float p = expf(d->scores[t] - mx);
      sum += p;
      const uint16_t *v = V + (size_t)t * EX_KV_DIM;
      for (int i = 0; i < EX_KV_DIM; i++)
        o[i] += p * ex_bf16_to_f32(v[i]);
    }
    for (int i = 0; i < EX_KV_DIM; i++)
      d->q[i] += o[i] / sum;
  }
  uint64_t hsh = 0x7e57ull + d->step;
  for (int i = 0; i < EX_KV_DIM; i++) {
    int32_t qv = (int32_t)lrintf(d->q[i] * 64.0f);
    hsh = ex_mix64(hsh ^ (uint32_t)qv);
  }
  uint32_t tok = (uint32_t)(hsh % EX_VOCAB);
  float e[EX_KV_DIM];
  ex_token_embed(tok, e);
  for (int i = 0; i < EX_KV_DIM; i++)
    d->q[i] = 0.5f * d->q[i] + e[i];
  d->step++;
  return tok;
}

void ex_decoder_free(ex_decoder_t *d) {
  free(d->scores);
  d->scores = NULL;
}

uint64_t ex_wl_image_seed(const ex_workload_t *wl, uint32_t i, uint32_t j) {
  uint64_t idx = (uint64_t)i * wl->images + j;
  if (wl->unique_images > 0)
    idx %= wl->unique_images;
  return ex_mix64(wl->seed * 0x100000001b3ull + idx + 1);
}

void ex_wl_prompt(const ex_workload_t *wl, uint32_t i, uint32_t *out) {
  uint64_t s = ex_mix64(wl->seed ^ (0xba5e000000000000ull + i));
  for (uint32_t k = 0; k < wl->prompt_tokens; k++) {
    s = ex_mix64(s);
    out[k] = (uint32_t)(s % EX_VOCAB);
  }
}

void ex_wl_request_id(uint32_t i, char *out, size_t cap) {
  snprintf(out, cap, "req-%06u", i);
}

int ex_reference_request(const ex_workload_t *wl, uint32_t i, uint32_t *tokens) {
  int rc = -1;
  uint32_t it = ex_image_tokens(wl->width, wl->height);
  uint32_t T = ex_seq_tokens(wl->images, wl->width, wl->height, wl->prompt_tokens);
  uint8_t *img = malloc(ex_image_nbytes(wl->width, wl->height));
  uint16_t *emb = malloc(ex_embed_nbytes(wl->width, wl->height) * (wl->images ? wl->images : 1));
  uint32_t *prompt = malloc(((size_t)wl->prompt_tokens + 1) * sizeof(uint32_t));
  uint16_t *kvmem = malloc(ex_kv_block_nbytes(T) * EX_KV_BLOCKS);
  const uint16_t *embeds[EX_MAX_IMAGES];
  uint16_t *kv[EX_KV_BLOCKS];
  ex_decoder_t d = {0};
  if (img == NULL || emb == NULL || prompt == NULL || kvmem == NULL || wl->images > EX_MAX_IMAGES)
    goto out;
  for (uint32_t j = 0; j < wl->images; j++) {
    ex_image_generate(ex_wl_image_seed(wl, i, j), wl->width, wl->height, img);
    embeds[j] = emb + (size_t)j * it * EX_HIDDEN;
    ex_encode(img, wl->width, wl->height, (uint16_t *)embeds[j]);
  }
  ex_wl_prompt(wl, i, prompt);
  for (int b = 0; b < EX_KV_BLOCKS; b++)
    kv[b] = kvmem + (size_t)b * T * EX_KV_DIM;
  if (ex_prefill(embeds, wl->images, it, prompt, wl->prompt_tokens, kv) != 0)
    goto out;
  if (ex_decoder_init(&d, kv, T) != 0)
    goto out;
  for (uint32_t k = 0; k < wl->output_tokens; k++)
    tokens[k] = ex_decoder_step(&d);
  rc = 0;
out:
  ex_decoder_free(&d);
  free(kvmem);
  free(prompt);
  free(emb);
  free(img);
  return rc;
}
