// Facts about this machine: the CUDA driver and GPUs, cuFile's mode, file systems, page cache.
#include <algorithm>

#include "shim/gds_mode.hpp"
#include "shim/dstorage_availability.hpp"
#ifdef _WIN32
#include "backends/dstorage/adapters.hpp"
#include "backends/dstorage/dstorage_bridge.hpp"
#endif
#include "ferry/error.hpp"
#include "ferry/machine.hpp"
#include "ferry/utf8_path.hpp"
#include "platform/file_descriptor.hpp"
#include "io/source_file.hpp"
#include "load/settings.hpp"
#include "platform/file.hpp"
#include "platform/system.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/nccl.hpp"

namespace ferry {
namespace {

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
  const auto& d = shim::CudaDriver::get();
  if (!d.usable) return gpus;
  for (int i = 0; i < d.device_count; ++i) {
    shim::cu::Device dev = 0;
    FERRY_CU(cuDeviceGet, &dev, i);
    GpuInfo g;
    g.index = i;
    char name[256] = {};
    FERRY_CU(cuDeviceGetName, name, sizeof name, dev);
    g.name = name;
    std::size_t memory = 0;
    FERRY_CU(cuDeviceTotalMem, &memory, dev);
    g.memory_bytes = memory;
    FERRY_CU(cuDeviceGetAttribute, &g.pci_bus, shim::cu::kAttributePciBusId, dev);
    gpus.push_back(g);
  }
  return gpus;
}

const char* mode_name(detail::CuFileMode mode) {
  return mode == detail::CuFileMode::Gds      ? "gds"
         : mode == detail::CuFileMode::Compat ? "compat"
                                              : "unavailable";
}

}  // namespace

CudaFacts cuda_facts() {
  const auto& d = shim::CudaDriver::get();
  CudaFacts facts;
  facts.usable = d.usable;
  if (!d.usable) {
    facts.why_unusable = d.why_unusable;
    return facts;
  }
  facts.driver_version = d.driver_version;
  facts.gpus = list_gpus();
  return facts;
}

CufileFacts cufile_facts(const std::filesystem::path& path) {
  const detail::CuFileFacts& f = detail::probe_cufile();
  const detail::CuFileVerdict driver = detail::driver_verdict(f);
  CufileFacts out;
  out.library_loaded = f.library_loaded;
  out.driver_opened = f.driver_opened;
  out.nvidia_fs_loaded = f.nvidia_fs_loaded;
  out.compat_allowed = f.compat_allowed;
  out.compat_forced = f.compat_forced;
  out.version = f.version;
  out.mode = mode_name(driver.mode);
  out.reason = driver.reason;
  if (!path.empty() && driver.mode != detail::CuFileMode::Unavailable) {
    const auto v = detail::file_verdict(f, detail::filesystem_name(path.string()));
    out.path_mode = mode_name(v.mode);
    out.path_reason = v.reason;
  }
  return out;
}

std::uint64_t physical_memory_bytes() { return detail::physical_memory_bytes(); }

DirectStorageFacts directstorage_facts() {
  const auto& a = dstorage::availability();
#ifdef _WIN32
  std::string error;
  const detail::DirectStorageBridge* bridge = detail::directstorage_bridge(0, error);
  return {a.usable, a.reason, dstorage::adapter_for_cuda_device(0),
          bridge ? "ready: " + bridge->adapter : error};
#else
  return {a.usable, a.reason, {}, {}};
#endif
}

NcclFacts nccl_facts() {
  const auto& l = shim::NcclLibrary::get();
  return {l.loaded, l.path, l.why_not_loaded, l.version};
}

std::string filesystem_name(const std::filesystem::path& path) {
  return detail::filesystem_name(utf8_of(path));
}

StorageFacts storage_facts(const std::filesystem::path& path) {
  const std::string utf8 = utf8_of(path);
  return {detail::nvme_verdict(utf8), detail::bypass_io_verdict(utf8)};
}

bool page_cache_residency_measured() { return detail::page_cache_residency_measured(); }

double page_cache_fraction(const std::filesystem::path& file) {
  const auto fd = detail::open_for_reading(file);
  return detail::page_cache_fraction(fd, detail::file_size(fd, file));
}

EngineSettingsReport default_engine_settings() {
  const auto s = detail::choose_settings(LoadOptions{});
  return {s.threads, s.chunk_bytes, s.slots_per_thread, s.source};
}

}  // namespace ferry
