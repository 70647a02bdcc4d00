/*
 * The stand-in model of the examples: cheap, real, deterministic
 * computation shaped like a vision-language model's encoder, prefill and
 * decode.  Nothing here is a neural network; it only has to (1) produce
 * tensors of the sizes a real model produces, (2) cost real CPU time, and
 * (3) be a pure function of its inputs, so a disaggregated run can be
 * compared token by token with a single-process run (ex_reference).
 *
 * Determinism: every function is single-threaded plain C with a fixed
 * order of floating-point operations, in one compilation unit built with
 * the same flags for every binary, so the same inputs give the same bits
 * in every process.  Weights are drawn once from a fixed seed.
 *
 * Thread safety: every function is thread-safe (the weight tables are
 * built once under pthread_once and read-only afterwards).
 */
#ifndef ECS_EX_MODEL_H
#define ECS_EX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define EX_PATCH 14                  /* ViT patch side, pixels */
#define EX_MERGE 2                   /* 2x2 patches merged into one token */
#define EX_HIDDEN 2048               /* embedding width (Qwen2.5-VL-3B) */
#define EX_KV_DIM 256                /* stand-in KV width per layer */
#define EX_LAYERS 2                  /* stand-in layers */
#define EX_KV_BLOCKS (2 * EX_LAYERS) /* K and V of each layer */
#define EX_VOCAB 32000               /* token ids are in [0, EX_VOCAB) */
#define EX_MAX_IMAGES 64             /* images in one request */
#define EX_MAX_PROMPT 8192           /* prompt tokens in one request */
#define EX_MAX_OUTPUT 8192           /* output tokens of one request */
#define EX_MAX_SIDE 8192             /* image width or height */

/* bf16 <-> f32 (round to nearest even; NaN kept quiet). */
uint16_t ex_f32_to_bf16(float f);
float ex_bf16_to_f32(uint16_t h);

/* splitmix64: the one PRNG / mixer everything derives from. */
uint64_t ex_mix64(uint64_t x);

/* Bytes of a W x H x 3 u8 image. */
size_t ex_image_nbytes(uint32_t w, uint32_t h);

/* Fills img (ex_image_nbytes bytes) deterministically from seed. */
void ex_image_generate(uint64_t seed, uint32_t w, uint32_t h, uint8_t *img);

/* The image's mm_hash: ecs_content_key of its bytes (32 hex digits). */
void ex_image_hash(const uint8_t *img, uint32_t w, uint32_t h, char out[33]);

/* Tokens the encoder makes of a W x H image: ceil(W/28) * ceil(H/28)
 * (650 for 700x728), and the embedding's bytes (tokens x 2048 x bf16). */
uint32_t ex_image_tokens(uint32_t w, uint32_t h);
uint64_t ex_embed_nbytes(uint32_t w, uint32_t h);

/* The encoder: patchify (14x14), merge 2x2, fixed sparse projection to
 * 2048, bf16.  out holds ex_embed_nbytes bytes, row-major [tokens, 2048]. */
void ex_encode(const uint8_t *img, uint32_t w, uint32_t h, uint16_t *out);

/* Sequence length of a request: image tokens then prompt tokens. */
uint32_t ex_seq_tokens(uint32_t n_images, uint32_t w, uint32_t h, uint32_t n_prompt);

/* Bytes of one KV block ([tokens, 256] bf16) and of all four. */
uint64_t ex_kv_block_nbytes(uint32_t tokens);

/* The prefill: embeddings (n_images of [img_tokens, 2048] bf16) and the
 * prompt -> KV, EX_KV_BLOCKS blocks of [tokens, 256] bf16 each
 * (kv[2*l] = K of layer l, kv[2*l+1] = V), tokens = ex_seq_tokens(...).
 * Returns 0, or -1 when out of memory. */
int ex_prefill(const uint16_t *const *embeds, uint32_t n_images, uint32_t img_tokens, const uint32_t *prompt,
               uint32_t n_prompt, uint16_t *const kv[EX_KV_BLOCKS]);

/* Decode state: runs one step at a time so a worker can stream tokens. */
typedef struct ex_decoder {
  const uint16_t *kv[EX_KV_BLOCKS]; /* borrowed KV blocks */
  uint32_t tokens;                  /* their length */
  float q[EX_KV_DIM];               /* the running state */
  float *scores;                    /* scratch, tokens floats */
  uint32_t step;                    /* steps done */
} ex_decoder_t;

/* Starts a decode over kv (borrowed until ex_decoder_free).  0 or -1. */
int ex_decoder_init(ex_decoder_t *d, uint16_t *const kv[EX_KV_BLOCKS], uint32_t tokens);
/* The next output token. */
uint32_t ex_decoder_step(ex_decoder_t *d);
void ex_decoder_free(ex_decoder_t *d);

/* ---- The workload: what the load generator sends and the reference
 * recomputes, both from these parameters alone. */
typedef struct ex_workload {
  uint32_t requests;      /* number of requests */
  uint32_t images;        /* images per request */
  uint32_t width, height; /* image size */
  uint32_t prompt_tokens; /* prompt length */
  uint32_t output_tokens; /* tokens to generate */
  uint32_t unique_images; /* distinct images over the run (0: all distinct) */
  uint64_t seed;          /* run seed */
} ex_workload_t;

/* Seed of image j of request i: images cycle through unique_images, so
 * request i reuses the images of request i - unique_images / images. */
uint64_t ex_wl_image_seed(const ex_workload_t *wl, uint32_t i, uint32_t j);
/* The prompt of request i (wl->prompt_tokens ids). */
void ex_wl_prompt(const ex_workload_t *wl, uint32_t i, uint32_t *out);
/* "req-000042" */
void ex_wl_request_id(uint32_t i, char *out, size_t cap);

/* The whole single-process computation of request i into tokens
 * (wl->output_tokens ids).  0 or -1 (out of memory). */
int ex_reference_request(const ex_workload_t *wl, uint32_t i, uint32_t *tokens);

#endif
