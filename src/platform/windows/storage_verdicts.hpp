// The Windows storage facts' answers turned into doctor's verdicts, apart from the calls that get
// them (platform/windows/storage.cpp), so that tests can give them answers Wine never does.
#pragma once

#include <string>
#include <vector>

// clang-format off
#include "platform/windows/win32.hpp"  // windows.h, which winioctl.h needs first
#include <winioctl.h>
// clang-format on

namespace ferry::detail::win32 {

// BypassIO's control code and structures, which mingw-w64 (10.0) does not declare. They follow
// Microsoft's documentation of FSCTL_MANAGE_BYPASS_IO, FS_BPIO_INPUT, FS_BPIO_OUTPUT,
// FS_BPIO_OPERATIONS, FS_BPIO_OUTFLAGS and FS_BPIO_RESULTS (learn.microsoft.com, ntifs.h, Windows
// 11; winioctl.h of the Windows 11 SDK, 10.0.22000, declares them for user mode too). The code
// is 590920, the value the Win32 metadata of that SDK gives.
constexpr DWORD kFsctlManageBypassIo =
    CTL_CODE(FILE_DEVICE_FILE_SYSTEM, 274, METHOD_BUFFERED, FILE_ANY_ACCESS);
static_assert(kFsctlManageBypassIo == 590920);
constexpr LONG kFsBpioOpQuery = 3;                       // FS_BPIO_OP_QUERY
constexpr LONG kFsBpioOutflCompatibleStorageDriver = 8;  // FSBPIO_OUTFL_COMPATIBLE_STORAGE_DRIVER

struct FsBpioInput {  // FS_BPIO_INPUT
  LONG operation;     // FS_BPIO_OPERATIONS
  LONG in_flags;      // FS_BPIO_INFLAGS: FSBPIO_INFL_None
  ULONGLONG reserved1;
  ULONGLONG reserved2;
};

struct FsBpioResults {                // FS_BPIO_RESULTS
  LONG op_status;                     // NTSTATUS
  USHORT failing_driver_name_length;  // in characters; the name need not end in a null
  WCHAR failing_driver_name[32];
  USHORT failure_reason_length;
  WCHAR failure_reason[128];
};

struct FsBpioOutput {  // FS_BPIO_OUTPUT, its union's FS_BPIO_RESULTS member (the largest) only
  LONG operation;
  LONG out_flags;  // FS_BPIO_OUTFLAGS
  ULONGLONG reserved1;
  ULONGLONG reserved2;
  FsBpioResults query;
};

// One disk under a volume and the STORAGE_BUS_TYPE its device and its adapter report.
struct DiskBus {
  std::string name;  // "PhysicalDrive0"
  int device = 0;    // STORAGE_DEVICE_DESCRIPTOR::BusType
  int adapter = 0;   // STORAGE_ADAPTER_DESCRIPTOR::BusType
};

// "yes: <root> is on ..." when every disk reports NVMe (its device or its adapter), else
// "no: <root> is on <the disks that do not>"; `disks` is not empty.
std::string nvme_from(const std::string& root, const std::vector<DiskBus>& disks);

// The verdict from FSCTL_MANAGE_BYPASS_IO's FS_BPIO_OP_QUERY answer of `got` bytes on `path`.
std::string bypass_io_from(const FsBpioOutput& out, DWORD got, const std::string& path);

}  // namespace ferry::detail::win32
