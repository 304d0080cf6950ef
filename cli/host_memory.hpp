// This process's resident host memory, from /proc/self/status, to report what a load costs.
#pragma once

#include <cstdint>

namespace ferry::cli {

std::uint64_t resident_bytes();       // VmRSS
std::uint64_t peak_resident_bytes();  // VmHWM
// Resets VmHWM to the current RSS (Linux clear_refs 5); false where that is not allowed.
bool reset_peak_resident();

}  // namespace ferry::cli
