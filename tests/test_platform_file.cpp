// The platform seam (src/platform/) on every system ferry builds for, Windows under Wine
// included: positioned binary I/O that never translates bytes, non-ASCII (UTF-8) file names,
// file identity, and whole loads to host memory through each I/O path, bit-exact with the plain
// host reader.
#include <gtest/gtest.h>

#include <cstring>
#include <regex>
#include <string>

#include "ferry/error.hpp"
#include "ferry/file_set.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/utf8_path.hpp"
#include "platform/file_descriptor.hpp"
#include "platform/file.hpp"
#include "platform/file_ranges.hpp"
#include "platform/system.hpp"
#ifdef _WIN32
#include "platform/windows/storage_verdicts.hpp"
#endif
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

// A name from UTF-8 bytes, as the C ABI and the CLI receive names.
std::filesystem::path utf8_name(const TempDir& dir, std::string_view utf8) {
  return dir.path() / std::u8string(reinterpret_cast<const char8_t*>(utf8.data()), utf8.size());
}

// Bytes that text-mode I/O would change: CR LF pairs, lone CR and LF, and 0x1A (^Z, which the
// C runtime's text mode takes for the end of the file), at 4 KiB boundaries and between them.
std::vector<std::byte> text_mode_traps(std::size_t size) {
  auto bytes = test::random_bytes(size, 7);
  const unsigned char pattern[] = {0x0D, 0x0A, 0x1A, 0x0A, 0x0D, 0x0D, 0x0A, 0x1A, 0x00, 0x1A};
  for (std::size_t i = 0; i < size; i += 97)
    bytes[i] = static_cast<std::byte>(pattern[(i / 97) % std::size(pattern)]);
  for (std::size_t b = 4096; b + 2 < size; b += 4096) {
    bytes[b - 1] = std::byte{0x0D};
    bytes[b] = std::byte{0x0A};
    bytes[b + 1] = std::byte{0x1A};
  }
  return bytes;
}

TEST(PlatformFile, PositionedWritesAndReadsKeepEveryByte) {
  TempDir dir;
  const auto path = dir / "bytes.bin";
  const auto bytes = text_mode_traps(3 * 4096 + 123);
  {
    auto f = detail::PlatformFile::open(path, FileAccess::ReadWrite, false);
    // Written back to front: each write lands at its own offset, not at a file pointer.
    f.write_all(bytes.data() + 4096, bytes.size() - 4096, 4096, false);
    f.write_all(bytes.data(), 4096, 0, false);
    f.sync();
  }
  auto f = detail::PlatformFile::open(path, FileAccess::Read, false);
  EXPECT_EQ(f.identity().size, bytes.size());
  std::vector<std::byte> back(bytes.size() + 100);
  EXPECT_EQ(f.read_up_to(back.data(), back.size(), 0, false), bytes.size());  // short at the end
  EXPECT_EQ(std::memcmp(back.data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(f.read_up_to(back.data(), 10, bytes.size() + 5, false), 0u);
}

TEST(PlatformFile, UnbufferedReadsAreAlignedAndExact) {
  TempDir dir;
  const auto path = dir / "direct.bin";
  const auto bytes = text_mode_traps(5 * 4096 + 77);
  test::write_file(path, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  auto f = detail::PlatformFile::open(path, FileAccess::Read, true);
  if (!f.has_direct()) GTEST_SKIP() << "unbuffered reads refused here: " << f.direct_refusal();
  const std::size_t span = 6 * detail::kDirectAlignment;
  void* aligned = detail::allocate_pages(span);
  ASSERT_NE(aligned, nullptr);
  const std::size_t got = f.read_up_to(aligned, span, 4096, true);
  EXPECT_EQ(got, bytes.size() - 4096);
  EXPECT_EQ(std::memcmp(aligned, bytes.data() + 4096, got), 0);
  detail::free_pages(aligned, span);
}

// Unbuffered transfers go in calls of at most kMaxDirectCall: one of 2.5 calls' bytes writes
// and reads back whole, and a read past the end stops there, mid-call.
TEST(PlatformFile, UnbufferedTransfersLargerThanOneCallAreWhole) {
  TempDir dir;
  const auto path = dir / "large.bin";
  const std::size_t size = 2 * detail::kMaxDirectCall + detail::kMaxDirectCall / 2;
  const auto bytes = test::random_bytes(size, 11);
  const std::size_t span = size + 2 * detail::kMaxDirectCall;  // room to read past the end
  void* aligned = detail::allocate_pages(span);
  ASSERT_NE(aligned, nullptr);
  {
    auto f = detail::PlatformFile::open(path, FileAccess::ReadWrite, true);
    if (!f.has_direct()) {
      detail::free_pages(aligned, span);
      GTEST_SKIP() << "unbuffered I/O refused here: " << f.direct_refusal();
    }
    std::memcpy(aligned, bytes.data(), size);
    f.write_all(aligned, size, 0, true);
    f.sync();
  }
  auto f = detail::PlatformFile::open(path, FileAccess::Read, true);
  std::memset(aligned, 0, span);
  const std::size_t got = f.read_up_to(aligned, span - 4096, 4096, true);
  EXPECT_EQ(got, size - 4096);
  EXPECT_EQ(std::memcmp(aligned, bytes.data() + 4096, size - 4096), 0);
  detail::free_pages(aligned, span);
}

TEST(PlatformFile, IdentityNamesTheFileNotThePath) {
  TempDir dir;
  test::write_file(dir / "a", "first");
  test::write_file(dir / "b", "second");
  auto a1 = detail::PlatformFile::open(dir / "a", FileAccess::Read, false);
  auto a2 = detail::PlatformFile::open(dir / "a", FileAccess::Read, false);
  auto b = detail::PlatformFile::open(dir / "b", FileAccess::Read, false);
  EXPECT_TRUE(a1.identity().same_contents(a2.identity()));
  EXPECT_FALSE(a1.identity().same_file(b.identity()));
  EXPECT_EQ(a1.current_identity().size, 5u);
}

TEST(PlatformFile, MissingFilesAndDirectoriesAreNamedErrors) {
  TempDir dir;
  try {
    detail::PlatformFile::open(dir / "absent.safetensors", FileAccess::Read, false);
    FAIL() << "opened a missing file";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detail::PlatformFile::open(dir.path(), FileAccess::Read, false),
               std::invalid_argument);
}

TEST(PlatformFile, NonAsciiNamesOpenReadAndLoad) {
  TempDir dir;
  // Greek, CJK, an accented Latin letter and an emoji (a UTF-16 surrogate pair on Windows).
  const auto path = utf8_name(dir,
                              "\xCE\xBC\xCE\xBF\xCE\xBD\xCF\x84\xCE\xAD\xCE\xBB\xCE\xBF-"
                              "\xE6\xA8\xA1\xE5\x9E\x8B-caf\xC3\xA9-\xF0\x9F\x9A\xA2.safetensors");
  auto written = test::write_random_checkpoint(
      path, {{"a", DType::F16, {3, 5}}, {"b", DType::U8, {70001}}}, 5);
  ASSERT_TRUE(std::filesystem::exists(path));
  auto ckpt = Checkpoint::open_shared(path);
  auto loaded = load(ckpt, LoadOptions{});
  for (const auto& t : loaded.tensors())
    EXPECT_EQ(std::memcmp(t.data, written.at(t.info->name).data(), t.info->size), 0);
  // The name survives the round trip to UTF-8 that error messages and statistics use.
  const std::u8string back = ckpt->files()[0].path.filename().u8string();
  EXPECT_EQ(std::string(back.begin(), back.end()),
            "\xCE\xBC\xCE\xBF\xCE\xBD\xCF\x84\xCE\xAD\xCE\xBB\xCE\xBF-\xE6\xA8\xA1\xE5\x9E\x8B-"
            "caf\xC3\xA9-\xF0\x9F\x9A\xA2.safetensors");
}

class TextModeTraps : public ::testing::TestWithParam<IoMode> {};

// CR LF and 0x1A in tensor data land unchanged on every I/O path (the bug that corrupted
// weights in a Windows port that opened files in text mode).
TEST_P(TextModeTraps, LoadLandsThemUnchanged) {
  TempDir dir;
  const auto path = dir / "traps.safetensors";
  const auto traps = text_mode_traps((2 << 20) + 4099);
  const std::vector<TensorSpec> specs = {{"t", DType::U8, {traps.size()}},
                                         {"u", DType::U8, {4097}}};
  write_safetensors(path, specs, [&](const TensorSpec& spec, std::span<std::byte> out) {
    std::memcpy(out.data(), traps.data(), out.size());
    (void)spec;
  });
  if (GetParam() == IoMode::Direct &&
      !detail::PlatformFile::open(path, FileAccess::Read, true).has_direct())
    GTEST_SKIP() << "unbuffered reads refused here";
  auto ckpt = Checkpoint::open_shared(path);
  LoadOptions options;
  options.io = GetParam();
  options.chunk_bytes = 1 << 20;
  auto loaded = load(ckpt, options);
  for (const auto& t : loaded.tensors()) {
    EXPECT_EQ(std::memcmp(t.data, traps.data(), t.info->size), 0) << t.info->name;
    const auto plain = test::read_plain(*ckpt, *t.info);
    EXPECT_EQ(std::memcmp(t.data, plain.data(), plain.size()), 0) << t.info->name;
  }
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  if (GetParam() == IoMode::Buffered) {
    EXPECT_EQ(loaded.stats().files[0].io_path, IoPath::Buffered);
  }
}

INSTANTIATE_TEST_SUITE_P(IoModes, TextModeTraps,
                         ::testing::Values(IoMode::Buffered, IoMode::Direct, IoMode::Auto));

TEST(FileDescriptor, WritesAndReadsAtOffsetsInBinary) {
  TempDir dir;
  const auto path = dir / "fd.bin";
  const auto bytes = text_mode_traps(10000);
  {
    const auto fd = detail::create_for_writing(path);
    detail::write_exact(fd, bytes.data() + 5000, 5000, 5000, path);
    detail::write_exact(fd, bytes.data(), 5000, 0, path);
  }
  const auto fd = detail::open_for_reading(path);
  EXPECT_EQ(detail::file_size(fd, path), bytes.size());
  std::vector<std::byte> back(bytes.size());
  detail::read_exact(fd, back.data(), back.size(), 0, path);
  EXPECT_EQ(back, bytes);
  EXPECT_THROW(detail::read_exact(fd, back.data(), 10, bytes.size() - 5, path), FormatError);
}

// The sampled residency probe agrees with the full one where that is sure: a resident range
// looks resident, and a range whose first page is not never does (the first page is sampled).
TEST(FileRanges, TheSampledResidencyProbeAgreesWithTheFullOne) {
  TempDir dir;
  const auto path = dir / "cached.bin";
  const std::vector<std::byte> bytes(24 << 20, std::byte{7});
  {
    const auto fd = detail::create_for_writing(path);
    detail::write_exact(fd, bytes.data(), bytes.size(), 0, path);
  }
  const auto fd = detail::open_for_reading(path);
  std::vector<std::byte> back(bytes.size());
  detail::read_exact(fd, back.data(), back.size(), 0, path);  // in the page cache now
  for (const auto& [offset, length] : {std::pair<std::uint64_t, std::uint64_t>{0, 24 << 20},
                                       {4095, (20 << 20) + 3},
                                       {1 << 20, 4096},
                                       {0, 0}}) {
    for (const unsigned windows : {0u, 2u, 8u, 64u}) {
      if (detail::range_resident(fd.get(), offset, length)) {
        EXPECT_TRUE(detail::range_resident_sampled(fd.get(), offset, length, windows))
            << offset << "+" << length << ", " << windows << " windows";
      }
    }
  }
  detail::drop_cached_pages(fd.get());
  for (const unsigned windows : {2u, 64u})
    if (!detail::range_resident(fd.get(), 0, 4096)) {
      EXPECT_FALSE(detail::range_resident_sampled(fd.get(), 0, 24 << 20, windows));
    }
}

// The storage facts doctor prints: each one of its allowed values and a reason, whatever the
// machine (under Wine most are "unknown", with the call that failed).
TEST(PlatformStorage, FactsAreAnAllowedValueAndAReason) {
  TempDir dir;
  const auto file = utf8_name(dir,
                              "donn\xc3\xa9"
                              "es.bin");
  test::write_file(file, "x");
  const std::regex nvme("^(yes|no|unknown): .+"), bypass("^(on|off|unknown): .+");
  for (const std::string& path : {utf8_of(dir.path()), utf8_of(file)}) {
    SCOPED_TRACE(path);
    const std::string n = detail::nvme_verdict(path), b = detail::bypass_io_verdict(path);
    EXPECT_TRUE(std::regex_match(n, nvme)) << n;
#ifdef _WIN32
    EXPECT_TRUE(std::regex_match(b, bypass)) << b;
#else
    EXPECT_EQ(b, "") << "BypassIO is Windows' alone";
#endif
  }
}

TEST(PlatformStorage, AFileThatCannotBeOpenedIsUnknownAndSaysWhy) {
  TempDir dir;
  const std::string missing = utf8_of(dir / "missing.bin");
#ifdef _WIN32
  const std::string b = detail::bypass_io_verdict(missing);
  EXPECT_EQ(b.rfind("unknown: CreateFileW on " + missing + " failed: ", 0), 0u) << b;
#else
  const std::string n = detail::nvme_verdict(missing);
  EXPECT_EQ(n.rfind("unknown: stat(" + missing + ") failed: ", 0), 0u) << n;
#endif
}

#ifdef _WIN32
namespace win32 = detail::win32;

// The answers Wine never gives (it reports no disks and refuses FSCTL_MANAGE_BYPASS_IO), made
// up here as Windows documents them, through the same code that reads the real ones.
TEST(PlatformStorage, DisksAreNvmeOnlyWhenEveryOneSaysSo) {
  using win32::DiskBus;
  const auto verdict = [](const char* root, std::vector<DiskBus> disks) {
    return win32::nvme_from(root, disks);
  };
  EXPECT_EQ(verdict("C:\\", {{"PhysicalDrive0", BusTypeNvme, BusTypeNvme}}),
            "yes: C:\\ is on PhysicalDrive0 (bus NVMe, adapter NVMe)");
  // An NVMe disk behind a driver that reports its device as SCSI: its adapter says NVMe.
  const std::string behind_scsi = verdict("D:\\", {{"PhysicalDrive2", BusTypeScsi, BusTypeNvme}});
  EXPECT_EQ(behind_scsi, "yes: D:\\ is on PhysicalDrive2 (bus SCSI, adapter NVMe)");
  const std::string spanned = verdict("E:\\", {{"PhysicalDrive0", BusTypeNvme, BusTypeNvme},
                                               {"PhysicalDrive1", BusTypeSata, BusTypeSata}});
  EXPECT_EQ(spanned, "no: E:\\ is on PhysicalDrive1 (bus SATA, adapter SATA)");
  const std::string spaces = verdict("F:\\", {{"PhysicalDrive3", BusTypeSpaces, 0x7E}});
  EXPECT_EQ(spaces, "no: F:\\ is on PhysicalDrive3 (bus Storage Spaces, adapter unknown)");
}

win32::FsBpioOutput bypass_answer(LONG status, LONG out_flags, std::wstring_view driver,
                                  std::wstring_view reason) {
  win32::FsBpioOutput out{};
  out.operation = win32::kFsBpioOpQuery;
  out.out_flags = out_flags;
  out.query.op_status = status;
  // Written without a terminating null, as drivers may.
  out.query.failing_driver_name_length = static_cast<USHORT>(driver.size());
  std::copy(driver.begin(), driver.end(), out.query.failing_driver_name);
  out.query.failure_reason_length = static_cast<USHORT>(reason.size());
  std::copy(reason.begin(), reason.end(), out.query.failure_reason);
  return out;
}

TEST(PlatformStorage, BypassIoVerdictsFollowTheQueryAnswer) {
  const DWORD full = sizeof(win32::FsBpioOutput);
  EXPECT_EQ(win32::bypass_io_from(bypass_answer(0, 8, L"", L""), full, "m.safetensors"),
            "on: the filters, the file system and the storage driver allow it");
  EXPECT_EQ(win32::bypass_io_from(bypass_answer(0, 0, L"", L""), full, "m.safetensors")
                .rfind("off: the filters and the file system allow it, but the storage driver", 0),
            0u);
  const auto veto = bypass_answer(static_cast<LONG>(0xC00000BBu), 8, L"wof.sys",
                                  L"Compressed file (WOF) is not supported");
  EXPECT_EQ(win32::bypass_io_from(veto, full, "m.safetensors"),
            "off: wof.sys vetoes it: Compressed file (WOF) is not supported (NTSTATUS 0xC00000BB)");
  // A length past the array is cut at the array (and at a null), never read beyond it.
  auto long_name = bypass_answer(static_cast<LONG>(0xC00000BBu), 0, L"x.sys", L"r");
  long_name.query.failing_driver_name_length = 500;
  EXPECT_EQ(win32::bypass_io_from(long_name, full, "m"),
            "off: x.sys vetoes it: r (NTSTATUS 0xC00000BB)");
  EXPECT_EQ(win32::bypass_io_from(veto, 20, "m.safetensors"),
            "unknown: FSCTL_MANAGE_BYPASS_IO on m.safetensors answered with 20 bytes, too few to "
            "hold its result");
}
#endif

}  // namespace
}  // namespace ferry
