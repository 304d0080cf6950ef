// Open, registered files kept for reuse: cuFile handle registration costs far more than a read,
// so each file is registered once. An entry is either a path the cache opens itself (O_DIRECT),
// or an open file of a file set, keyed by its identity (device, inode) and access rather than
// its path: a path renamed over names a different entry, and the file set's descriptor is
// registered (the entry holds the open file, so the file set never closes it under the
// handle). Entries are reference counted while leased; when the cache is full the least
// recently used idle entry is closed, never one in use. The capacity never exceeds a quarter
// of RLIMIT_NOFILE, leaving descriptors for everything else.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ferry::detail {

struct OpenedFile {
  int fd = -1;                   // registered with cuFile; O_DIRECT where the file system allows it
  int plain_fd = -1;             // buffered, for the unaligned edges O_DIRECT refuses
  void* handle = nullptr;        // the cuFile handle (opaque here)
  bool owns_descriptors = true;  // false: a file set's, closed by it, not by `close`
};

class PlatformFile;

// How entries are made and unmade: the real ones register with cuFile, tests count calls.
struct FileRegistrar {
  std::function<OpenedFile(const std::filesystem::path&, bool writable)> open;
  std::function<void(const OpenedFile&)> close;
  // Registers a file set's open file (its descriptors stay the file set's).
  std::function<OpenedFile(const PlatformFile&)> register_open = nullptr;
};

class HandleCache {
  struct Entry {
    std::string key;
    OpenedFile file;
    std::shared_ptr<const PlatformFile> held;  // a file set's open file, kept open
    std::size_t leases = 0;
  };

 public:
  // Holds an entry open; the entry becomes idle (and evictable) when the last lease goes.
  class Lease {
   public:
    Lease(HandleCache* cache, std::shared_ptr<Entry> entry)
        : _cache(cache), _entry(std::move(entry)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease(Lease&& other) noexcept = default;
    ~Lease();
    const OpenedFile& file() const { return _entry->file; }

   private:
    HandleCache* _cache;
    std::shared_ptr<Entry> _entry;
  };

  HandleCache(FileRegistrar registrar, std::size_t capacity);
  HandleCache(const HandleCache&) = delete;
  HandleCache& operator=(const HandleCache&) = delete;
  ~HandleCache();

  Lease acquire(const std::filesystem::path& path, bool writable = false);
  // The entry of a file set's open file (FileSet::acquire), by identity and access.
  Lease acquire(std::shared_ptr<const PlatformFile> file);
  std::size_t size() const;
  std::size_t capacity() const noexcept { return _capacity; }

 private:
  void release(const std::shared_ptr<Entry>& entry);
  // The entry under `key`, made by `make` where there is none; called with _mutex held.
  template <class Make>
  Lease acquire_locked(const std::string& key, Make&& make);
  void evict_idle_over_capacity();  // called with _mutex held

  FileRegistrar _registrar;
  std::size_t _capacity;
  mutable std::mutex _mutex;
  std::list<std::shared_ptr<Entry>> _lru;  // most recently used first
  std::unordered_map<std::string, std::list<std::shared_ptr<Entry>>::iterator> _by_key;
};

// min(wanted, RLIMIT_NOFILE / 4), at least 1.
std::size_t handle_cache_capacity(std::size_t wanted);

}  // namespace ferry::detail
