// Measurements `ferry doctor` takes of this machine: GPUs, copy bandwidth, file systems, reads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ferry/load_options.hpp"

namespace ferry::cli {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::uint64_t memory_bytes = 0;
  int pci_bus = -1;
};

std::vector<GpuInfo> list_gpus();

// Median GB/s of `repeats` host-to-device copies of `bytes` from pinned and from pageable memory.
struct CopyBandwidth {
  double pinned_gbps = 0;
  double pageable_gbps = 0;
};
CopyBandwidth measure_host_to_device(int device, std::uint64_t bytes, int repeats);

// Whether an aligned O_DIRECT read of `file` works, and what happened.
struct DirectProbe {
  bool works = false;
  std::string detail;
};
DirectProbe probe_direct(const std::filesystem::path& file);

// GB/s of reading up to `max_bytes` of `files` with `threads` threads in 8 MiB reads.
double measure_read(const std::vector<std::filesystem::path>& files, IoMode mode, unsigned threads,
                    std::uint64_t max_bytes);

}  // namespace ferry::cli
