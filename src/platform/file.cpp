// What platform/file.hpp's PlatformFile does the same way on every system: ownership of its two
// handles. Opening, I/O and closing one handle are platform/<os>/file.cpp's.
#include "platform/file.hpp"

#include <utility>

namespace ferry::detail {
namespace {

void close_owned(NativeFile& f) noexcept {
  if (f != kNoNativeFile) close_native_file(std::exchange(f, kNoNativeFile));
}

void close_owned(std::atomic<NativeFile>& f) noexcept {
  if (const NativeFile old = f.exchange(kNoNativeFile); old != kNoNativeFile)
    close_native_file(old);
}

}  // namespace

PlatformFile::PlatformFile(PlatformFile&& other) noexcept { *this = std::move(other); }

PlatformFile& PlatformFile::operator=(PlatformFile&& other) noexcept {
  if (this != &other) {
    close_owned(_buffered);
    close_owned(_direct);
    _path = std::move(other._path);
    _access = other._access;
    _buffered = std::exchange(other._buffered, kNoNativeFile);
    _direct.store(other._direct.exchange(kNoNativeFile));
    _identity = other._identity;
    _direct_refusal = std::move(other._direct_refusal);
    _residency.store(other._residency.load());
    _residency_at.store(other._residency_at.exchange(-1));
  }
  return *this;
}

PlatformFile::~PlatformFile() {
  close_owned(_buffered);
  close_owned(_direct);
}

}  // namespace ferry::detail
