// The KV store's slab files: `slab-N.dat` in the namespace directory, preallocated to their
// full size at creation (posix_fallocate), so a put never needs new space. Each is opened once
// buffered and once with O_DIRECT where the file system allows it (direct() says which is used).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "platform/file_descriptor.hpp"
#include "platform/file_ops.hpp"

namespace ferry::detail::kv {

class SlabFiles {
 public:
  // A writer creates missing slabs (mode 0600) and extends short ones (a crash during the
  // preallocation); a reader only opens them.
  SlabFiles(const std::filesystem::path& directory, unsigned count, std::uint64_t slab_bytes,
            bool writable);

  unsigned count() const { return static_cast<unsigned>(_files.size()); }
  // The descriptor I/O should use now: O_DIRECT unless refused.
  NativeDescriptor fd(int slab) const;
  NativeDescriptor buffered_fd(int slab) const { return _files[slab]->buffered.get(); }
  const std::string& name(int slab) const { return _files[slab]->name; }
  const std::filesystem::path& path(int slab) const { return _files[slab]->path; }
  bool direct(int slab) const { return _files[slab]->use_direct.load(); }
  // The file system refused O_DIRECT at I/O time (EINVAL): use the buffered descriptor from
  // now on. Both stay open, so I/O in flight on the other is unaffected.
  void fall_back_to_buffered(int slab) { _files[slab]->use_direct = false; }
  // Whether every page of [offset, offset + length) is in the page cache now; false where that
  // cannot be told (Windows).
  bool cached(int slab, std::uint64_t offset, std::uint64_t length) const;
  struct Range {
    int slab = 0;
    std::uint64_t offset = 0, length = 0;
  };
  // cached() of each range, in one probe per slab where the span its ranges cover is resident
  // (a warm batch: no probe per block), else one per range.
  std::vector<bool> cached(std::span<const Range> ranges) const;
  // Whether every range looks cached, probed the same way but from a sample of its pages
  // (range_resident_sampled), stopping at the first that is not: where to read a get from.
  bool all_cached(std::span<const Range> ranges) const;

 private:
  struct File {
    FileDescriptor buffered, direct;
    std::filesystem::path path;
    std::string name;  // the path in messages
    std::atomic<bool> use_direct{false};
  };
  std::vector<std::unique_ptr<File>> _files;
};

}  // namespace ferry::detail::kv
