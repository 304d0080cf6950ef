#include "shim/gds_mode.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "shim/cufile.hpp"

namespace ferry::detail {
namespace {

struct FsSupport {
  std::string_view name;
  unsigned flag_bit;  // CUfileDriverStatusFlags bit that must be set in dstatusflags
};

// Local block file systems need NVMe support; the others carry their own bit.
constexpr FsSupport kGdsFileSystems[] = {
    {"ext4", 4}, {"xfs", 4},  {"lustre", 0}, {"wekafs", 1},
    {"nfs", 2},  {"gpfs", 3}, {"beegfs", 9}, {"virtiofs", 13},
};

}  // namespace

CuFileVerdict driver_verdict(const CuFileFacts& f) {
  if (!f.library_loaded) return {CuFileMode::Unavailable, f.problem};
  if (!f.driver_opened) return {CuFileMode::Unavailable, f.problem};
  if (f.compat_forced)
    return {CuFileMode::Compat, "compatibility mode is forced by cuFile's configuration"};
  if (!f.nvidia_fs_loaded || f.nvfs_major == 0)
    return {CuFileMode::Compat,
            "the nvidia-fs kernel driver is not loaded: cuFile can only run in compatibility mode "
            "(POSIX reads through host memory)"};
  return {CuFileMode::Gds, "nvidia-fs " + std::to_string(f.nvfs_major) + "." +
                               std::to_string(f.nvfs_minor) + " is loaded"};
}

CuFileVerdict file_verdict(const CuFileFacts& f, std::string_view filesystem) {
  CuFileVerdict driver = driver_verdict(f);
  if (driver.mode != CuFileMode::Gds) return driver;
  for (const auto& fs : kGdsFileSystems)
    if (fs.name == filesystem) {
      if (f.dstatusflags & (1u << fs.flag_bit))
        return {CuFileMode::Gds, std::string(filesystem) + " supports GPUDirect Storage here"};
      return {CuFileMode::Compat, "nvidia-fs reports no GPUDirect Storage support for " +
                                      std::string(filesystem) + " on this machine"};
    }
  return {CuFileMode::Compat, std::string("file system ") + std::string(filesystem) +
                                  " does not support GPUDirect Storage"};
}

const CuFileFacts& probe_cufile() {
  static const CuFileFacts facts = [] {
    CuFileFacts f;
    const auto& lib = shim::CuFileLibrary::get();
    f.library_loaded = lib.loaded;
    if (!lib.loaded) {
      f.problem = lib.why_not_loaded;
      return f;
    }
    if (!shim::CudaDriver::get().usable) {
      f.problem = "no usable CUDA device: " + shim::CudaDriver::get().why_unusable;
      return f;
    }
    lib.cuFileGetVersion(&f.version);
    f.nvidia_fs_loaded = nvidia_fs_present();
    bool flag = false;
    if (lib.cuFileGetParameterBool(shim::cufile::kParamAllowCompatMode, &flag).err == 0)
      f.compat_allowed = flag;
    flag = false;
    if (lib.cuFileGetParameterBool(shim::cufile::kParamForceCompatMode, &flag).err == 0)
      f.compat_forced = flag;
    const shim::cufile::Error opened = lib.cuFileDriverOpen();
    f.driver_opened = opened.err == shim::cufile::kSuccess;
    if (!f.driver_opened) {
      f.problem = "cuFileDriverOpen failed: " + shim::cufile_error_text(opened);
      return f;
    }
    shim::cufile::DriverProperties props{};
    if (lib.cuFileDriverGetProperties(&props).err == 0) {
      f.nvfs_major = props.nvfs.major_version;
      f.nvfs_minor = props.nvfs.minor_version;
      f.dstatusflags = props.nvfs.dstatusflags;
      f.max_pinned_bytes = std::uint64_t{props.max_device_pinned_mem_size} * 1024;
    }
    return f;
  }();
  return facts;
}

bool nvidia_fs_present() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia-fs/version", ec);
}

}  // namespace ferry::detail
