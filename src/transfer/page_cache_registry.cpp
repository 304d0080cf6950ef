#include "transfer/page_cache_registry.hpp"

#include <atomic>
#include <chrono>
#include <exception>

#include "cuda/cuda_resources.hpp"
#include "platform/file_mapping.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry::detail {

// One file's mapping, registered; unregistered before it is unmapped (the member goes after the
// destructor's body), when the registry and every lease have let go.
struct PageCacheRegistry::Registration {
  ReadOnlyMapping mapping;
  FileIdentity identity;
  std::shared_ptr<const PageCacheRegistrar> registrar;
  std::shared_ptr<std::atomic<std::uint64_t>> live_bytes;
  bool registered = false;

  Registration() = default;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() {
    if (registered) registrar->unregister_range(mapping.data());
    live_bytes->fetch_sub(mapping.size());
  }
};

const std::byte* PageCacheRegistry::Lease::data() const noexcept {
  return _registration ? _registration->mapping.data() : nullptr;
}
std::uint64_t PageCacheRegistry::Lease::size() const noexcept {
  return _registration ? _registration->mapping.size() : 0;
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
    if (!(*it)->identity.same_file(now)) continue;
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
  evict_idle_until(now.size, budget_bytes);
  if (_live_bytes->load() + now.size > budget_bytes) {
    got.why_not = "the budget (" + bytes_text(budget_bytes) +
                  ") is held by registrations in use (" + bytes_text(_live_bytes->load()) + ")";
    return got;
  }
  const auto start = std::chrono::steady_clock::now();
  auto r = std::make_shared<Registration>();
  r->identity = now;
  r->registrar = _registrar;
  r->live_bytes = _live_bytes;
  try {
    auto mapped = ReadOnlyMapping::map_resident(file, now.size);
    if (!mapped.mapping) {
      got.why_not = std::move(mapped.refusal);
      return got;
    }
    r->mapping = std::move(mapped.mapping);
    _live_bytes->fetch_add(now.size);
  } catch (...) {
    got.why_not = exception_text(std::current_exception());
    return got;
  }
  try {
    _registrar->register_range(r->mapping.data(), r->mapping.size());
    r->registered = true;
  } catch (...) {
    got.why_not = "the driver refused to register it: " + exception_text(std::current_exception());
    return got;
  }
  // The file must not have changed while it was mapped: the pages registered are its bytes now.
  FileIdentity after;
  try {
    after = file.current_identity();
  } catch (...) {
    got.why_not = exception_text(std::current_exception());
    return got;
  }
  if (!after.same_version(now)) {
    got.why_not = "the file changed while it was being registered";
    return got;
  }
  got.register_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  got.registered_now = true;
  _lru.push_front(r);
  got.lease = Lease(std::move(r));
  return got;
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
