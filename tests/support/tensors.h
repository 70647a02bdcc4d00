/*
 * Encoder-like test data, shared by the tests and the benchmarks: a
 * seeded xorshift64* generator, standard normal values (Box-Muller) and
 * the f32 -> bf16 / f16 conversions an encoder's output goes through.
 * Fixed seeds give the same bytes on every run.
 */
#ifndef ECS_TS_TENSORS_H
#define ECS_TS_TENSORS_H

#include <stdint.h>

/* xorshift64*: the next 64 random bits; *s must not be 0. */
uint64_t ecs_ts_rng_next(uint64_t *s);

/* A standard normal value (mean 0, std 1). */
float ecs_ts_normal(uint64_t *s);

/* Round to nearest even. */
uint16_t ecs_ts_f32_to_bf16(float f);

/* Round to nearest even; subnormals truncated, overflow to infinity. */
uint16_t ecs_ts_f32_to_f16(float f);

#endif
