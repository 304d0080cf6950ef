// The page-cache registry's cache logic (services/page_cache_registry.hpp) with a host stand-in
// for the driver's registration: reuse while a file is unchanged, a changed file registered
// afresh, the budget's LRU eviction, and each refusal said in words.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "platform/file_mapping.hpp"
#include "test_support.hpp"
#include "services/page_cache_registry.hpp"

namespace ferry {
namespace {

using detail::PageCacheRegistrar;
using detail::PageCacheRegistry;
using detail::PlatformFile;
using test::TempDir;

// Counts registrations and checks what the driver would: the range is readable when registered
// and still mapped when unregistered (unregister before munmap).
struct StandIn {
  int registered = 0;
  int unregistered = 0;
  int unregistered_unmapped = 0;
  bool refuse = false;

  PageCacheRegistrar registrar() {
    PageCacheRegistrar r;
    r.name = "host stand-in";
    r.serves = [](const Device& d) { return !d.is_cuda(); };
    r.register_range = [this](const std::byte* data, std::uint64_t size) {
      if (refuse) throw std::runtime_error("stand-in refuses");
      volatile std::byte sink = data[size - 1];  // every page is readable
      (void)sink;
      ++registered;
    };
    r.unregister_range = [this](const std::byte* data) {
      unsigned char resident = 0;
      if (::mincore(const_cast<std::byte*>(data), 1, &resident) != 0) ++unregistered_unmapped;
      ++unregistered;
    };
    return r;
  }
};

PlatformFile open_file(const std::filesystem::path& path) {
  return PlatformFile::open(path, FileAccess::Read, false);
}

std::string bytes_of(const PageCacheRegistry::Lease& lease) {
  return std::string(reinterpret_cast<const char*>(lease.data()), lease.size());
}

TEST(PageCacheRegistry, RegistersOnceAndReusesWhileTheFileIsUnchanged) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  const std::string bytes = std::string(100000, 'a') + "tail";
  test::write_file(dir / "f.bin", bytes);
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  {
    PlatformFile f = open_file(dir / "f.bin");
    auto first = registry.acquire(f, 1 << 20);
    ASSERT_TRUE(first.lease) << first.why_not;
    EXPECT_TRUE(first.registered_now);
    EXPECT_EQ(bytes_of(first.lease), bytes);
    auto second = registry.acquire(f, 1 << 20);
    ASSERT_TRUE(second.lease);
    EXPECT_FALSE(second.registered_now);
    EXPECT_EQ(second.lease.data(), first.lease.data());
    // Another open of the same file finds the same registration.
    PlatformFile again = open_file(dir / "f.bin");
    EXPECT_EQ(registry.acquire(again, 1 << 20).lease.data(), first.lease.data());
  }
  EXPECT_EQ(driver.registered, 1);
  EXPECT_EQ(registry.registrations(), 1u);
  EXPECT_EQ(registry.registered_bytes(), bytes.size());
  registry.release_idle();
  EXPECT_EQ(driver.unregistered, 1);
  EXPECT_EQ(driver.unregistered_unmapped, 0);
  EXPECT_EQ(registry.registered_bytes(), 0u);
}

TEST(PageCacheRegistry, AChangedFileIsRegisteredAfreshAndOldLeasesKeepTheirBytes) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  const auto path = dir / "f.bin";
  test::write_file(path, std::string(50000, 'o'));
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  PlatformFile f = open_file(path);
  auto old = registry.acquire(f, 1 << 20);
  ASSERT_TRUE(old.lease) << old.why_not;
  // Rewritten in place with a new size: the open file's identity moves.
  test::write_file(path, std::string(60000, 'n'));
  auto grown = registry.acquire(f, 1 << 20);
  ASSERT_TRUE(grown.lease) << grown.why_not;
  EXPECT_TRUE(grown.registered_now);
  EXPECT_EQ(bytes_of(grown.lease), std::string(60000, 'n'));
  old.lease = {};  // its pages were truncated away: never read again
  // Replaced by a rename (a new inode, as writers that save atomically do).
  test::write_file(dir / "next.bin", std::string(60000, 'r'));
  std::filesystem::rename(dir / "next.bin", path);
  PlatformFile renamed = open_file(path);
  auto fresh = registry.acquire(renamed, 1 << 20);
  ASSERT_TRUE(fresh.lease) << fresh.why_not;
  EXPECT_TRUE(fresh.registered_now);
  EXPECT_EQ(bytes_of(fresh.lease), std::string(60000, 'r'));
  // The lease on the file the rename unlinked still reads that file's bytes.
  EXPECT_EQ(bytes_of(grown.lease), std::string(60000, 'n'));
  EXPECT_EQ(driver.registered, 3);
  grown.lease = {};
  fresh.lease = {};
  registry.release_idle();
  EXPECT_EQ(driver.unregistered, 3);
  EXPECT_EQ(driver.unregistered_unmapped, 0);
}

TEST(PageCacheRegistry, TheBudgetEvictsTheLeastRecentlyUsedIdleRegistration) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  constexpr std::uint64_t kSize = 64 << 10;
  for (const char* name : {"a", "b", "c"}) test::write_file(dir / name, std::string(kSize, *name));
  PlatformFile a = open_file(dir / "a"), b = open_file(dir / "b"), c = open_file(dir / "c");
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  const std::uint64_t budget = 2 * kSize;
  ASSERT_TRUE(registry.acquire(a, budget).lease);
  ASSERT_TRUE(registry.acquire(b, budget).lease);
  ASSERT_FALSE(registry.acquire(a, budget).registered_now);  // a is now the most recent
  auto got_c = registry.acquire(c, budget);
  ASSERT_TRUE(got_c.lease) << got_c.why_not;
  EXPECT_EQ(driver.unregistered, 1);  // b went
  EXPECT_EQ(registry.registered_bytes(), budget);
  EXPECT_FALSE(registry.acquire(a, budget).registered_now);
  EXPECT_TRUE(registry.acquire(b, budget).registered_now);  // b again, so c's lease keeps c...
  EXPECT_EQ(driver.unregistered, 2);                        // ...and a went instead

  // Registrations that leases hold are never evicted: no room, and the verdict says so.
  auto held_b = registry.acquire(b, budget);
  auto refused = registry.acquire(a, budget);
  EXPECT_FALSE(refused.lease);
  EXPECT_NE(refused.why_not.find("held by registrations in use"), std::string::npos)
      << refused.why_not;
  EXPECT_EQ(driver.unregistered_unmapped, 0);
}

TEST(PageCacheRegistry, AFileLargerThanTheBudgetIsRefusedAndSaysSo) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  test::write_file(dir / "big", std::string(10000, 'x'));
  PlatformFile f = open_file(dir / "big");
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  auto got = registry.acquire(f, 9999);
  EXPECT_FALSE(got.lease);
  EXPECT_NE(got.why_not.find("larger than the budget"), std::string::npos) << got.why_not;
  EXPECT_EQ(driver.registered, 0);
}

TEST(PageCacheRegistry, AFileNotInThePageCacheIsRefusedAndSaysSo) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  const auto path = dir / "cold";
  test::write_file(path, std::string(1 << 20, 'c'));
  PlatformFile f = open_file(path);
  const int fd = static_cast<int>(f.native(false));
  ASSERT_EQ(::fdatasync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  if (detail::page_cache_fraction(f.native(false), 1 << 20) > 0.05)
    GTEST_SKIP() << "this file system keeps pages in memory after POSIX_FADV_DONTNEED";
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  auto got = registry.acquire(f, 1 << 30);
  EXPECT_FALSE(got.lease);
  EXPECT_NE(got.why_not.find("not fully in the page cache"), std::string::npos) << got.why_not;
  EXPECT_EQ(driver.registered, 0);
  EXPECT_EQ(registry.registered_bytes(), 0u);
}

// Room is made only for a range found resident: acquiring one that is not (a cold get) leaves the
// idle registrations of the full budget registered.
TEST(PageCacheRegistry, AFileNotInThePageCacheEvictsNothing) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  constexpr std::uint64_t kSize = 1 << 20;
  test::write_file(dir / "warm", std::string(kSize, 'w'));
  test::write_file(dir / "cold", std::string(kSize, 'c'));
  PlatformFile warm = open_file(dir / "warm"), cold = open_file(dir / "cold");
  const int fd = static_cast<int>(cold.native(false));
  ASSERT_EQ(::fdatasync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  if (detail::page_cache_fraction(cold.native(false), kSize) > 0.05)
    GTEST_SKIP() << "this file system keeps pages in memory after POSIX_FADV_DONTNEED";
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  {
    auto got = registry.acquire(warm, kSize);  // the whole budget, idle once this lease goes
    ASSERT_TRUE(got.lease) << got.why_not;
  }
  auto refused = registry.acquire(cold, kSize);
  EXPECT_FALSE(refused.lease);
  EXPECT_NE(refused.why_not.find("not fully in the page cache"), std::string::npos)
      << refused.why_not;
  EXPECT_EQ(driver.unregistered, 0);
  EXPECT_EQ(registry.registered_bytes(), kSize);
}

TEST(PageCacheRegistry, ADriverRefusalIsReportedAndHoldsNothing) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  test::write_file(dir / "f", std::string(5000, 'f'));
  PlatformFile f = open_file(dir / "f");
  StandIn driver;
  driver.refuse = true;
  PageCacheRegistry registry(driver.registrar());
  auto got = registry.acquire(f, 1 << 20);
  EXPECT_FALSE(got.lease);
  EXPECT_NE(got.why_not.find("stand-in refuses"), std::string::npos) << got.why_not;
  EXPECT_EQ(registry.registered_bytes(), 0u);
  EXPECT_EQ(registry.registrations(), 0u);
  EXPECT_EQ(driver.unregistered, 0);  // never registered, never unregistered
}

TEST(PageCacheRegistry, AnEmptyFileIsRefused) {
  TempDir dir;
  test::write_file(dir / "empty", "");
  PlatformFile f = open_file(dir / "empty");
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  auto got = registry.acquire(f, 1 << 20);
  EXPECT_FALSE(got.lease);
  EXPECT_FALSE(got.why_not.empty());
}

// Windows (the KV store's slabs): each window its own registration at its offset, reused while
// kept, distinct from a whole-file registration of the same file, and not checked against the
// file's version (every write to a slab moves it): release_range keeps them coherent.
TEST(PageCacheRegistry, WindowsAreRegisteredApartAndOutliveWritesUntilReleased) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  constexpr std::uint64_t kWindow = 64 << 10;
  std::string bytes;
  for (char c : {'a', 'b', 'c'}) bytes += std::string(kWindow, c);
  test::write_file(dir / "slab", bytes);
  PlatformFile f = open_file(dir / "slab");
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  auto second = registry.acquire_window(f, kWindow, kWindow, 1 << 20);
  ASSERT_TRUE(second.lease) << second.why_not;
  EXPECT_TRUE(second.registered_now);
  EXPECT_EQ(second.lease.offset(), kWindow);
  EXPECT_EQ(bytes_of(second.lease), std::string(kWindow, 'b'));
  auto whole = registry.acquire(f, 1 << 20);
  ASSERT_TRUE(whole.lease) << whole.why_not;
  EXPECT_TRUE(whole.registered_now);  // a whole file never matches a window, nor the reverse
  whole.lease = {};
  // A write in place moves the file's version: a window is still served (and shows the bytes).
  {
    std::fstream out(dir / "slab", std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(static_cast<std::streamoff>(kWindow));
    out.write("B", 1);
  }
  auto again = registry.acquire_window(f, kWindow, kWindow, 1 << 20);
  ASSERT_TRUE(again.lease);
  EXPECT_FALSE(again.registered_now);
  EXPECT_EQ(again.lease.data()[0], std::byte{'B'});
  auto third = registry.acquire_window(f, 2 * kWindow, kWindow, 1 << 20);
  ASSERT_TRUE(third.lease) << third.why_not;
  EXPECT_EQ(driver.registered, 3);
  // Released: the overlapping windows only (not the third), never served again.
  third.lease = {};
  EXPECT_EQ(registry.release_range(f.identity(), kWindow + 100, 10, false), 1u);
  EXPECT_EQ(driver.unregistered, 0);  // leased: it goes with its last lease
  EXPECT_TRUE(registry.acquire_window(f, kWindow, kWindow, 1 << 20).registered_now);
  second.lease = {};
  again.lease = {};
  EXPECT_EQ(driver.unregistered, 1);
  EXPECT_FALSE(registry.acquire_window(f, 2 * kWindow, kWindow, 1 << 20).registered_now);
  registry.release_idle();
  EXPECT_EQ(driver.unregistered_unmapped, 0);
}

// Window registrations run outside the registry's lock: two acquirers of one window at once both
// register, and the one that comes back second takes the first's (its own is unregistered); one
// is kept, and find_window (which never registers) finds it.
TEST(PageCacheRegistry, TwoAcquirersOfOneWindowAtOnceKeepOneRegistration) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  constexpr std::uint64_t kWindow = 64 << 10;
  test::write_file(dir / "slab", std::string(2 * kWindow, 'w'));
  PlatformFile f = open_file(dir / "slab");
  std::atomic<int> inside{0}, registered{0}, unregistered{0};
  PageCacheRegistrar stand_in;
  stand_in.name = "host stand-in";
  stand_in.serves = [](const Device& d) { return !d.is_cuda(); };
  stand_in.register_range = [&](const std::byte*, std::uint64_t) {
    ++inside;  // both acquirers inside at once (bounded: a serialised registry fails below)
    for (int i = 0; i < 5000 && inside < 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++registered;
  };
  stand_in.unregister_range = [&](const std::byte*) { ++unregistered; };
  PageCacheRegistry registry(stand_in);
  const auto none = registry.find_window(f, 0, kWindow);
  EXPECT_FALSE(none.lease);
  EXPECT_EQ(none.why_not, "not registered");
  PageCacheRegistry::Acquired a, b;
  std::thread first([&] { a = registry.acquire_window(f, 0, kWindow, 1 << 20); });
  std::thread second([&] { b = registry.acquire_window(f, 0, kWindow, 1 << 20); });
  first.join();
  second.join();
  ASSERT_TRUE(a.lease) << a.why_not;
  ASSERT_TRUE(b.lease) << b.why_not;
  EXPECT_EQ(registered, 2);
  EXPECT_EQ(a.lease.data(), b.lease.data());
  EXPECT_EQ(registry.registrations(), 1u);
  EXPECT_EQ(unregistered, 1);
  const auto found = registry.find_window(f, 0, kWindow);
  ASSERT_TRUE(found.lease);
  EXPECT_FALSE(found.registered_now);
  EXPECT_EQ(found.lease.data(), a.lease.data());
}

// A writer's release_range(wait) returns only once the lease a reader holds is gone.
TEST(PageCacheRegistry, AWaitingReleaseReturnsWhenTheLastLeaseGoes) {
  if (!detail::file_mapping_supported()) GTEST_SKIP() << "no file mappings on this platform";
  TempDir dir;
  test::write_file(dir / "slab", std::string(8192, 's'));
  PlatformFile f = open_file(dir / "slab");
  StandIn driver;
  PageCacheRegistry registry(driver.registrar());
  auto held = registry.acquire_window(f, 0, 8192, 1 << 20);
  ASSERT_TRUE(held.lease) << held.why_not;
  std::atomic<bool> released{false};
  std::thread writer([&] {
    registry.release_range(f.identity(), 0, 4096, true);
    released = true;
  });
  // The writer cannot finish while the lease is held; it does once it goes.
  while (registry.registrations() != 0) std::this_thread::yield();
  EXPECT_FALSE(released.load());
  EXPECT_EQ(driver.unregistered, 0);
  held.lease = {};
  writer.join();
  EXPECT_TRUE(released.load());
  EXPECT_EQ(driver.unregistered, 1);
  EXPECT_EQ(registry.registered_bytes(), 0u);
}

}  // namespace
}  // namespace ferry
