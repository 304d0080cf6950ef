#include "kv/slab_files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail::kv {

SlabFiles::SlabFiles(const std::filesystem::path& directory, unsigned count,
                     std::uint64_t slab_bytes, bool writable) {
  const int flags = (writable ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC;
  for (unsigned i = 0; i < count; ++i) {
    auto file = std::make_unique<File>();
    file->name = (directory / ("slab-" + std::to_string(i) + ".dat")).string();
    file->buffered = FileDescriptor(::open(file->name.c_str(), flags, 0600));
    if (!file->buffered) FERRY_SYSCALL_FAIL(file->name, ": cannot open slab file");
    struct stat st {};
    if (::fstat(file->buffered.get(), &st) != 0) FERRY_SYSCALL_FAIL(file->name);
    FERRY_EXPECT(S_ISREG(st.st_mode), std::invalid_argument, file->name, ": not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    FERRY_EXPECT(size <= slab_bytes, std::invalid_argument, file->name, ": slab file is ", size,
                 " bytes, the store's slabs are ", slab_bytes);
    if (size < slab_bytes) {
      FERRY_EXPECT(writable, std::invalid_argument, file->name, ": slab file is ", size,
                   " bytes, the store's slabs are ", slab_bytes);
      const int error = ::posix_fallocate(file->buffered.get(), 0, static_cast<off_t>(slab_bytes));
      if (error != 0)
        detail::fail_errno(error, file->name, ": cannot preallocate ", slab_bytes, " bytes");
      if (::fsync(file->buffered.get()) != 0) FERRY_SYSCALL_FAIL(file->name, ": fsync");
    }
    // O_DIRECT where allowed (tmpfs and some others refuse it with EINVAL).
    file->direct = FileDescriptor(::open(file->name.c_str(), (flags & ~O_CREAT) | O_DIRECT));
    file->use_direct = bool(file->direct);
    file->bytes = slab_bytes;
    _files.push_back(std::move(file));
  }
}

int SlabFiles::fd(int slab) const {
  const File& file = *_files[slab];
  return file.use_direct.load() ? file.direct.get() : file.buffered.get();
}

SlabFiles::Mapping::~Mapping() {
  if (data) ::munmap(data, bytes);
}

bool SlabFiles::cached(int slab, std::uint64_t offset, std::uint64_t length) const {
  const File& file = *_files[slab];
  std::call_once(file.mapped, [&] {
    void* p = ::mmap(nullptr, file.bytes, PROT_READ, MAP_SHARED, file.buffered.get(), 0);
    if (p == MAP_FAILED) return;  // no answer: treated as not cached
    file.mapping.data = p;
    file.mapping.bytes = file.bytes;
  });
  if (!file.mapping.data || length == 0 || offset + length > file.mapping.bytes) return false;
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t first = offset / page * page;
  const std::uint64_t bytes = offset + length - first;
  thread_local std::vector<unsigned char> resident;
  resident.resize((bytes + page - 1) / page);
  if (::mincore(static_cast<char*>(file.mapping.data) + first, bytes, resident.data()) != 0)
    return false;
  for (unsigned char r : resident)
    if (!(r & 1)) return false;
  return true;
}

}  // namespace ferry::detail::kv
