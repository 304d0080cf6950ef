// What `ferry kv bench` measures beside the store in the same run: the device's pinned copies,
// the GPU checksum's rate, and how much of the slabs the page cache holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace ferry::kv_bench {

// Median GB/s of copying `bytes` (at least 256 MiB) between pinned host memory and GPU `ordinal`,
// device to host first, then host to device.
std::pair<double, double> pinned_copies(int ordinal, std::uint64_t bytes);

// Median GB/s of the GPU checksum over `batch` blocks of `block` bytes in device memory, after
// checking its digests against the host's on the same bytes; 0 and the reason where it cannot run.
std::pair<double, std::string> gpu_checksum_rate(int ordinal, std::uint64_t block,
                                                 std::uint64_t batch);

// The share of the files' bytes in the page cache, probed in 64 MiB windows (a window counts
// when wholly resident).
double resident_share(const std::vector<std::filesystem::path>& files);

}  // namespace ferry::kv_bench
