// Facts about this machine that decide how transfers run, and the measurements `ferry doctor`
// takes: GPUs and the driver, cuFile's mode, file systems, page-cache residency, copy and read
// bandwidth. Nothing here changes a setting; loads decide from the same facts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ferry/io_types.hpp"

namespace ferry {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::uint64_t memory_bytes = 0;
  int pci_bus = -1;
};

struct CudaFacts {
  bool usable = false;
  std::string why_unusable;  // empty when usable
  int driver_version = 0;    // as the driver reports it: 13000 for 13.0
  std::vector<GpuInfo> gpus;
};
CudaFacts cuda_facts();

// What cuFile would do here: "gds" (true GPUDirect Storage), "compat" (POSIX reads inside
// cuFile) or "unavailable", and why; for `path`, the verdict on its file system too.
struct CufileFacts {
  bool library_loaded = false;
  bool driver_opened = false;
  bool nvidia_fs_loaded = false;
  bool compat_allowed = false;
  bool compat_forced = false;
  int version = 0;
  std::string mode;
  std::string reason;
  std::string path_mode;  // empty without a path or where cuFile is unavailable
  std::string path_reason;
};
CufileFacts cufile_facts(const std::filesystem::path& path = {});

// Whether DirectStorage (Windows, dstorage.dll) can run in this process, and why not.
struct DirectStorageFacts {
  bool available = false;
  std::string reason;
  // Windows: the D3D12 adapter that is cuda:0, matched by LUID (never the default adapter by
  // chance: a laptop's default is often its integrated GPU), or why none is. Empty elsewhere.
  std::string cuda0_adapter;
  // Windows: whether DirectStorage can read straight into cuda:0 (the D3D12 buffer and fence
  // shared with CUDA), or the step of that bridge which failed and why. Empty elsewhere.
  std::string cuda0_bridge;
};
DirectStorageFacts directstorage_facts();

// This machine's physical memory in bytes.
std::uint64_t physical_memory_bytes();

// NCCL, for loads onto several GPUs from one process: found (where) or not (why), its version.
struct NcclFacts {
  bool loaded = false;
  std::string path;
  std::string why_not_loaded;
  int version = 0;  // 22703 for 2.27.3
};
NcclFacts nccl_facts();

// The file system type of the mount holding `path` ("ext4", "tmpfs", "NTFS", ...).
std::string filesystem_name(const std::filesystem::path& path);

// What the storage under `path` is, as the system reports it; each fact is "<value>: <detail>",
// never a guess. `nvme`: "yes", "no" or "unknown" (whether the disks under its file system are
// NVMe). `bypass_io`: "on", "off" or "unknown" (whether Windows' BypassIO, which DirectStorage
// reads through, is allowed for `path`); empty where the system has no BypassIO (all but Windows).
struct StorageFacts {
  std::string nvme;
  std::string bypass_io;
};
StorageFacts storage_facts(const std::filesystem::path& path);

// Fraction of `file`'s pages in the page cache (sampled on large files, as loads do).
double page_cache_fraction(const std::filesystem::path& file);
// Whether page_cache_fraction measures residency here; Windows cannot report it (it answers 0,
// and `--io auto` reads unbuffered there).
bool page_cache_residency_measured();

// Median GB/s of `repeats` host-to-device copies of `bytes` from pinned and from pageable memory.
struct CopyBandwidth {
  double pinned_gbps = 0;
  double pageable_gbps = 0;
};
CopyBandwidth measure_host_to_device(int device, std::uint64_t bytes, int repeats);

// Whether an aligned unbuffered read of `file` works, and what happened.
struct DirectProbe {
  bool works = false;
  std::string detail;
  std::string flag;  // how the system names unbuffered opens: "O_DIRECT", "FILE_FLAG_NO_BUFFERING"
};
DirectProbe probe_direct(const std::filesystem::path& file);

// GB/s of reading up to `max_bytes` of `files` with `threads` threads in 8 MiB reads.
double measure_read(const std::vector<std::filesystem::path>& files, IoMode mode, unsigned threads,
                    std::uint64_t max_bytes);

// The engine's settings for a load that leaves them to ferry, and where they come from.
struct EngineSettingsReport {
  unsigned reader_threads = 0;
  std::uint64_t chunk_bytes = 0;
  unsigned slots_per_thread = 0;
  std::string source;
};
EngineSettingsReport default_engine_settings();

}  // namespace ferry
