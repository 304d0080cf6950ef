// The Windows implementation of platform/system.hpp's storage facts: the bus of the disks under a
// volume (IOCTL_VOLUME_GET_VOLUME_DISK_EXTENTS, then IOCTL_STORAGE_QUERY_PROPERTY on each disk)
// and whether BypassIO is allowed for a file (FSCTL_MANAGE_BYPASS_IO, FS_BPIO_OP_QUERY). A fact
// the system does not give is "unknown: " and the call that failed, with the system's words.
#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "platform/system.hpp"
#include "platform/windows/storage_verdicts.hpp"  // windows.h, winioctl.h

namespace ferry::detail {
namespace {

using win32::DiskBus;
using win32::FsBpioInput;
using win32::FsBpioOutput;

std::string failed(const char* call, const std::string& on, DWORD error) {
  return "unknown: " + std::string(call) + " on " + on + " failed: " + win32::message_of(error) +
         " (Windows error " + std::to_string(error) + ")";
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
  std::vector<DiskBus> buses;
  for (DWORD n : disks) {
    const std::string name = "PhysicalDrive" + std::to_string(n);
    const win32::Handle disk(::CreateFileW(win32::widen("\\\\.\\" + name).c_str(), 0,
                                           FILE_SHARE_READ | FILE_SHARE_WRITE, nullptr,
                                           OPEN_EXISTING, 0, nullptr));
    if (!disk) return failed("CreateFileW", name, ::GetLastError());
    DiskBus bus{name, BusTypeUnknown, BusTypeUnknown};
    if (!bus_of<STORAGE_DEVICE_DESCRIPTOR>(disk.get(), name, StorageDeviceProperty, bus.device,
                                           why) ||
        !bus_of<STORAGE_ADAPTER_DESCRIPTOR>(disk.get(), name, StorageAdapterProperty, bus.adapter,
                                            why))
      return why;
    buses.push_back(bus);
  }
  return win32::nvme_from(root, buses);
}

std::string bypass_io_verdict(const std::string& path) {
  // Directories need FILE_FLAG_BACKUP_SEMANTICS to open; files do not mind it.
  const win32::Handle h(::CreateFileW(win32::widen(path).c_str(), GENERIC_READ,
                                      FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                                      nullptr, OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, nullptr));
  if (!h) return failed("CreateFileW", path, ::GetLastError());
  FsBpioInput in{win32::kFsBpioOpQuery, 0, 0, 0};
  FsBpioOutput out{};
  DWORD got = 0;
  if (!::DeviceIoControl(h.get(), win32::kFsctlManageBypassIo, &in, sizeof in, &out, sizeof out,
                         &got, nullptr)) {
    const DWORD error = ::GetLastError();
    std::string why =
        failed("DeviceIoControl(FSCTL_MANAGE_BYPASS_IO, FS_BPIO_OP_QUERY)", path, error);
    if (error == ERROR_INVALID_FUNCTION || error == ERROR_NOT_SUPPORTED)
      why += "; Windows before 11, and file systems without BypassIO, refuse it";
    return why;
  }
  return win32::bypass_io_from(out, got, path);
}

}  // namespace ferry::detail
