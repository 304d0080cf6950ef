#include "kv/checksum.hpp"

#include <xxhash.h>

#include <new>
#include <vector>

#include "kv/xxh3_kernel.h"

namespace ferry::detail::kv {

struct ChecksumKernel {
  FerryXxh3Kernel functions;
};

namespace {

// The library's build (libxxhash, or xxhash.h inline where XXH_INLINE_ALL is set).
void* library_create() {
  XXH3_state_t* state = XXH3_createState();
  if (state) XXH3_64bits_reset(state);
  return state;
}
void library_destroy(void* state) { XXH3_freeState(static_cast<XXH3_state_t*>(state)); }
void library_update(void* state, const void* data, std::size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
unsigned long long library_digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}
unsigned long long library_oneshot(const void* data, std::size_t size) {
  return XXH3_64bits(data, size);
}

const ChecksumKernel kLibrary{
    {"default", library_create, library_destroy, library_update, library_digest, library_oneshot}};
#ifdef FERRY_XXH3_AVX2
const ChecksumKernel kAvx2{ferry_xxh3_avx2};

// libgcc's check includes the OS's saving of the AVX registers (XGETBV).
bool runs_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

const std::vector<const ChecksumKernel*>& kernels() {
  static const std::vector<const ChecksumKernel*> all = [] {
    std::vector<const ChecksumKernel*> out;
#ifdef FERRY_XXH3_AVX2
    if (runs_avx2()) out.push_back(&kAvx2);
#endif
    out.push_back(&kLibrary);
    return out;
  }();
  return all;
}

}  // namespace

const ChecksumKernel& checksum_kernel() {
  static const ChecksumKernel& chosen = *kernels().front();  // the widest first
  return chosen;
}

std::span<const ChecksumKernel* const> checksum_kernels() { return kernels(); }

std::string_view checksum_kernel_name(const ChecksumKernel& kernel) {
  return kernel.functions.name;
}

std::uint64_t checksum(const void* data, std::size_t size, const ChecksumKernel& kernel) {
  return kernel.functions.oneshot(data, size);
}

void StreamingHash::Free::operator()(void* state) const noexcept {
  kernel->functions.destroy(state);
}

StreamingHash::StreamingHash(const ChecksumKernel& kernel)
    : _kernel(&kernel), _state(kernel.functions.create(), Free{&kernel}) {
  if (!_state) throw std::bad_alloc();
}

void StreamingHash::update(const void* data, std::uint64_t size) {
  if (size) _kernel->functions.update(_state.get(), data, size);
  _bytes += size;
}

std::uint64_t StreamingHash::digest() const { return _kernel->functions.digest(_state.get()); }

}  // namespace ferry::detail::kv
