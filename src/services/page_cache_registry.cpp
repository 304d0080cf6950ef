#include "services/page_cache_registry.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "platform/file_mapping.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry::detail {

namespace {

// Set once a registration is unregistered and unmapped, for release_range(wait) to wait on.
struct Gone {
  std::mutex mutex;
  std::condition_variable changed;
  bool gone = false;
  void wait() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [this] { return gone; });
  }
};

}  // namespace

// One file's (or window's) mapping, registered; unregistered, then unmapped, when the registry
// and every lease have let go.
struct PageCacheRegistry::Registration {
  ReadOnlyMapping mapping;
  FileIdentity identity;
  std::uint64_t offset = 0;  // of the window in the file (0 for a whole file)
  bool window = false;
  const std::byte* view = nullptr;  // the registrar's view of the bytes, where it has one
  std::shared_ptr<const PageCacheRegistrar> registrar;
  std::shared_ptr<std::atomic<std::uint64_t>> live_bytes;
  std::shared_ptr<Gone> gone = std::make_shared<Gone>();
  bool registered = false;

  Registration() = default;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() {
    if (registered) registrar->unregister_range(mapping.data());
    live_bytes->fetch_sub(mapping.size());
    mapping = ReadOnlyMapping();  // unmapped before anyone is told it is gone
    {
      std::lock_guard lock(gone->mutex);
      gone->gone = true;
    }
    gone->changed.notify_all();
  }
  bool overlaps(const FileIdentity& file, std::uint64_t from, std::uint64_t size) const {
    return window && identity.same_file(file) && from < offset + mapping.size() &&
           offset < from + size;
  }
};

const std::byte* PageCacheRegistry::Lease::data() const noexcept {
  if (!_registration) return nullptr;
  return _registration->view ? _registration->view : _registration->mapping.data();
}
std::uint64_t PageCacheRegistry::Lease::size() const noexcept {
  return _registration ? _registration->mapping.size() : 0;
}
std::uint64_t PageCacheRegistry::Lease::offset() const noexcept {
  return _registration ? _registration->offset : 0;
}
const FileIdentity& PageCacheRegistry::Lease::identity() const noexcept {
  static const FileIdentity none;
  return _registration ? _registration->identity : none;
}

namespace {

std::string exception_text(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown error";
  }
}

// Bytes in words for verdicts: "1234567 bytes".
std::string bytes_text(std::uint64_t n) { return std::to_string(n) + " bytes"; }

std::atomic<PageCacheRegistry*> g_scoped{nullptr};

}  // namespace

PageCacheRegistrar cuda_page_cache_registrar() {
  PageCacheRegistrar r;
  r.name = "cuda";
  r.serves = [](const Device& device) { return device.is_cuda(); };
  r.register_range = [](const std::byte* data, std::uint64_t size) {
    RelaxedCaptureMode relaxed;  // a caller's graph capture on another thread is not disturbed
    device_context(0).make_current();
    FERRY_CU(cuMemHostRegister, const_cast<std::byte*>(data), size,
             shim::cu::kMemHostRegisterPortable | shim::cu::kMemHostRegisterReadOnly);
  };
  r.unregister_range = [](const std::byte* data) {
    try {
      RelaxedCaptureMode relaxed;
      device_context(0).make_current();
      shim::CudaDriver::get().cuMemHostUnregister(const_cast<std::byte*>(data));
    } catch (...) {
      // No context to unregister in: the driver went first; the unmap releases the pages.
    }
  };
  return r;
}

PageCacheRegistry::PageCacheRegistry(PageCacheRegistrar registrar)
    : _registrar(std::make_shared<const PageCacheRegistrar>(std::move(registrar))),
      _live_bytes(std::make_shared<std::atomic<std::uint64_t>>(0)) {}

PageCacheRegistry::~PageCacheRegistry() = default;

std::uint64_t PageCacheRegistry::registered_bytes() const { return _live_bytes->load(); }

std::size_t PageCacheRegistry::registrations() const {
  std::lock_guard lock(_mutex);
  return _lru.size();
}

void PageCacheRegistry::release_idle() {
  std::lock_guard lock(_mutex);
  _lru.remove_if([](const auto& r) { return r.use_count() == 1; });
}

void PageCacheRegistry::evict_idle_until(std::uint64_t fits, std::uint64_t budget_bytes) {
  // Only the list holds an idle registration (a lease is made under the lock, from the list).
  for (auto it = _lru.end(); it != _lru.begin() && _live_bytes->load() + fits > budget_bytes;) {
    --it;
    if (it->use_count() == 1) it = _lru.erase(it);
  }
}

PageCacheRegistry::Acquired PageCacheRegistry::acquire(const PlatformFile& file,
                                                       std::uint64_t budget_bytes) {
  Acquired got;
  FileIdentity now;
  try {
    now = file.current_identity();
  } catch (...) {
    got.why_not = exception_text(std::current_exception());
    return got;
  }
  std::lock_guard lock(_mutex);
  for (auto it = _lru.begin(); it != _lru.end(); ++it) {
    if ((*it)->window || !(*it)->identity.same_file(now)) continue;
    if ((*it)->identity.same_version(now)) {
      _lru.splice(_lru.begin(), _lru, it);
      got.lease = Lease(*it);
      return got;
    }
    _lru.erase(it);  // changed since registered: its leases keep the old pages until they go
    break;
  }
  if (!file_mapping_supported()) {
    got.why_not = "not supported on this platform";
    return got;
  }
  if (now.size > budget_bytes) {
    got.why_not = "the file (" + bytes_text(now.size) + ") is larger than the budget (" +
                  bytes_text(budget_bytes) + ")";
    return got;
  }
  register_locked(file, now, 0, now.size, false, budget_bytes, got);
  if (!got.lease) return got;
  // The file must not have changed while it was mapped: the pages registered are its bytes now.
  FileIdentity after;
  try {
    after = file.current_identity();
  } catch (...) {
    got = {{}, exception_text(std::current_exception())};
    _lru.pop_front();
    return got;
  }
  if (!after.same_version(now)) {
    got = {{}, "the file changed while it was being registered"};
    _lru.pop_front();
  }
  return got;
}

bool PageCacheRegistry::find_window_locked(const FileIdentity& file, std::uint64_t offset,
                                           std::uint64_t size, Acquired& got) {
  for (auto it = _lru.begin(); it != _lru.end(); ++it) {
    const Registration& r = **it;
    if (r.window && r.identity.same_file(file) && r.offset == offset && r.mapping.size() == size) {
      _lru.splice(_lru.begin(), _lru, it);
      got.lease = Lease(*it);
      return true;
    }
  }
  return false;
}

PageCacheRegistry::Acquired PageCacheRegistry::find_window(const PlatformFile& file,
                                                           std::uint64_t offset,
                                                           std::uint64_t size) {
  Acquired got;
  std::lock_guard lock(_mutex);
  if (!find_window_locked(file.identity(), offset, size, got)) got.why_not = "not registered";
  return got;
}

PageCacheRegistry::Acquired PageCacheRegistry::acquire_window(const PlatformFile& file,
                                                              std::uint64_t offset,
                                                              std::uint64_t size,
                                                              std::uint64_t budget_bytes) {
  Acquired got;
  const FileIdentity& id = file.identity();
  {
    std::lock_guard lock(_mutex);
    if (find_window_locked(id, offset, size, got)) return got;
  }
  if (!file_mapping_supported()) {
    got.why_not = "not supported on this platform";
    return got;
  }
  if (size > budget_bytes) {
    got.why_not = "the window (" + bytes_text(size) + ") is larger than the budget (" +
                  bytes_text(budget_bytes) + ")";
    return got;
  }
  // Mapping (populating its page tables) and registering take milliseconds a window: outside
  // the lock, so that leases of other windows and files are handed out meanwhile.
  const auto start = std::chrono::steady_clock::now();
  ReadOnlyMapping mapping = map_resident(file, offset, size, got);
  if (!mapping) return got;
  std::shared_ptr<Registration> r;
  {
    std::lock_guard lock(_mutex);
    r = reserve(id, offset, true, std::move(mapping), budget_bytes, got);
  }
  if (!r || !register_range(*r, got)) return got;  // r gives its bytes back as it goes
  {
    std::lock_guard lock(_mutex);
    // Another acquirer registered it meanwhile (two stores over one slab): theirs is kept, this
    // one goes (unregistered as r does).
    if (find_window_locked(id, offset, size, got)) return got;
    _lru.push_front(r);
  }
  kept(std::move(r), start, got);
  return got;
}

std::size_t PageCacheRegistry::release_range(const FileIdentity& file, std::uint64_t offset,
                                             std::uint64_t size, bool wait) {
  std::vector<std::shared_ptr<Gone>> leased;
  std::size_t dropped = 0;
  {
    std::lock_guard lock(_mutex);
    for (auto it = _lru.begin(); it != _lru.end();) {
      if (!(*it)->overlaps(file, offset, size)) {
        ++it;
        continue;
      }
      if (it->use_count() > 1) leased.push_back((*it)->gone);
      it = _lru.erase(it);  // idle: unregistered here; leased: when its last lease goes
      ++dropped;
    }
  }
  if (wait)
    for (const auto& g : leased) g->wait();
  return dropped;
}

ReadOnlyMapping PageCacheRegistry::map_resident(const PlatformFile& file, std::uint64_t offset,
                                                std::uint64_t size, Acquired& got) {
  ReadOnlyMapping::Result mapped;
  try {
    mapped = ReadOnlyMapping::map_resident(file, offset, size);
  } catch (...) {
    got.why_not = exception_text(std::current_exception());
    return {};
  }
  if (!mapped.mapping) got.why_not = std::move(mapped.refusal);
  return std::move(mapped.mapping);
}

std::shared_ptr<PageCacheRegistry::Registration> PageCacheRegistry::reserve(
    const FileIdentity& now, std::uint64_t offset, bool window, ReadOnlyMapping mapping,
    std::uint64_t budget_bytes, Acquired& got) {
  const std::uint64_t size = mapping.size();
  // Only a range found resident makes room: a get of one that is not flushes nothing.
  evict_idle_until(size, budget_bytes);
  if (_live_bytes->load() + size > budget_bytes) {
    got.why_not = "the budget (" + bytes_text(budget_bytes) +
                  ") is held by registrations in use (" + bytes_text(_live_bytes->load()) + ")";
    return nullptr;
  }
  auto r = std::make_shared<Registration>();
  r->identity = now;
  r->offset = offset;
  r->window = window;
  r->registrar = _registrar;
  r->live_bytes = _live_bytes;
  r->mapping = std::move(mapping);
  _live_bytes->fetch_add(size);
  return r;
}

bool PageCacheRegistry::register_range(Registration& r, Acquired& got) {
  try {
    _registrar->register_range(r.mapping.data(), r.mapping.size());
    r.registered = true;
  } catch (...) {
    got.why_not = "the driver refused to register it: " + exception_text(std::current_exception());
    return false;
  }
  if (_registrar->view) r.view = _registrar->view(r.mapping.data(), r.mapping.size());
  return true;
}

void PageCacheRegistry::kept(std::shared_ptr<Registration> r,
                             std::chrono::steady_clock::time_point start, Acquired& got) {
  got.register_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  got.registered_now = true;
  got.lease = Lease(std::move(r));
}

void PageCacheRegistry::register_locked(const PlatformFile& file, const FileIdentity& now,
                                        std::uint64_t offset, std::uint64_t size, bool window,
                                        std::uint64_t budget_bytes, Acquired& got) {
  const auto start = std::chrono::steady_clock::now();
  ReadOnlyMapping mapping = map_resident(file, offset, size, got);
  if (!mapping) return;
  std::shared_ptr<Registration> r =
      reserve(now, offset, window, std::move(mapping), budget_bytes, got);
  if (!r || !register_range(*r, got)) return;
  _lru.push_front(r);
  kept(std::move(r), start, got);
}

PageCacheRegistry& page_cache_registry() {
  if (PageCacheRegistry* scoped = g_scoped.load(std::memory_order_acquire)) return *scoped;
  static PageCacheRegistry* process = new PageCacheRegistry(cuda_page_cache_registrar());
  return *process;
}

ScopedPageCacheRegistry::ScopedPageCacheRegistry(PageCacheRegistrar registrar)
    : _registry(std::make_unique<PageCacheRegistry>(std::move(registrar))),
      _previous(g_scoped.exchange(_registry.get())) {}

ScopedPageCacheRegistry::~ScopedPageCacheRegistry() { g_scoped.store(_previous); }

}  // namespace ferry::detail
