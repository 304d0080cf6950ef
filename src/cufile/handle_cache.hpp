// Open, registered files kept for reuse: cuFile handle registration costs far more than a read,
// so each file is opened (O_DIRECT) and registered once. Entries are reference counted while
// leased; when the cache is full the least recently used idle entry is closed. The capacity
// never exceeds a quarter of RLIMIT_NOFILE, leaving descriptors for everything else.
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
  int fd = -1;             // registered with cuFile; O_DIRECT where the file system allows it
  int plain_fd = -1;       // buffered, for the unaligned edges O_DIRECT refuses
  void* handle = nullptr;  // the cuFile handle (opaque here)
};

// How entries are made and unmade: the real ones register with cuFile, tests count calls.
struct FileRegistrar {
  std::function<OpenedFile(const std::filesystem::path&, bool writable)> open;
  std::function<void(const OpenedFile&)> close;
};

class HandleCache {
  struct Entry {
    std::filesystem::path path;
    bool writable = false;
    OpenedFile file;
    std::size_t leases = 0;
  };

 public:
  // Holds an entry open; the entry becomes idle (and evictable) when the last lease goes.
  class Lease {
   public:
    Lease(HandleCache* cache, std::shared_ptr<Entry> entry) : _cache(cache), _entry(std::move(entry)) {}
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
  std::size_t size() const;
  std::size_t capacity() const noexcept { return _capacity; }

 private:
  void release(const std::shared_ptr<Entry>& entry);
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
