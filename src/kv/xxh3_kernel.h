/* One build of xxHash's XXH3-64 as a table of plain functions, so that a build compiled for a
 * wider vector unit (xxh3_avx2.c, compiled with -mavx2 and XXH_VECTOR = XXH_AVX2) can be chosen
 * at run time where the CPU has it. C, with no standard-library code: nothing of that build can
 * leak into the rest of the library. States are opaque and belong to the table that made them. */
#ifndef FERRY_KV_XXH3_KERNEL_H
#define FERRY_KV_XXH3_KERNEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FerryXxh3Kernel {
  const char* name;
  void* (*create)(void); /* a reset state, or NULL where out of memory */
  void (*destroy)(void* state);
  void (*update)(void* state, const void* data, size_t size);
  unsigned long long (*digest)(const void* state);
  unsigned long long (*oneshot)(const void* data, size_t size);
} FerryXxh3Kernel;

/* Defined only where FERRY_XXH3_AVX2 is (x86-64 GCC or Clang): call only where the CPU and the
 * OS run AVX2. */
extern const FerryXxh3Kernel ferry_xxh3_avx2;

#ifdef __cplusplus
}
#endif

#endif
