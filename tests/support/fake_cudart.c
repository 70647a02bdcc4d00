/*
 * A stand-in for libcudart.so on machines without a GPU, for
 * tests/stat_cuda.sh: the two calls mempool/region.c looks up with dlsym.
 * Built twice: as is, cudaHostRegister accepts (the pool counts as
 * registered); with ECS_FAKE_CUDART_REFUSE it fails as CUDA does without a
 * device (cudaErrorNoDevice, 100).  The real library is checked on a GPU
 * by scripts/device-check.sh.
 */
#include <stddef.h>

int cudaHostRegister(void *ptr, size_t size, unsigned flags);
int cudaHostUnregister(void *ptr);

int cudaHostRegister(void *ptr, size_t size, unsigned flags) {
  (void)flags;
#ifdef ECS_FAKE_CUDART_REFUSE
  (void)ptr;
  (void)size;
  return 100;
#else
  return ptr && size ? 0 : 1; /* cudaErrorInvalidValue for nothing to register */
#endif
}

int cudaHostUnregister(void *ptr) {
  return ptr ? 0 : 1;
}
