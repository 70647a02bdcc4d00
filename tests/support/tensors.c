/* Encoder-like test data (tests/support/tensors.h). */
#include "support/tensors.h"

#include <math.h>
#include <string.h>

uint64_t ecs_ts_rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

float ecs_ts_normal(uint64_t *s) {
  double u1 = ((double)(ecs_ts_rng_next(s) >> 11) + 1.0) / 9007199254740993.0;
  double u2 = (double)(ecs_ts_rng_next(s) >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint16_t ecs_ts_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

uint16_t ecs_ts_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  int e = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffff;
  if (e >= 31)
    return sign | 0x7c00;
  if (e <= 0) /* subnormal (truncated) or zero */
    return e < -10 ? sign : (uint16_t)(sign | ((m | 0x800000) >> (14 - e)));
  uint32_t h = (uint32_t)sign | ((uint32_t)e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++;
  return (uint16_t)h;
}
