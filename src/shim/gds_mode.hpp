// What cuFile will really do on this machine and for each file: true GPUDirect Storage DMA,
// or compatibility mode (POSIX reads through host memory inside cuFile). Decided from facts
// gathered once (probe_cufile) by pure functions, so the logic is tested with faked facts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::detail {

struct CuFileFacts {
  bool library_loaded = false;
  bool driver_opened = false;
  std::string problem;             // why the library or the driver is unusable
  bool nvidia_fs_loaded = false;   // the kernel module (/proc/driver/nvidia-fs)
  unsigned nvfs_major = 0;         // from cuFileDriverGetProperties
  unsigned nvfs_minor = 0;
  unsigned dstatusflags = 0;       // file system / device support bits
  bool compat_allowed = false;     // properties.allow_compat_mode
  bool compat_forced = false;      // CUFILE_FORCE_COMPAT_MODE or cufile.json
  int version = 0;                 // cuFileGetVersion
  std::uint64_t max_pinned_bytes = 0;  // the most GPU memory cuFileBufRegister may pin
};

enum class CuFileMode { Unavailable, Compat, Gds };

struct CuFileVerdict {
  CuFileMode mode = CuFileMode::Unavailable;
  std::string reason;
};

// The driver-wide verdict.
CuFileVerdict driver_verdict(const CuFileFacts& facts);

// The verdict for a file on a file system of this type ("ext4", "tmpfs", ...).
CuFileVerdict file_verdict(const CuFileFacts& facts, std::string_view filesystem);

// Loads libcufile, opens the driver once and reads its properties. Never throws.
const CuFileFacts& probe_cufile();

// Cheap: whether true GPUDirect Storage is possible at all (the nvidia-fs module is loaded),
// checked before paying for cuFile's start-up.
bool nvidia_fs_present();

}  // namespace ferry::detail
