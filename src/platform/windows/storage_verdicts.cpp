#include "platform/windows/storage_verdicts.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>

namespace ferry::detail::win32 {
namespace {

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

// A string of `length` characters the driver wrote, which need not end in a null: at most the
// array's `capacity`, and up to a null where there is one.
std::string text(const WCHAR* s, USHORT length, std::size_t capacity) {
  const std::wstring_view all(s, std::min<std::size_t>(length, capacity));
  return narrow(all.substr(0, all.find(L'\0')));
}

}  // namespace

std::string nvme_from(const std::string& root, const std::vector<DiskBus>& disks) {
  std::string nvme, other;
  for (const DiskBus& d : disks) {
    std::string& list = d.device == BusTypeNvme || d.adapter == BusTypeNvme ? nvme : other;
    list += (list.empty() ? "" : ", ") + d.name + " (bus " + bus_name(d.device) + ", adapter " +
            bus_name(d.adapter) + ")";
  }
  if (!other.empty()) return "no: " + root + " is on " + other;
  return "yes: " + root + " is on " + nvme;
}

std::string bypass_io_from(const FsBpioOutput& out, DWORD got, const std::string& path) {
  if (got < offsetof(FsBpioOutput, query) + offsetof(FsBpioResults, failing_driver_name))
    return "unknown: FSCTL_MANAGE_BYPASS_IO on " + path + " answered with " + std::to_string(got) +
           " bytes, too few to hold its result";
  const FsBpioResults& r = out.query;
  if (r.op_status != 0) {
    char status[16];
    std::snprintf(status, sizeof status, "0x%08lX", static_cast<unsigned long>(r.op_status));
    return "off: " + text(r.failing_driver_name, r.failing_driver_name_length, 32) +
           " vetoes it: " + text(r.failure_reason, r.failure_reason_length, 128) + " (NTSTATUS " +
           status + ")";
  }
  if (!(out.out_flags & kFsBpioOutflCompatibleStorageDriver))
    return "off: the filters and the file system allow it, but the storage driver does not say "
           "it is compatible (FSBPIO_OUTFL_COMPATIBLE_STORAGE_DRIVER unset)";
  return "on: the filters, the file system and the storage driver allow it";
}

}  // namespace ferry::detail::win32
