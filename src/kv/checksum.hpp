// The KV store's block checksum: XXH3-64 (the digest xxhash.h's XXH3_64bits gives), computed by
// the fastest of xxHash's own builds this CPU runs: its AVX2 code path where the CPU has AVX2
// (x86-64 builds with GCC or Clang), else the library's default build. Same digest either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace ferry::detail::kv {

struct ChecksumKernel;  // one build of XXH3 (xxh3_kernel.h)

// The build this process uses (chosen once), and every build this one carries that this CPU
// runs (for tests: each must give the library's digest).
const ChecksumKernel& checksum_kernel();
std::span<const ChecksumKernel* const> checksum_kernels();
std::string_view checksum_kernel_name(const ChecksumKernel& kernel);  // "avx2", "default"

std::uint64_t checksum(const void* data, std::size_t size,
                       const ChecksumKernel& kernel = checksum_kernel());

// XXH3-64 of bytes handed over in order: the digest one call over all of them gives.
class StreamingHash {
 public:
  explicit StreamingHash(const ChecksumKernel& kernel = checksum_kernel());  // std::bad_alloc
  void update(const void* data, std::uint64_t size);
  std::uint64_t bytes() const { return _bytes; }
  std::uint64_t digest() const;

 private:
  struct Free {
    const ChecksumKernel* kernel;
    void operator()(void* state) const noexcept;
  };
  const ChecksumKernel* _kernel;
  std::unique_ptr<void, Free> _state;
  std::uint64_t _bytes = 0;
};

}  // namespace ferry::detail::kv
