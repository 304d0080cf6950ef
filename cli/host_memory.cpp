#include "host_memory.hpp"

#include <fstream>
#include <string>

namespace ferry::cli {
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

}  // namespace ferry::cli
