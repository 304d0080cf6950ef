// The Windows implementation of platform/system.hpp's storage facts: the bus of the disks under a
// volume (IOCTL_VOLUME_GET_VOLUME_DISK_EXTENTS, then IOCTL_STORAGE_QUERY_PROPERTY on each disk)
// and whether BypassIO is allowed for a file (FSCTL_MANAGE_BYPASS_IO, FS_BPIO_OP_QUERY). A fact
// the system does not give is "unknown: " and the call that failed, with the system's words.
// clang-format off
#include "platform/windows/win32.hpp"  // windows.h, which winioctl.h needs first
#include <winioctl.h>
// clang-format on

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "platform/system.hpp"

namespace ferry::detail {
namespace {

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

std::string failed(const char* call, const std::string& on, DWORD error) {
  return "unknown: " + std::string(call) + " on " + on + " failed: " + win32::message_of(error) +
         " (Windows error " + std::to_string(error) + ")";
}

const char* bus_name(int bus) {
  switch (bus) {
    case BusTypeScsi:
      return "SCSI";
    case BusTypeAtapi:
      return "ATAPI";
    case BusTypeAta:
      return "ATA";
    case BusType1394:
      return "IEEE 1394";
    case BusTypeSsa:
      return "SSA";
    case BusTypeFibre:
      return "Fibre Channel";
    case BusTypeUsb:
      return "USB";
    case BusTypeRAID:
      return "RAID";
    case BusTypeiScsi:
      return "iSCSI";
    case BusTypeSas:
      return "SAS";
    case BusTypeSata:
      return "SATA";
    case BusTypeSd:
      return "SD";
    case BusTypeMmc:
      return "MMC";
    case BusTypeVirtual:
      return "virtual";
    case BusTypeFileBackedVirtual:
      return "file-backed virtual";
    case BusTypeSpaces:
      return "Storage Spaces";
    case BusTypeNvme:
      return "NVMe";
    case BusTypeSCM:
      return "storage-class memory";
    case BusTypeUfs:
      return "UFS";
    default:
      return "unknown";
  }
}

// The volume holding `path`, as a device name CreateFileW opens ("\\?\Volume{...}", no trailing
// backslash), and its mount point for messages; or "unknown: ..." in `why`.
bool volume_of(const std::wstring& path, std::wstring& device, std::string& root,
               std::string& why) {
  wchar_t mount[MAX_PATH + 1] = {};
  if (!::GetVolumePathNameW(path.c_str(), mount, MAX_PATH)) {
    why = failed("GetVolumePathNameW", win32::narrow(path), ::GetLastError());
    return false;
  }
  root = win32::narrow(mount);
  wchar_t name[MAX_PATH + 1] = {};
  if (!::GetVolumeNameForVolumeMountPointW(mount, name, MAX_PATH)) {
    why = failed("GetVolumeNameForVolumeMountPointW", root, ::GetLastError());
    return false;
  }
  device = name;
  if (!device.empty() && device.back() == L'\\') device.pop_back();
  return true;
}

// The disk numbers under a volume: several for a spanned or striped volume.
bool disks_of(const std::wstring& volume, const std::string& root, std::set<DWORD>& disks,
              std::string& why) {
  // No access rights needed for these queries (and none asked, so no administrator is needed).
  const win32::Handle h(::CreateFileW(volume.c_str(), 0, FILE_SHARE_READ | FILE_SHARE_WRITE,
                                      nullptr, OPEN_EXISTING, 0, nullptr));
  if (!h) {
    why = failed("CreateFileW", "the volume of " + root, ::GetLastError());
    return false;
  }
  std::vector<std::byte> buffer(sizeof(VOLUME_DISK_EXTENTS) + 31 * sizeof(DISK_EXTENT));
  DWORD got = 0;
  if (!::DeviceIoControl(h.get(), IOCTL_VOLUME_GET_VOLUME_DISK_EXTENTS, nullptr, 0, buffer.data(),
                         static_cast<DWORD>(buffer.size()), &got, nullptr)) {
    why = failed("DeviceIoControl(IOCTL_VOLUME_GET_VOLUME_DISK_EXTENTS)", "the volume of " + root,
                 ::GetLastError());
    return false;
  }
  const auto* extents = reinterpret_cast<const VOLUME_DISK_EXTENTS*>(buffer.data());
  for (DWORD i = 0; i < extents->NumberOfDiskExtents && i < 32; ++i)
    disks.insert(extents->Extents[i].DiskNumber);
  if (disks.empty()) why = "unknown: the volume of " + root + " reports no disk extents";
  return !disks.empty();
}

// BusType of one descriptor of \\.\PhysicalDriveN, or "unknown: ..." in `why`.
template <class Descriptor>
bool bus_of(HANDLE disk, const std::string& name, STORAGE_PROPERTY_ID property, int& bus,
            std::string& why) {
  STORAGE_PROPERTY_QUERY query{};
  query.PropertyId = property;
  query.QueryType = PropertyStandardQuery;
  std::vector<std::byte> buffer(1024);
  DWORD got = 0;
  if (!::DeviceIoControl(disk, IOCTL_STORAGE_QUERY_PROPERTY, &query, sizeof query, buffer.data(),
                         static_cast<DWORD>(buffer.size()), &got, nullptr)) {
    why = failed(property == StorageDeviceProperty
                     ? "DeviceIoControl(IOCTL_STORAGE_QUERY_PROPERTY, StorageDeviceProperty)"
                     : "DeviceIoControl(IOCTL_STORAGE_QUERY_PROPERTY, StorageAdapterProperty)",
                 name, ::GetLastError());
    return false;
  }
  if (got < offsetof(Descriptor, BusType) + sizeof(Descriptor::BusType)) {
    why = "unknown: " + name + " answered IOCTL_STORAGE_QUERY_PROPERTY with " +
          std::to_string(got) + " bytes, too few to hold its bus type";
    return false;
  }
  bus = static_cast<int>(reinterpret_cast<const Descriptor*>(buffer.data())->BusType);
  return true;
}

}  // namespace

std::string nvme_verdict(const std::string& path) {
  std::wstring volume;
  std::string root, why;
  std::set<DWORD> disks;
  if (!volume_of(win32::widen(path), volume, root, why) || !disks_of(volume, root, disks, why))
    return why;
  std::string nvme, other;
  for (DWORD n : disks) {
    const std::string name = "PhysicalDrive" + std::to_string(n);
    const win32::Handle disk(::CreateFileW(win32::widen("\\\\.\\" + name).c_str(), 0,
                                           FILE_SHARE_READ | FILE_SHARE_WRITE, nullptr,
                                           OPEN_EXISTING, 0, nullptr));
    if (!disk) return failed("CreateFileW", name, ::GetLastError());
    // The device's bus, else its adapter's: either says NVMe for a disk behind stornvme.
    int device_bus = BusTypeUnknown, adapter_bus = BusTypeUnknown;
    if (!bus_of<STORAGE_DEVICE_DESCRIPTOR>(disk.get(), name, StorageDeviceProperty, device_bus,
                                           why) ||
        !bus_of<STORAGE_ADAPTER_DESCRIPTOR>(disk.get(), name, StorageAdapterProperty, adapter_bus,
                                            why))
      return why;
    std::string& list = device_bus == BusTypeNvme || adapter_bus == BusTypeNvme ? nvme : other;
    list += (list.empty() ? "" : ", ") + name + " (bus " + bus_name(device_bus) + ", adapter " +
            bus_name(adapter_bus) + ")";
  }
  if (!other.empty()) return "no: " + root + " is on " + other;
  return "yes: " + root + " is on " + nvme;
}

std::string bypass_io_verdict(const std::string& path) {
  // Directories need FILE_FLAG_BACKUP_SEMANTICS to open; files do not mind it.
  const win32::Handle h(::CreateFileW(win32::widen(path).c_str(), GENERIC_READ,
                                      FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                                      nullptr, OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, nullptr));
  if (!h) return failed("CreateFileW", path, ::GetLastError());
  FsBpioInput in{kFsBpioOpQuery, 0, 0, 0};
  FsBpioOutput out{};
  DWORD got = 0;
  if (!::DeviceIoControl(h.get(), kFsctlManageBypassIo, &in, sizeof in, &out, sizeof out, &got,
                         nullptr)) {
    const DWORD error = ::GetLastError();
    std::string why =
        failed("DeviceIoControl(FSCTL_MANAGE_BYPASS_IO, FS_BPIO_OP_QUERY)", path, error);
    if (error == ERROR_INVALID_FUNCTION || error == ERROR_NOT_SUPPORTED)
      why += "; Windows before 11, and file systems without BypassIO, refuse it";
    return why;
  }
  if (got < offsetof(FsBpioOutput, query) + offsetof(FsBpioResults, failing_driver_name))
    return "unknown: FSCTL_MANAGE_BYPASS_IO on " + path + " answered with " + std::to_string(got) +
           " bytes, too few to hold its result";
  if (out.query.op_status != 0) {
    const auto text = [](const WCHAR* s, USHORT length, std::size_t capacity) {
      return win32::narrow(std::wstring_view(s, std::min<std::size_t>(length, capacity)));
    };
    char status[16];
    std::snprintf(status, sizeof status, "0x%08lX",
                  static_cast<unsigned long>(out.query.op_status));
    return "off: " + text(out.query.failing_driver_name, out.query.failing_driver_name_length, 32) +
           " vetoes it: " + text(out.query.failure_reason, out.query.failure_reason_length, 128) +
           " (NTSTATUS " + status + ")";
  }
  if (!(out.out_flags & kFsBpioOutflCompatibleStorageDriver))
    return "off: the filters and the file system allow it, but the storage driver does not say "
           "it is compatible (FSBPIO_OUTFL_COMPATIBLE_STORAGE_DRIVER unset)";
  return "on: the filters, the file system and the storage driver allow it";
}

}  // namespace ferry::detail
