#include "kv/slab_files.hpp"

#include <cerrno>

#include "ferry/error.hpp"
#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"

namespace ferry::detail::kv {

SlabFiles::SlabFiles(const std::filesystem::path& directory, unsigned count,
                     std::uint64_t slab_bytes, bool writable) {
  for (unsigned i = 0; i < count; ++i) {
    auto file = std::make_unique<File>();
    file->path = directory / ("slab-" + std::to_string(i) + ".dat");
    file->name = file->path.string();
    file->buffered = writable ? open_or_create(file->path, 0600) : open_existing(file->path, false);
    if (!file->buffered) FERRY_SYSCALL_FAIL(file->name, ": cannot open slab file");
    const std::uint64_t size = file_size(file->buffered, file->path);  // a regular file
    FERRY_EXPECT(size <= slab_bytes, std::invalid_argument, file->name, ": slab file is ", size,
                 " bytes, the store's slabs are ", slab_bytes);
    if (size < slab_bytes) {
      FERRY_EXPECT(writable, std::invalid_argument, file->name, ": slab file is ", size,
                   " bytes, the store's slabs are ", slab_bytes);
      const int error = preallocate(file->buffered.get(), slab_bytes);
      if (error != 0)
        detail::fail_errno(error, file->name, ": cannot preallocate ", slab_bytes, " bytes");
      if (!sync_all(file->buffered.get())) FERRY_SYSCALL_FAIL(file->name, ": fsync");
    }
    // O_DIRECT where allowed (tmpfs and some others refuse it with EINVAL).
    file->direct = open_existing(file->path, writable, true);
    file->use_direct = bool(file->direct);
    _files.push_back(std::move(file));
  }
}

NativeDescriptor SlabFiles::fd(int slab) const {
  const File& file = *_files[slab];
  return file.use_direct.load() ? file.direct.get() : file.buffered.get();
}

bool SlabFiles::cached(int slab, std::uint64_t offset, std::uint64_t length) const {
  return range_resident(_files[slab]->buffered.get(), offset, length);
}

}  // namespace ferry::detail::kv
