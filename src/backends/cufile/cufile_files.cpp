#include "backends/cufile/cufile_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backends/cufile/aligned_split.hpp"
#include "backends/cufile/transfer_result.hpp"
#include "ferry/error.hpp"
#include "platform/file.hpp"
#include "shim/cufile.hpp"

namespace ferry::detail {
namespace {

constexpr std::size_t kHandleCacheWanted = 256;

// cuFile reads a block device's attributes from the udev database; containers and VMs often
// have none, and registration then fails even in compatibility mode.
std::string registration_hint(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  const std::string entry = "/run/udev/data/b" + std::to_string(major(st.st_dev)) + ":" +
                            std::to_string(minor(st.st_dev));
  if (major(st.st_dev) == 0) return " (the file system has no block device, which cuFile needs)";
  std::error_code ec;
  if (std::filesystem::exists(entry, ec)) return "";
  return " (cuFile found no udev attributes for the block device: " + entry +
         " is missing, as in many containers and VMs)";
}

// Registers `fd` with cuFile; throws CudaError naming `path` (and, where it can tell, why).
shim::cufile::Handle register_descriptor(const std::filesystem::path& path, int fd) {
  shim::cufile::Descriptor descr{};
  descr.type = shim::cufile::kHandleTypeOpaqueFd;
  descr.handle.fd = fd;
  shim::cufile::Handle handle = nullptr;
  const auto r = shim::CuFileLibrary::get().cuFileHandleRegister(&handle, &descr);
  if (r.err != shim::cufile::kSuccess)
    detail::fail<CudaError>(path.string(),
                            ": cuFileHandleRegister failed: ", shim::cufile_error_text(r),
                            registration_hint(fd), "; --backend posix reads it without cuFile");
  return handle;
}

OpenedFile open_registered(const std::filesystem::path& path, bool writable) {
  const int mode = writable ? (O_RDWR | O_CREAT) : O_RDONLY;
  int fd = ::open(path.c_str(), mode | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), mode | O_CLOEXEC, 0644);
  if (fd < 0) FERRY_SYSCALL_FAIL(path.string());
  const int plain_fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (plain_fd < 0) {
    ::close(fd);
    FERRY_SYSCALL_FAIL(path.string());
  }
  try {
    return {fd, plain_fd, register_descriptor(path, fd), true};
  } catch (...) {
    ::close(fd);
    ::close(plain_fd);
    throw;
  }
}

// A file set's open file: its O_DIRECT descriptor where the file system gave one (else the
// buffered one, which only compatibility mode can use) is registered; the file set closes both.
OpenedFile register_open(const PlatformFile& file) {
  const int plain = static_cast<int>(file.native(false));
  const int fd = file.has_direct() ? static_cast<int>(file.native(true)) : plain;
  return {fd, plain, register_descriptor(file.path(), fd), false};
}

void close_registered(const OpenedFile& f) {
  shim::CuFileLibrary::get().cuFileHandleDeregister(f.handle);
  if (!f.owns_descriptors) return;
  ::close(f.fd);
  ::close(f.plain_fd);
}

// The bounce for the edges: each is under 4 KiB, so plain memory and a synchronous copy do.
struct Edge {
  alignas(4096) std::byte bytes[8192];
};

}  // namespace

HandleCache& cufile_handles() {
  static HandleCache* cache = new HandleCache({open_registered, close_registered, register_open},
                                              handle_cache_capacity(kHandleCacheWanted));
  return *cache;
}

void cufile_read(const HandleCache::Lease& file, const std::filesystem::path& path,
                 std::uint64_t file_offset, std::uintptr_t device_address, std::uint64_t size,
                 std::uintptr_t registered_base, std::uint64_t max_piece) {
  const auto& lib = shim::CuFileLibrary::get();
  Edge edge;
  for (const SplitPiece& p : split_aligned(file_offset, size, max_piece)) {
    const std::uintptr_t dst = device_address + p.buffer_offset;
    if (p.direct) {
      void* base = reinterpret_cast<void*>(registered_base ? registered_base : dst);
      const off_t at = static_cast<off_t>(registered_base ? dst - registered_base : 0);
      check_cufile_transfer(
          lib.cuFileRead(file.file().handle, base, p.size, static_cast<off_t>(p.file_offset), at),
          p.size, path, "cuFileRead", p.file_offset, false);
    } else {
      const ssize_t n =
          ::pread(file.file().plain_fd, edge.bytes, p.size, static_cast<off_t>(p.file_offset));
      check_cufile_transfer(n, p.size, path, "read", p.file_offset, false);
      FERRY_CU(cuMemcpyHtoDAsync, dst, edge.bytes, p.size, nullptr);
      FERRY_CU(cuStreamSynchronize, nullptr);
    }
  }
}

void cufile_write(const HandleCache::Lease& file, const std::filesystem::path& path,
                  std::uint64_t file_offset, std::uintptr_t device_address, std::uint64_t size,
                  std::uint64_t max_piece) {
  const auto& lib = shim::CuFileLibrary::get();
  Edge edge;
  for (const SplitPiece& p : split_aligned(file_offset, size, max_piece)) {
    const std::uintptr_t src = device_address + p.buffer_offset;
    if (p.direct) {
      check_cufile_transfer(lib.cuFileWrite(file.file().handle, reinterpret_cast<const void*>(src),
                                            p.size, static_cast<off_t>(p.file_offset), 0),
                            p.size, path, "cuFileWrite", p.file_offset, true);
    } else {
      FERRY_CU(cuMemcpyDtoH, edge.bytes, src, p.size);
      // Edges go through the plain descriptor: O_DIRECT refuses unaligned writes. Synced so
      // that later O_DIRECT reads of the same page see them.
      const int plain = file.file().plain_fd;
      const ssize_t n = ::pwrite(plain, edge.bytes, p.size, static_cast<off_t>(p.file_offset));
      check_cufile_transfer(n, p.size, path, "write", p.file_offset, true);
      if (::fdatasync(plain) != 0) FERRY_SYSCALL_FAIL(path.string(), ": fdatasync");
    }
  }
  if (::fdatasync(file.file().fd) != 0) FERRY_SYSCALL_FAIL(path.string(), ": fdatasync");
}

}  // namespace ferry::detail
