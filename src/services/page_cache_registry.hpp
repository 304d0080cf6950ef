// Page-cache DMA: a file fully in the page cache, mapped read-only and registered with the GPU
// driver (cuMemHostRegister, READ_ONLY | PORTABLE), is copied to any GPU straight from the page
// cache's own pages: no read, no staging memcpy (the staged path's bound is host memory
// bandwidth). Registering costs about as much as the copy it saves (a 1.2 GB file: ~60 ms
// populate + ~60 ms register, and it does not scale with threads), so registrations are kept
// across loads in one process-wide cache, keyed by the file's identity (device, inode, size,
// mtime, ctime) and checked against fstat on every acquire: a changed file drops its
// registration and is registered afresh, never served stale. Beyond a caller's byte budget the
// least recently used registrations no lease holds are unregistered (then unmapped).
//
// Windows: the KV store's slabs are large and change with every put, so it registers file-aligned
// windows of them instead (acquire_window), kept coherent by their user: release_range before
// writing into one, and every byte copied out verified against a checksum afterwards.
//
// Usage (the staged backend; multi-GPU fan-out):
//   auto got = page_cache_registry().acquire(open_file, budget_bytes);
//   if (!got.lease) -> take the staged path; got.why_not says why (for the statistics)
//   else copy [offset, offset + n) from got.lease.data() + offset (n within got.lease.size())
//        with cuMemcpyHtoDAsync on any device; keep the lease until those copies are done.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "ferry/device.hpp"
#include "platform/file.hpp"
#include "platform/file_mapping.hpp"

namespace ferry::detail {

// How a mapping becomes readable by a device's DMA and stops being: the CUDA driver's read-only
// host registration in the process (cuda_page_cache_registrar), host stand-ins in tests.
struct PageCacheRegistrar {
  std::string name;  // for the statistics: "cuda", "host stand-in"
  // Whether copies into memory on `device` can use a registration.
  std::function<bool(const Device& device)> serves;
  // Registers [data, data + size); throws where the driver refuses (the message says why).
  std::function<void(const std::byte* data, std::uint64_t size)> register_range;
  // Undoes register_range; must not throw.
  std::function<void(const std::byte* data)> unregister_range;
  // Optional: where copies read a registered range's bytes (null: the mapping itself). Tests'
  // stand-ins return a copy taken at registration, as the pages a registration pins keep their
  // bytes when a write goes around the page cache (O_DIRECT); unregister_range frees it.
  std::function<const std::byte*(const std::byte* data, std::uint64_t size)> view;
};

// The CUDA driver's: serves cuda:N; registers with CU_MEMHOSTREGISTER_READ_ONLY | PORTABLE in
// the primary context of the first device (portable: every device's copies may use it).
PageCacheRegistrar cuda_page_cache_registrar();

class PageCacheRegistry {
 private:
  struct Registration;

 public:
  // Holds one registration registered and mapped: the bytes stay valid (and pinned) until the
  // last lease of it goes, even if the file changes or the registry evicts it meanwhile.
  // Move-only; cheap to copy through share().
  class Lease {
   public:
    Lease() = default;
    const std::byte* data() const noexcept;
    std::uint64_t size() const noexcept;    // the file's size when registered (or the window's)
    std::uint64_t offset() const noexcept;  // where data() sits in the file (0 but for windows)
    const FileIdentity& identity() const noexcept;
    explicit operator bool() const noexcept { return _registration != nullptr; }
    Lease share() const { return Lease(_registration); }

   private:
    friend class PageCacheRegistry;
    explicit Lease(std::shared_ptr<const Registration> r) : _registration(std::move(r)) {}
    std::shared_ptr<const Registration> _registration;
  };

  struct Acquired {
    Lease lease;                  // empty where the file takes the staged path
    std::string why_not;          // then: why, in words ("not fully in the page cache (83%)...")
    bool registered_now = false;  // this call mapped and registered it (else reused)
    double register_seconds = 0;  // mapping, populating and registering, where registered_now
  };

  explicit PageCacheRegistry(PageCacheRegistrar registrar);
  PageCacheRegistry(const PageCacheRegistry&) = delete;
  PageCacheRegistry& operator=(const PageCacheRegistry&) = delete;
  // Drops every registration; those a lease still holds go when their last lease does.
  ~PageCacheRegistry();

  // Whether registrations serve copies into memory on `device` (cuda:N for the CUDA driver's).
  bool serves(const Device& device) const { return _registrar->serves(device); }
  const std::string& registrar_name() const noexcept { return _registrar->name; }

  // A lease on the registered read-only mapping of `file` as it is now (fstat), registering it
  // (after evicting idle registrations, least recently used first) where none matches. Refuses,
  // saying why, where the file is not fully in the page cache, is larger than `budget_bytes`,
  // does not fit beside the registrations leases hold, mapping is not supported on this
  // platform, or the driver refuses. Thread-safe; registering runs under the registry's lock (a
  // second acquirer of the same file waits and reuses it).
  Acquired acquire(const PlatformFile& file, std::uint64_t budget_bytes);

  // A lease on the registered mapping of the window [offset, offset + size) of `file`, made
  // (evicting as acquire() does) where none is kept; refusals as acquire()'s, for the window.
  // Windows and whole-file registrations never match each other. Unlike acquire(), the file's
  // version is not checked (each write to it moves it): the caller keeps its windows coherent
  // with release_range() before writing into them, and verifies the bytes it copies out.
  // Registering runs outside the registry's lock (leases of others are handed out meanwhile),
  // so the caller also keeps a window's registration apart from its release_range() and from
  // another registration of the same window.
  Acquired acquire_window(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
                          std::uint64_t budget_bytes);
  // The lease of a window kept registered, or none ("not registered"): never registers.
  Acquired find_window(const PlatformFile& file, std::uint64_t offset, std::uint64_t size);
  // Stops serving the windows of `file` (its device and inode) that overlap [offset, offset +
  // size): none is leased again; each is unregistered now or, where a lease holds it, when its
  // last lease goes. With `wait`, returns only once every one of them is unregistered and
  // unmapped (a writer about to replace their pages: an O_DIRECT write cannot drop pages a
  // registration pins); never wait while holding a lease of one. Returns how many it dropped.
  std::size_t release_range(const FileIdentity& file, std::uint64_t offset, std::uint64_t size,
                            bool wait);

  // Bytes registered now (leased, idle, or evicted and still leased), and registrations kept.
  std::uint64_t registered_bytes() const;
  std::size_t registrations() const;
  // Unregisters and unmaps every registration no lease holds (engine shutdown, tests).
  void release_idle();

 private:
  void evict_idle_until(std::uint64_t fits, std::uint64_t budget_bytes);
  // Maps, registers and keeps [offset, offset + size) of `file` (identity `now`) within the
  // budget, under _mutex; `got` says what came of it.
  void register_locked(const PlatformFile& file, const FileIdentity& now, std::uint64_t offset,
                       std::uint64_t size, bool window, std::uint64_t budget_bytes,
                       Acquired& got);
  // register_locked's steps, each saying in `got` why where it fails: the range mapped where
  // resident; its bytes counted within the budget (under _mutex); registered with the driver;
  // its lease handed out.
  static ReadOnlyMapping map_resident(const PlatformFile& file, std::uint64_t offset,
                                      std::uint64_t size, Acquired& got);
  std::shared_ptr<Registration> reserve(const FileIdentity& now, std::uint64_t offset,
                                        bool window, ReadOnlyMapping mapping,
                                        std::uint64_t budget_bytes, Acquired& got);
  bool register_range(Registration& r, Acquired& got);
  static void kept(std::shared_ptr<Registration> r, std::chrono::steady_clock::time_point start,
                   Acquired& got);
  // Under _mutex: the kept registration of the window, as a lease in `got`.
  bool find_window_locked(const FileIdentity& file, std::uint64_t offset, std::uint64_t size,
                          Acquired& got);

  std::shared_ptr<const PageCacheRegistrar> _registrar;
  // Registrations alive, evicted or not; each subtracts its own when it goes.
  std::shared_ptr<std::atomic<std::uint64_t>> _live_bytes;
  mutable std::mutex _mutex;                            // guards _lru
  std::list<std::shared_ptr<const Registration>> _lru;  // most recently used first
};

// The process's registry (the CUDA driver's registrar). Made at first use and leaked on purpose:
// no CUDA call from a static destructor; the kernel unpins and unmaps at exit.
// release_page_cache_registrations() (ferry/transfer.hpp) releases its idle ones earlier.
PageCacheRegistry& page_cache_registry();

// Tests: the process's registry is a fresh one over `registrar` for this object's life.
class ScopedPageCacheRegistry {
 public:
  explicit ScopedPageCacheRegistry(PageCacheRegistrar registrar);
  ScopedPageCacheRegistry(const ScopedPageCacheRegistry&) = delete;
  ScopedPageCacheRegistry& operator=(const ScopedPageCacheRegistry&) = delete;
  ~ScopedPageCacheRegistry();
  PageCacheRegistry& registry() noexcept { return *_registry; }

 private:
  std::unique_ptr<PageCacheRegistry> _registry;
  PageCacheRegistry* _previous;
};

}  // namespace ferry::detail
