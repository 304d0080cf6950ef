/* xxHash's own AVX2 code path of XXH3 (XXH_VECTOR = XXH_AVX2), built into this file alone with
 * -mavx2 (every xxHash function static here: XXH_INLINE_ALL), chosen at run time by
 * checksum.cpp where the CPU runs AVX2. Debian's libxxhash.a is built for baseline x86-64
 * (SSE2): about half the speed on a block that is in cache. */
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include "kv/xxh3_kernel.h"

static void* create(void) {
  XXH3_state_t* state = XXH3_createState();
  if (state) XXH3_64bits_reset(state);
  return state;
}
static void destroy(void* state) { XXH3_freeState((XXH3_state_t*)state); }
static void update(void* state, const void* data, size_t size) {
  XXH3_64bits_update((XXH3_state_t*)state, data, size);
}
static unsigned long long digest(const void* state) {
  return XXH3_64bits_digest((const XXH3_state_t*)state);
}
static unsigned long long oneshot(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

const FerryXxh3Kernel ferry_xxh3_avx2 = {"avx2", create, destroy, update, digest, oneshot};
