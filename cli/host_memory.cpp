#include "host_memory.hpp"

#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// windows.h first: psapi.h needs its types.
#include <psapi.h>
#else
#include <fstream>
#include <string>
#endif

namespace ferry::cli {
#ifdef _WIN32

namespace {
PROCESS_MEMORY_COUNTERS counters() {
  PROCESS_MEMORY_COUNTERS c{};
  c.cb = sizeof c;
  if (!::GetProcessMemoryInfo(::GetCurrentProcess(), &c, sizeof c)) c = {};
  return c;
}
}  // namespace

std::uint64_t resident_bytes() { return counters().WorkingSetSize; }
std::uint64_t peak_resident_bytes() { return counters().PeakWorkingSetSize; }
// Windows cannot reset the peak working set: the peak since the process started is reported.
bool reset_peak_resident() { return false; }

#else
namespace {

std::uint64_t status_field_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == field + ":") {
      std::uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    std::getline(status, key);
  }
  return 0;
}

}  // namespace

std::uint64_t resident_bytes() { return status_field_bytes("VmRSS"); }
std::uint64_t peak_resident_bytes() { return status_field_bytes("VmHWM"); }

bool reset_peak_resident() {
  std::ofstream refs("/proc/self/clear_refs");
  refs << "5";
  return static_cast<bool>(refs.flush());
}

#endif

}  // namespace ferry::cli
