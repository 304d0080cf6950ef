#include "backends/cufile/handle_cache.hpp"

#include <sys/resource.h>

#include <algorithm>

#include "ferry/error.hpp"
#include "platform/file.hpp"

namespace ferry::detail {
namespace {

std::string key_of(const std::filesystem::path& path, bool writable) {
  return (writable ? "w:" : "r:") + path.lexically_normal().string();
}

}  // namespace

HandleCache::Lease::~Lease() {
  if (_entry) _cache->release(_entry);
}

HandleCache::HandleCache(FileRegistrar registrar, std::size_t capacity)
    : _registrar(std::move(registrar)), _capacity(std::max<std::size_t>(1, capacity)) {}

HandleCache::~HandleCache() {
  for (const auto& e : _lru) _registrar.close(e->file);
}

template <class Make>
HandleCache::Lease HandleCache::acquire_locked(const std::string& key, Make&& make) {
  if (auto it = _by_key.find(key); it != _by_key.end()) {
    _lru.splice(_lru.begin(), _lru, it->second);  // now the most recently used
    ++(*it->second)->leases;
    return Lease(this, *it->second);
  }
  auto entry = std::make_shared<Entry>();
  entry->key = key;
  make(*entry);  // throws: nothing was added
  entry->leases = 1;
  _lru.push_front(entry);
  _by_key[key] = _lru.begin();
  evict_idle_over_capacity();
  return Lease(this, entry);
}

HandleCache::Lease HandleCache::acquire(const std::filesystem::path& path, bool writable) {
  std::lock_guard lock(_mutex);
  return acquire_locked(key_of(path, writable),
                        [&](Entry& e) { e.file = _registrar.open(path, writable); });
}

HandleCache::Lease HandleCache::acquire(std::shared_ptr<const PlatformFile> file) {
  FERRY_EXPECT(_registrar.register_open != nullptr, std::logic_error,
               "this handle cache registers paths only");
  const FileIdentity& id = file->identity();
  const std::string key = (file->access() == FileAccess::ReadWrite ? "w@" : "r@") +
                          std::to_string(id.device) + ":" + std::to_string(id.inode);
  std::lock_guard lock(_mutex);
  return acquire_locked(key, [&](Entry& e) {
    e.file = _registrar.register_open(*file);
    e.held = std::move(file);
  });
}

void HandleCache::release(const std::shared_ptr<Entry>& entry) {
  std::lock_guard lock(_mutex);
  --entry->leases;
  evict_idle_over_capacity();
}

void HandleCache::evict_idle_over_capacity() {
  // Leased entries are never closed; the cache may exceed its capacity while they are all busy.
  for (auto it = _lru.end(); _lru.size() > _capacity && it != _lru.begin();) {
    --it;
    if ((*it)->leases != 0) continue;
    _registrar.close((*it)->file);
    _by_key.erase((*it)->key);
    it = _lru.erase(it);
  }
}

std::size_t HandleCache::size() const {
  std::lock_guard lock(_mutex);
  return _lru.size();
}

std::size_t handle_cache_capacity(std::size_t wanted) {
  struct rlimit limit {};
  std::size_t cap = wanted;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    cap = std::min<std::size_t>(cap, limit.rlim_cur / 4);
  return std::max<std::size_t>(1, cap);
}

}  // namespace ferry::detail
