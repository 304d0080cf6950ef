// Host-memory helpers of the KV store tests: slab pages dropped from the page cache (so that
// gets read the device) and page-aligned buffers (the O_DIRECT routes).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"
#include "platform/system.hpp"

namespace ferry::test {

// Drops a store's slab pages from the page cache (synced first), so gets read the device.
inline void drop_slab_cache(const std::filesystem::path& root) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().filename().string().rfind("slab-", 0) != 0) continue;
    const detail::FileDescriptor fd = detail::open_existing(entry.path(), true);
    ASSERT_TRUE(fd) << entry.path();
    ASSERT_TRUE(detail::sync_all(fd.get()));
    detail::drop_cached_pages(fd.get());  // none to drop on Windows
  }
}

inline std::shared_ptr<std::byte> page_aligned(std::uint64_t bytes) {
  const std::uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  return {static_cast<std::byte*>(detail::aligned_malloc(4096, rounded)),
          [](std::byte* p) { detail::aligned_free(p); }};
}

}  // namespace ferry::test
