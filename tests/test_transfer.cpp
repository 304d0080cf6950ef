// The transfer core with host memory: round trips in both directions, concurrent users of one
// staging pool, per-extent failures, cancellation, teardown with work in flight, thread
// creation failures, and the file set's bound and identity checks. Bit-exact throughout.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "ferry/error.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/transfer.hpp"
#include "platform/file.hpp"
#include "services/pinned_pool.hpp"
#include "services/worker_pool.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

std::vector<std::byte> read_back(const std::filesystem::path& file, std::uint64_t offset,
                                 std::uint64_t size) {
  std::vector<std::byte> out(size);
  std::ifstream in(file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(size));
  EXPECT_EQ(static_cast<std::uint64_t>(in.gcount()), size);
  return out;
}

MemorySpan host(std::vector<std::byte>& v, std::uint64_t at = 0, std::uint64_t n = UINT64_MAX) {
  return {Device::cpu(), v.data() + at, std::min<std::uint64_t>(n, v.size() - at)};
}

bool direct_writes_work(const std::filesystem::path& dir) {
  auto set = FileSet::create();
  set->add(dir / "probe.bin", FileAccess::ReadWrite);
  return set->acquire(0, true)->has_direct();
}

void expect_done(const Ticket& t) {
  for (std::size_t e = 0; e < t.extent_count(); ++e)
    EXPECT_EQ(t.status(e).state, ExtentStatus::State::Done) << e << ": " << t.status(e).error;
}

class RoundTrip : public ::testing::TestWithParam<IoMode> {};

TEST_P(RoundTrip, MemoryToFileToMemoryIsExactAtAnyOffsetAndSize) {
  TempDir dir;
  if (GetParam() == IoMode::Direct && !direct_writes_work(dir.path()))
    GTEST_SKIP() << "no O_DIRECT here";
  auto set = FileSet::create();
  set->add(dir / "data.bin", FileAccess::ReadWrite);
  TransferOptions options;
  options.io = GetParam();
  options.chunk_bytes = 1 << 20;  // large extents are split across workers and slots
  const std::uint64_t sizes[] = {1, 4095, 4096, 4097, 70001, (1 << 20) + 3, 64ull << 20};
  const std::uint64_t offsets[] = {0, 1, 4096, 12345};
  std::uint64_t at = 0;
  std::uint64_t seed = 1;
  for (std::uint64_t size : sizes)
    for (std::uint64_t offset : offsets) {
      if (size == (64ull << 20) && offset != 1 && offset != 0) continue;  // keep it short
      auto bytes = test::random_bytes(size, seed++);
      const std::uint64_t where = at + offset;
      {
        Ticket put = submit(set, Direction::MemoryToFile, {{0, where, {host(bytes)}}}, options);
        put.wait();
        put.rethrow_if_failed();
        expect_done(put);
      }
      std::vector<std::byte> back(size);
      Ticket get = submit(set, Direction::FileToMemory, {{0, where, {host(back)}}}, options);
      get.wait();
      get.rethrow_if_failed();
      ASSERT_EQ(back, bytes) << "size " << size << " at " << where;
      ASSERT_EQ(read_back(dir / "data.bin", where, size), bytes);
      at = where + size;
    }
}

INSTANTIATE_TEST_SUITE_P(Paths, RoundTrip, ::testing::Values(IoMode::Buffered, IoMode::Direct));

TEST(Transfer, NeighbouringBytesSurviveUnalignedWrites) {
  TempDir dir;
  auto original = test::random_bytes(5 * 4096, 7);
  test::write_file(dir / "f.bin",
                   std::string(reinterpret_cast<char*>(original.data()), original.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin", FileAccess::ReadWrite);
  auto patch = test::random_bytes(2 * 4096 + 10, 8);
  TransferOptions options;
  options.durable = true;
  Ticket t = submit(set, Direction::MemoryToFile, {{0, 4090, {host(patch)}}}, options);
  t.wait();
  t.rethrow_if_failed();
  auto expected = original;
  std::memcpy(expected.data() + 4090, patch.data(), patch.size());
  EXPECT_EQ(read_back(dir / "f.bin", 0, expected.size()), expected);
}

TEST(Transfer, ExtentsGatherAndScatterSeveralSpans) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "f.bin", FileAccess::ReadWrite);
  auto a = test::random_bytes(1000, 1), b = test::random_bytes(5000, 2),
       c = test::random_bytes(7, 3);
  Ticket put = submit(set, Direction::MemoryToFile, {{0, 333, {host(a), host(b), host(c)}}}, {});
  put.wait();
  put.rethrow_if_failed();
  std::vector<std::byte> all(6007), part(100);
  Ticket get = submit(
      set, Direction::FileToMemory,
      {{0, 333, {host(all)}},
       {0, 333 + 990, {host(part, 0, 10), {Device::cpu(), nullptr, 80}, host(part, 10, 10)}}},
      {});
  get.wait();
  get.rethrow_if_failed();
  std::vector<std::byte> expected(a);
  expected.insert(expected.end(), b.begin(), b.end());
  expected.insert(expected.end(), c.begin(), c.end());
  EXPECT_EQ(all, expected);
  EXPECT_TRUE(std::equal(part.begin(), part.begin() + 10, expected.begin() + 990));
  EXPECT_TRUE(std::equal(part.begin() + 10, part.begin() + 20, expected.begin() + 1080));
}

// Eight threads at once, reads and writes of their own files, through one staging pool whose
// bound is far below what they would take alone.
TEST(Transfer, ConcurrentUsersShareOneBoundedPool) {
  TempDir dir;
  const std::uint64_t limit = 24ull << 20;
  const std::uint64_t old_limit = staging_limit();
  set_staging_limit(limit);
  release_staging_memory();
  std::atomic<int> failures{0};
  std::vector<std::thread> users;
  for (int u = 0; u < 8; ++u)
    users.emplace_back([&, u] {
      try {
        auto set = FileSet::create();
        set->add(dir / ("u" + std::to_string(u)), FileAccess::ReadWrite);
        TransferOptions options;
        options.chunk_bytes = (256 << 10) + 4096 * u;
        options.threads = 4;
        options.io = u % 2 ? IoMode::Buffered : IoMode::Auto;
        for (int round = 0; round < 3; ++round) {
          auto bytes = test::random_bytes((3 << 20) + 17 * u + round, 100 * u + round);
          std::vector<Extent> extents;
          for (std::uint64_t at = 0; at < bytes.size(); at += 300000)
            extents.push_back({0, at + 5, {host(bytes, at, 300000)}});
          Ticket put = submit(set, Direction::MemoryToFile, extents, options);
          put.wait();
          put.rethrow_if_failed();
          std::vector<std::byte> back(bytes.size());
          Ticket get = submit(set, Direction::FileToMemory, {{0, 5, {host(back)}}}, options);
          get.wait();
          get.rethrow_if_failed();
          if (back != bytes) ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  for (auto& t : users) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(staging_high_water(), limit);
  EXPECT_GT(staging_high_water(), 0u);
  set_staging_limit(old_limit);
}

TEST(Transfer, OneBadExtentFailsAloneWhileTheOthersLand) {
  TempDir dir;
  auto content = test::random_bytes(100000, 9);
  test::write_file(dir / "ok.bin",
                   std::string(reinterpret_cast<char*>(content.data()), content.size()));
  test::write_file(dir / "gone.bin", "soon gone");
  auto set = FileSet::create(1);  // one open at a time: gone.bin is closed when ok.bin opens
  set->add(dir / "gone.bin");
  set->add(dir / "ok.bin");
  std::filesystem::remove(dir / "gone.bin");
  set->acquire(1, false);
  std::vector<std::byte> a(1000), past(1000), b(5000), lost(5);
  TransferOptions options;
  options.threads = 1;
  Ticket t = submit(
      set, Direction::FileToMemory,
      {{1, 0, {host(a)}}, {1, 99500, {host(past)}}, {0, 0, {host(lost)}}, {1, 90000, {host(b)}}},
      options);
  t.wait();
  EXPECT_EQ(t.status(0).state, ExtentStatus::State::Done);
  EXPECT_EQ(t.status(3).state, ExtentStatus::State::Done);
  EXPECT_EQ(t.status(1).state, ExtentStatus::State::Failed);
  EXPECT_NE(t.status(1).error.find("ok.bin"), std::string::npos) << t.status(1).error;
  EXPECT_NE(t.status(1).error.find("end of file"), std::string::npos) << t.status(1).error;
  EXPECT_EQ(t.status(2).state, ExtentStatus::State::Failed);
  EXPECT_NE(t.status(2).error.find("changed underneath"), std::string::npos) << t.status(2).error;
  EXPECT_TRUE(std::equal(a.begin(), a.end(), content.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), content.begin() + 90000));
  EXPECT_THROW(t.rethrow_if_failed(), std::exception);
}

// What the observer saw of each extent, checked to come in order, each byte once, one call at a
// time per extent.
struct Observed {
  explicit Observed(std::size_t extents) : bytes(extents), busy(extents) {}
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::atomic<bool>> busy;
  std::atomic<int> misordered{0}, overlapping{0};
  std::function<void(std::size_t, std::uint64_t, const std::byte*, std::uint64_t)> observer() {
    return [this](std::size_t e, std::uint64_t offset, const std::byte* data, std::uint64_t n) {
      if (busy[e].exchange(true)) ++overlapping;
      if (offset != bytes[e].size()) ++misordered;
      bytes[e].insert(bytes[e].end(), data, data + n);
      std::this_thread::yield();  // gives another worker the chance to overtake
      busy[e] = false;
    };
  }
};

TEST(Transfer, TheObserverSeesEachExtentsBytesInOrderOnceBothWays) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "data.bin", FileAccess::ReadWrite);
  // Extents of many pieces (64 KiB chunks over 8 workers), unaligned ones, several spans.
  const std::uint64_t sizes[] = {3ull << 20, 4096, 70001, (1 << 20) + 3, 5ull << 20, 12345};
  std::vector<std::vector<std::byte>> data, back;
  std::vector<Extent> puts, gets;
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    data.push_back(test::random_bytes(sizes[i], 40 + i));
    back.emplace_back(sizes[i]);
    const std::uint64_t half = sizes[i] / 2;
    puts.push_back({0, at, {host(data[i], 0, half), host(data[i], half)}});
    gets.push_back(i % 2 ? Extent{0, at, {host(back[i])}}
                         : Extent{0, at, {host(back[i], 0, half), host(back[i], half)}});
    at += sizes[i] + (i % 2 ? 4096 : 1);
  }
  TransferOptions options;
  options.chunk_bytes = 64 << 10;
  options.threads = 8;
  // Extent by extent, and in rounds across them (interleave, as the KV store asks); 1 MiB chunks
  // read from the page cache go in slices, each observed as it lands.
  for (const auto& [interleave, chunk] :
       {std::pair{false, 64 << 10}, std::pair{true, 64 << 10}, std::pair{true, 1 << 20}}) {
    options.interleave = interleave;
    options.chunk_bytes = chunk;
    for (const Direction direction : {Direction::MemoryToFile, Direction::FileToMemory}) {
      for (auto& b : back) std::fill(b.begin(), b.end(), std::byte{0});
      Observed seen(std::size(sizes));
      options.observer = seen.observer();
      const bool writing = direction == Direction::MemoryToFile;
      Ticket t = submit(set, direction, writing ? puts : gets, options);
      t.wait();
      expect_done(t);
      EXPECT_EQ(seen.misordered, 0);
      EXPECT_EQ(seen.overlapping, 0);
      for (std::size_t i = 0; i < std::size(sizes); ++i)
        EXPECT_TRUE(seen.bytes[i] == data[i])
            << "extent " << i << (writing ? " put" : " get") << (interleave ? ", interleaved" : "");
    }
    for (std::size_t i = 0; i < std::size(sizes); ++i) EXPECT_TRUE(back[i] == data[i]) << i;
  }
}

// Many blocks read for an observer with interleave (the KV store's gets): each worker takes whole
// extents (staged_units.hpp) and observes them itself; from the page cache in slices, each
// group's copies queued once it is all read. Bytes and observations exact, in order, each once.
TEST(Transfer, AnObservedInterleavedReadOfManyExtentsSeesEachInOrder) {
  TempDir dir;
  const std::uint64_t count = 48;
  std::vector<std::vector<std::byte>> data;
  std::string content;
  std::vector<Extent> gets;
  std::vector<std::vector<std::byte>> back;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t size = (i % 3 == 0 ? (3 << 20) + 4096 * i : (1 << 20) - 7 * i) + i % 2;
    data.push_back(test::random_bytes(size, 300 + i));
    back.emplace_back(size);
    gets.push_back(
        i % 4 == 1
            ? Extent{0, content.size(), {host(back[i], 0, size / 3), host(back[i], size / 3)}}
            : Extent{0, content.size(), {host(back[i])}});
    content.append(reinterpret_cast<const char*>(data[i].data()), size);
    content.resize((content.size() + 4095) / 4096 * 4096 + (i % 5 == 0 ? 4096 : 0), '\0');
  }
  test::write_file(dir / "data.bin", content);
  auto set = FileSet::create();
  set->add(dir / "data.bin");
  for (const IoMode io : {IoMode::Buffered, IoMode::Auto}) {
    for (auto& b : back) std::fill(b.begin(), b.end(), std::byte{0});
    TransferOptions options;
    options.threads = 4;
    options.interleave = true;
    options.io = io;
    Observed seen(count);
    options.observer = seen.observer();
    Ticket t = submit(set, Direction::FileToMemory, gets, options);
    t.wait();
    expect_done(t);
    EXPECT_EQ(seen.misordered, 0);
    EXPECT_EQ(seen.overlapping, 0);
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT_TRUE(seen.bytes[i] == data[i]) << "extent " << i;
      EXPECT_TRUE(back[i] == data[i]) << "extent " << i;
    }
  }
}

TEST(Transfer, AFailedExtentLeavesTheObserverWaitingForNothing) {
  TempDir dir;
  auto content = test::random_bytes(3 << 20, 11);
  test::write_file(dir / "data.bin",
                   std::string(reinterpret_cast<char*>(content.data()), content.size()));
  auto set = FileSet::create();
  set->add(dir / "data.bin");
  // The second extent runs past the end: its last pieces fail, the earlier ones are observed.
  std::vector<std::byte> a(1 << 20), past(3 << 20), b(1 << 20);
  TransferOptions options;
  options.chunk_bytes = 64 << 10;
  options.threads = 8;
  Observed seen(3);
  options.observer = seen.observer();
  Ticket t =
      submit(set, Direction::FileToMemory,
             {{0, 0, {host(a)}}, {0, 1 << 20, {host(past)}}, {0, 2 << 20, {host(b)}}}, options);
  t.wait();
  EXPECT_EQ(t.status(0).state, ExtentStatus::State::Done);
  EXPECT_EQ(t.status(1).state, ExtentStatus::State::Failed);
  EXPECT_EQ(t.status(2).state, ExtentStatus::State::Done);
  EXPECT_EQ(seen.misordered, 0);
  EXPECT_TRUE(std::equal(seen.bytes[0].begin(), seen.bytes[0].end(), content.begin()));
  EXPECT_EQ(seen.bytes[0].size(), a.size());
  EXPECT_EQ(seen.bytes[2].size(), b.size());
  EXPECT_LT(seen.bytes[1].size(), past.size());
  EXPECT_TRUE(std::equal(seen.bytes[1].begin(), seen.bytes[1].end(), content.begin() + (1 << 20)));
}

TEST(Transfer, CancelStopsBeforeTheNextChunk) {
  TempDir dir;
  auto content = test::random_bytes(1 << 20, 10);
  test::write_file(dir / "f.bin",
                   std::string(reinterpret_cast<char*>(content.data()), content.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  std::vector<std::byte> out(content.size());
  std::vector<Extent> extents;
  for (std::uint64_t at = 0; at < out.size(); at += 4096)
    extents.push_back({0, at, {host(out, at, 4096)}});
  TransferOptions options;
  options.threads = 1;
  Ticket* self = nullptr;
  std::atomic<bool> ready{false};
  Ticket t;
  {
    // The progress callback needs the ticket; submit with one worker, which waits for nothing
    // before its first chunk, so the pointer is set through a latch.
    options.progress = [&](std::uint64_t done, std::uint64_t) {
      while (!ready) std::this_thread::yield();
      if (done >= 3 * 4096) self->cancel();
    };
    t = submit(set, Direction::FileToMemory, extents, options);
    self = &t;
    ready = true;
  }
  t.wait();
  EXPECT_TRUE(t.cancelled());
  std::size_t done = 0, cancelled = 0;
  for (std::size_t e = 0; e < t.extent_count(); ++e) {
    const auto s = t.status(e);
    if (s.state == ExtentStatus::State::Done) {
      ++done;
      EXPECT_EQ(std::memcmp(out.data() + e * 4096, content.data() + e * 4096, 4096), 0);
    } else {
      EXPECT_EQ(s.state, ExtentStatus::State::Cancelled);
      ++cancelled;
    }
  }
  EXPECT_GE(done, 3u);
  EXPECT_GT(cancelled, 0u);
  EXPECT_THROW(t.rethrow_if_failed(), std::runtime_error);
}

TEST(Transfer, DroppingTheFileSetAndTicketWithWorkInFlightIsSafe) {
  TempDir dir;
  auto content = test::random_bytes(8 << 20, 11);
  test::write_file(dir / "f.bin",
                   std::string(reinterpret_cast<char*>(content.data()), content.size()));
  std::vector<std::byte> out(content.size());
  {
    auto set = FileSet::create();
    set->add(dir / "f.bin");
    std::vector<Extent> extents;
    for (std::uint64_t at = 0; at < out.size(); at += 65536)
      extents.push_back({0, at, {host(out, at, 65536)}});
    Ticket t = submit(set, Direction::FileToMemory, extents, {});
    set.reset();  // the ticket keeps the files it needs
  }               // the ticket's destructor waits: `out` is complete and no longer written
  EXPECT_EQ(out, content);
}

TEST(Transfer, BadSubmissionsAreRefusedUpFront) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "f.bin", FileAccess::ReadWrite);
  std::vector<std::byte> v(10);
  EXPECT_THROW(submit(set, Direction::FileToMemory, {{1, 0, {host(v)}}}, {}),
               std::invalid_argument);
  EXPECT_THROW(submit(set, Direction::MemoryToFile, {{0, 0, {{Device::cpu(), nullptr, 5}}}}, {}),
               std::invalid_argument);
  TransferOptions none;
  none.staging_bytes = 0;
  EXPECT_THROW(submit(set, Direction::FileToMemory, {{0, 0, {host(v)}}}, none),
               std::invalid_argument);
}

// issue 12 item 1: a thread the system refuses is not fatal.
TEST(WorkerPool, RunsWithTheThreadsItGotAndSaysWhy) {
  int started = 0;
  detail::WorkerPool pool(8, [&](std::function<void()> body) {
    if (started == 2) throw std::system_error(EAGAIN, std::generic_category(), "thread refused");
    ++started;
    return std::thread(std::move(body));
  });
  EXPECT_EQ(pool.reserve(8), 2u);
  EXPECT_NE(pool.last_failure().find("thread refused"), std::string::npos);
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) pool.post([&] { ++ran; });
  while (ran < 20) std::this_thread::yield();
}

TEST(WorkerPool, WithNoThreadAtAllJobsRunOnTheCaller) {
  detail::WorkerPool pool(8, [](std::function<void()>) -> std::thread {
    throw std::system_error(EAGAIN, std::generic_category(), "no threads");
  });
  EXPECT_EQ(pool.reserve(4), 0u);
  std::thread::id ran_on;
  pool.post([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(PinnedPool, LeasesTakeFewerSlotsOrWaitButNeverExceedTheBound) {
  detail::PinnedPool pool(3 * 4096);
  auto first = pool.lease(4096, 2, 1, nullptr);
  EXPECT_EQ(first.slots(), 2u);
  auto second = pool.lease(4096, 4, 1, nullptr);  // one slot is left: it takes that
  EXPECT_EQ(second.slots(), 1u);
  std::atomic<bool> released{false};
  std::thread waiter([&] {
    auto third = pool.lease(4096, 2, 2, nullptr);  // needs two: waits for `first`
    EXPECT_TRUE(released.load());
    EXPECT_EQ(third.slots(), 2u);
  });
  released = true;
  { auto gone = std::move(first); }
  waiter.join();
  EXPECT_LE(pool.stats().high_water, 3u * 4096);
  EXPECT_THROW(pool.lease(4096, 4, 4, nullptr), std::invalid_argument);
}

// Two idle slabs, one larger: a lease of the smaller one's slot size takes that one back (a GPU
// slab of another slot size would be registered again), a lease of a third size the larger.
TEST(PinnedPool, ALeaseTakesBackASlabOfItsSlotSizeBeforeALargerOne) {
  detail::PinnedPool pool(64 * 4096);
  std::byte* small_slab = nullptr;
  std::byte* large_slab = nullptr;
  {
    auto large = pool.lease(4 * 4096, 4, 1, nullptr);
    auto small = pool.lease(2 * 4096, 2, 1, nullptr);
    large_slab = large.slot(0);
    small_slab = small.slot(0);
  }
  EXPECT_EQ(pool.lease(2 * 4096, 2, 1, nullptr).slot(0), small_slab);
  EXPECT_EQ(pool.lease(3 * 4096, 2, 1, nullptr).slot(0), large_slab);
  EXPECT_EQ(pool.stats().held_bytes, 20u * 4096);  // no slab made for either
}

TEST(FileSet, KeepsAtMostMaxOpenAndChecksIdentityOnReopen) {
  TempDir dir;
  auto set = FileSet::create(2);
  for (int i = 0; i < 5; ++i) {
    test::write_file(dir / ("f" + std::to_string(i)), std::string(100 + i, 'a' + i));
    set->add(dir / ("f" + std::to_string(i)));
  }
  EXPECT_LE(set->open_now(), 2u);
  EXPECT_EQ(set->acquire(0, false)->identity().size, 100u);
  // f1 is closed now; replacing its path by a rename makes reopening refuse it.
  test::write_file(dir / "new", std::string(101, 'z'));
  std::filesystem::rename(dir / "new", dir / "f1");
  try {
    set->acquire(1, false);
    FAIL() << "expected an error";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("changed underneath"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f1"), std::string::npos) << e.what();
  }
}

TEST(FileSet, TooManyOpenFilesIsNamedAsSuch) {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's type checks open files of their own while the message is built: with none left,
  // they report the check itself as an error.
  GTEST_SKIP() << "sanitizer runtimes need descriptors of their own";
#endif
  TempDir dir;
  test::write_file(dir / "f", "x");
  const pid_t child = ::fork();
  if (child == 0) {
    // Every descriptor the limit allows taken (by copies of stdin), none closed: sanitizer
    // runtimes keep descriptors of their own.
    struct rlimit limit {};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_cur, 256);
    ::setrlimit(RLIMIT_NOFILE, &limit);
    while (::dup(0) >= 0) {
    }
    try {
      detail::PlatformFile::open(dir / "f", FileAccess::Read, false);
    } catch (const std::system_error& e) {
      _exit(std::string(e.what()).find("too many open files") != std::string::npos ? 0 : 2);
    }
    _exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// issue 12 item 7: a checkpoint of many shards loads under a small descriptor limit.
TEST(FileSet, ManyShardsLoadUnderASmallDescriptorLimit) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in a child forked from threads";
#endif
  TempDir dir;
  std::map<std::string, std::vector<std::byte>> written;
  for (int s = 0; s < 300; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "model-%05d.safetensors", s);
    auto w = test::write_random_checkpoint(dir / name,
                                           {{"t" + std::to_string(s), DType::U8, {77u + s}}}, s);
    written.insert(w.begin(), w.end());
  }
  const pid_t child = ::fork();
  if (child == 0) {
    struct rlimit limit {};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = 64;
    ::setrlimit(RLIMIT_NOFILE, &limit);
    try {
      auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir.path()));
      LoadOptions options;
      options.io = IoMode::Buffered;
      auto loaded = load(ckpt, options);
      for (const auto& t : loaded.tensors())
        if (std::memcmp(t.data, written.at(t.info->name).data(), t.info->size) != 0) _exit(3);
      _exit(loaded.tensors().size() == 300 ? 0 : 4);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      _exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(Checkpoint, LoadsTheFilesItParsedEvenAfterThePathIsReplaced) {
  TempDir dir;
  auto written =
      test::write_random_checkpoint(dir / "m.safetensors", {{"x", DType::U8, {5000}}}, 21);
  auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir / "m.safetensors"));
  test::write_random_checkpoint(dir / "other.safetensors", {{"x", DType::U8, {5000}}}, 22);
  std::filesystem::rename(dir / "other.safetensors", dir / "m.safetensors");
  auto loaded = load(ckpt, LoadOptions{});
  EXPECT_EQ(std::memcmp(loaded.find("x")->data, written.at("x").data(), 5000), 0);
}

TEST(Load, ASecondLoadReusesTheStagingOfTheFirst) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", {{"x", DType::U8, {3 << 20}}}, 23);
  auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir / "m.safetensors"));
  LoadOptions options;
  options.chunk_bytes = 1 << 20;
  options.reader_threads = 1;  // one lease: the same slab both times
  release_staging_memory();
  load(ckpt, options);
  const auto held = detail::staging_pool().stats().held_bytes;
  load(ckpt, options);
  EXPECT_EQ(detail::staging_pool().stats().held_bytes, held);  // nothing new allocated
  EXPECT_GT(detail::transfer_workers().threads(), 0u);
}

}  // namespace
}  // namespace ferry
