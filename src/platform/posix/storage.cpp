// The Linux implementation of platform/system.hpp's storage facts: the block device under a file
// system, from sysfs. BypassIO is a Windows feature: nothing to report here.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "platform/system.hpp"

namespace ferry::detail {

std::string nvme_verdict(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return "unknown: stat(" + path + ") failed: " + std::strerror(errno);
  const std::string device =
      std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  // Major 0: tmpfs, overlayfs, NFS, FUSE... no one block device to ask.
  if (major(st.st_dev) == 0)
    return "unknown: " + path + " is on a file system with no block device of its own (device " +
           device + ")";
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path node = fs::canonical("/sys/dev/block/" + device, ec);
  if (ec) return "unknown: /sys/dev/block/" + device + ": " + ec.message();
  // A partition's disk is its parent in sysfs.
  const fs::path disk = fs::exists(node / "partition", ec) ? node.parent_path() : node;
  const std::string name = disk.filename().string();
  if (name.rfind("nvme", 0) == 0) return "yes: " + path + " is on /dev/" + node.filename().string();
  if (name.rfind("dm-", 0) == 0 || name.rfind("md", 0) == 0)
    return "unknown: " + path + " is on /dev/" + name +
           ", a device-mapper or software RAID device whose disks are not inspected";
  return "no: " + path + " is on /dev/" + node.filename().string() + " (" + disk.string() + ")";
}

std::string bypass_io_verdict(const std::string&) { return {}; }

}  // namespace ferry::detail
