// The host-side logic of the cuFile path: edge/body splitting, the handle cache, and the mode
// verdicts from (faked) driver facts. No GPU or cuFile needed.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cerrno>
#include <map>

#include "backends/cufile/aligned_split.hpp"
#include "shim/gds_mode.hpp"
#include "backends/cufile/handle_cache.hpp"
#include "backends/cufile/transfer_result.hpp"
#include "ferry/error.hpp"
#include "ferry/file_set.hpp"
#include "platform/file.hpp"
#include "test_support.hpp"

namespace ferry::detail {
namespace {

// Every byte covered exactly once, in order; direct pieces aligned in offset and length.
void expect_valid_split(std::uint64_t offset, std::uint64_t size, std::uint64_t max_piece) {
  auto pieces = split_aligned(offset, size, max_piece);
  std::uint64_t at = offset;
  for (const auto& p : pieces) {
    EXPECT_EQ(p.file_offset, at);
    EXPECT_EQ(p.buffer_offset, at - offset);
    EXPECT_GT(p.size, 0u);
    if (p.direct) {
      EXPECT_EQ(p.file_offset % 4096, 0u);
      EXPECT_EQ(p.size % 4096, 0u);
      EXPECT_LE(p.size, std::max<std::uint64_t>(4096, max_piece));
    } else {
      EXPECT_LT(p.size, 4096u);
    }
    at += p.size;
  }
  EXPECT_EQ(at, offset + size);
}

TEST(AlignedSplit, CoversEveryCase) {
  for (std::uint64_t offset : {0ull, 1ull, 100ull, 4095ull, 4096ull, 8191ull, 12288ull + 17})
    for (std::uint64_t size : {0ull, 1ull, 4095ull, 4096ull, 4097ull, 10000ull, 3ull << 20})
      for (std::uint64_t piece : {4096ull, 65536ull, 1ull << 20})
        expect_valid_split(offset, size, piece);
}

TEST(AlignedSplit, AlignedRangeIsAllBody) {
  auto pieces = split_aligned(8192, 3 * 4096, 1 << 20);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_TRUE(pieces[0].direct);
}

TEST(AlignedSplit, SmallUnalignedRangeIsOneEdge) {
  auto pieces = split_aligned(10, 100, 1 << 20);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_FALSE(pieces[0].direct);
  auto straddling = split_aligned(4000, 200, 1 << 20);  // crosses a page boundary, no body
  ASSERT_EQ(straddling.size(), 2u);
  EXPECT_FALSE(straddling[0].direct);
  EXPECT_FALSE(straddling[1].direct);
}

struct FakeRegistrar {
  std::map<std::string, int> opened, closed;
  int next_fd = 100;
  FileRegistrar make() {
    return {[this](const std::filesystem::path& p, bool) {
              ++opened[p.string()];
              if (p.filename() == "refused") throw std::runtime_error("refused");
              return OpenedFile{next_fd++, next_fd, reinterpret_cast<void*>(0x1000 + next_fd)};
            },
            [this](const OpenedFile& f) { ++closed[std::to_string(f.fd)]; }};
  }
};

TEST(HandleCache, RegistersEachFileOnceAndReusesIt) {
  FakeRegistrar fake;
  HandleCache cache(fake.make(), 4);
  int fd = -1;
  {
    auto a = cache.acquire("/x/a");
    auto again = cache.acquire("/x/./a");  // the same file
    EXPECT_EQ(a.file().fd, again.file().fd);
    fd = a.file().fd;
  }
  auto later = cache.acquire("/x/a");
  EXPECT_EQ(later.file().fd, fd);
  EXPECT_EQ(fake.opened["/x/a"], 1);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(HandleCache, EvictsTheLeastRecentlyUsedIdleEntry) {
  FakeRegistrar fake;
  HandleCache cache(fake.make(), 2);
  int fd_a = cache.acquire("/a").file().fd;
  int fd_b = cache.acquire("/b").file().fd;
  cache.acquire("/a");  // a is now more recent than b
  cache.acquire("/c");  // over capacity: b goes
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(fake.closed[std::to_string(fd_b)], 1);
  EXPECT_EQ(fake.closed[std::to_string(fd_a)], 0);
  cache.acquire("/b");
  EXPECT_EQ(fake.opened["/b"], 2);
}

TEST(HandleCache, NeverClosesALeasedEntry) {
  FakeRegistrar fake;
  HandleCache cache(fake.make(), 1);
  auto a = cache.acquire("/a");
  auto b = cache.acquire("/b");  // over capacity, but both are leased
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(fake.closed.empty());
  { auto drop = std::move(a); }  // a's last lease ends: now evictable
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(b.file().handle, reinterpret_cast<void*>(0x1000 + 102));
}

TEST(HandleCache, AFailedOpenLeavesNothingBehind) {
  FakeRegistrar fake;
  HandleCache cache(fake.make(), 2);
  EXPECT_THROW(cache.acquire("/x/refused"), std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
}

// A file set's open files, keyed by identity: the same file through two file sets is one
// entry, registered once; a path renamed over by another file is another entry; the entry holds
// the file open while cached, and eviction takes idle entries only.
TEST(HandleCache, FileSetEntriesAreKeyedByIdentityNotPath) {
  test::TempDir dir;
  test::write_file(dir / "a", "first");
  std::map<std::string, int> registered, deregistered;
  FileRegistrar registrar{
      [](const std::filesystem::path&, bool) -> OpenedFile { throw std::logic_error("unused"); },
      [&](const OpenedFile& f) {
        EXPECT_FALSE(f.owns_descriptors);
        ++deregistered[std::to_string(f.plain_fd)];
      },
      [&](const PlatformFile& f) {
        ++registered[std::to_string(f.identity().inode)];
        const int fd = static_cast<int>(f.native(false));
        return OpenedFile{fd, fd, reinterpret_cast<void*>(0x1000), false};
      }};
  HandleCache cache(registrar, 2);
  auto one = FileSet::create(), two = FileSet::create();
  one->add(dir / "a");
  two->add(dir / "a");
  const std::string first_inode = std::to_string(one->acquire(0, false)->identity().inode);
  {
    auto a = cache.acquire(one->acquire(0, false));
    auto b = cache.acquire(two->acquire(0, false));
    EXPECT_EQ(cache.size(), 1u);
    EXPECT_EQ(registered[first_inode], 1);
  }
  // The path now names another file: a new entry, the old one kept (idle) until evicted.
  test::write_file(dir / "b", "second");
  std::filesystem::rename(dir / "b", dir / "a");
  auto three = FileSet::create(1);
  three->add(dir / "a");
  auto held = cache.acquire(three->acquire(0, false));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(registered.size(), 2u);
  // A file set of one open file cannot close the cached one to make room: the cache holds it.
  test::write_file(dir / "d", "fourth");
  three->add(dir / "d");
  EXPECT_EQ(three->open_now(), 2u);
  // Over capacity with a third file: the idle first entry goes, the leased one stays.
  test::write_file(dir / "c", "third");
  auto four = FileSet::create();
  four->add(dir / "c");
  auto c = cache.acquire(four->acquire(0, false));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(deregistered.size(), 1u);
  EXPECT_EQ(c.file().handle, reinterpret_cast<void*>(0x1000));
}

TEST(HandleCache, CapacityRespectsTheDescriptorLimit) {
  EXPECT_GE(handle_cache_capacity(1), 1u);
  EXPECT_LE(handle_cache_capacity(1'000'000'000), 1'000'000'000u);
  struct rlimit limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur != RLIM_INFINITY) {
    EXPECT_LE(handle_cache_capacity(1'000'000'000), std::max<std::size_t>(1, limit.rlim_cur / 4));
  }
}

CuFileFacts gds_machine() {
  CuFileFacts f;
  f.library_loaded = f.driver_opened = f.nvidia_fs_loaded = true;
  f.nvfs_major = 2;
  f.nvfs_minor = 24;
  f.dstatusflags = 1u << 4;  // NVMe
  return f;
}

TEST(GdsMode, TrueGdsOnlyWithNvidiaFsAndASupportedFileSystem) {
  CuFileFacts f = gds_machine();
  EXPECT_EQ(driver_verdict(f).mode, CuFileMode::Gds);
  EXPECT_EQ(file_verdict(f, "ext4").mode, CuFileMode::Gds);
  EXPECT_EQ(file_verdict(f, "xfs").mode, CuFileMode::Gds);
  auto tmpfs = file_verdict(f, "tmpfs");
  EXPECT_EQ(tmpfs.mode, CuFileMode::Compat);
  EXPECT_NE(tmpfs.reason.find("tmpfs"), std::string::npos);
  EXPECT_EQ(file_verdict(f, "overlayfs").mode, CuFileMode::Compat);
  EXPECT_EQ(file_verdict(f, "nfs").mode, CuFileMode::Compat);  // no NFS bit
  f.dstatusflags |= 1u << 2;
  EXPECT_EQ(file_verdict(f, "nfs").mode, CuFileMode::Gds);
}

TEST(GdsMode, NoNvidiaFsMeansCompatibilityMode) {
  CuFileFacts f = gds_machine();
  f.nvidia_fs_loaded = false;
  auto v = driver_verdict(f);
  EXPECT_EQ(v.mode, CuFileMode::Compat);
  EXPECT_NE(v.reason.find("nvidia-fs"), std::string::npos);
  EXPECT_EQ(file_verdict(f, "ext4").mode, CuFileMode::Compat);
  f = gds_machine();
  f.nvfs_major = 0;  // module file present but the driver reports no version
  EXPECT_EQ(driver_verdict(f).mode, CuFileMode::Compat);
}

TEST(GdsMode, ForcedCompatAndUnavailableDriversSaySo) {
  CuFileFacts f = gds_machine();
  f.compat_forced = true;
  EXPECT_EQ(driver_verdict(f).mode, CuFileMode::Compat);
  CuFileFacts missing;
  missing.problem = "libcufile.so.0 was not found";
  auto v = driver_verdict(missing);
  EXPECT_EQ(v.mode, CuFileMode::Unavailable);
  EXPECT_EQ(v.reason, missing.problem);
  CuFileFacts refused = gds_machine();
  refused.driver_opened = false;
  refused.problem = "cuFileDriverOpen failed: cuFile error 5001";
  EXPECT_EQ(file_verdict(refused, "ext4").mode, CuFileMode::Unavailable);
}

// Each way a cuFile transfer can end maps to ferry's type for it, with the file in the message.
TEST(CufileTransferResult, EachOutcomeIsTyped) {
  const std::filesystem::path file = "/data/shard.bin";
  EXPECT_NO_THROW(check_cufile_transfer(4096, 4096, file, "cuFileRead", 0, false));
  errno = ENOSPC;
  try {
    check_cufile_transfer(-1, 4096, file, "cuFileWrite", 8192, true);
    ADD_FAILURE() << "no error for -1";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_space_on_device);
    EXPECT_NE(std::string(e.what()).find("/data/shard.bin"), std::string::npos);
  }
  try {
    check_cufile_transfer(-5001, 4096, file, "cuFileRead", 0, false);
    ADD_FAILURE() << "no error for a cuFile code";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("cuFile error 5001"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/data/shard.bin"), std::string::npos);
  }
  EXPECT_THROW(check_cufile_transfer(100, 4096, file, "cuFileRead", 0, false), FormatError);
  try {
    check_cufile_transfer(100, 4096, file, "cuFileWrite", 0, true);
    ADD_FAILURE() << "no error for a short write";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_space_on_device);
  }
}

}  // namespace
}  // namespace ferry::detail
