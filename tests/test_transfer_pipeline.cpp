// The staged path's pipeline with host memory: many small extents grouped into shared staging
// slots and written ahead of their copies, at unaligned offsets and sizes; one bad extent among
// grouped ones (a read past the end, a write past the file-size limit) fails alone; the staging
// bound holds while writes pipeline. Bit-exact throughout; run under TSan in CI.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "ferry/error.hpp"
#include "ferry/transfer.hpp"
#include "platform/file.hpp"
#include "staging_limit.hpp"
#include "test_support.hpp"
#include "services/pinned_pool.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/staged/staged_units.hpp"
#include "services/worker_pool.hpp"

namespace ferry {
namespace {

using test::StagingLimit;
using test::TempDir;

std::vector<std::byte> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

MemorySpan host(std::vector<std::byte>& v, std::uint64_t at, std::uint64_t n) {
  return {Device::cpu(), v.data() + at, n};
}

bool direct_works(const std::filesystem::path& dir) {
  auto set = FileSet::create();
  set->add(dir / "probe.bin", FileAccess::ReadWrite);
  return set->acquire(0, true)->has_direct();
}

// `count` extents of 1 to `largest` bytes, mostly back to back in the file (every 17th after a
// gap), each from its own place in `memory`; some split over two spans.
struct Layout {
  std::vector<Extent> extents;
  std::uint64_t file_bytes = 0;
};
Layout make_layout(std::vector<std::byte>& memory, std::size_t count, std::uint64_t largest,
                   std::uint64_t seed) {
  std::mt19937_64 random(seed);
  Layout l;
  std::uint64_t file_at = 3, memory_at = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t size = 1 + random() % largest;
    if (i % 17 == 16) file_at += 1 + random() % 5000;
    Extent x{0, file_at, {}};
    if (size > 1 && i % 5 == 0) {
      x.spans.push_back(host(memory, memory_at, size / 2));
      x.spans.push_back(host(memory, memory_at + size / 2, size - size / 2));
    } else {
      x.spans.push_back(host(memory, memory_at, size));
    }
    l.extents.push_back(std::move(x));
    file_at += size;
    memory_at += size;
  }
  l.file_bytes = file_at;
  return l;
}

std::uint64_t total_size(const Extent& x) {
  std::uint64_t n = 0;
  for (const auto& s : x.spans) n += s.size;
  return n;
}

// The cut: pieces tile each extent exactly, split inside an extent only on page boundaries of
// the file; groups are runs of pieces back to back in one file within the limit of their place
// (quarter chunks in the first and last waves, whole chunks between).
TEST(StagedPlan, PiecesTileExtentsAndGroupsStayWithinTheirLimits) {
  std::vector<Extent> extents;
  std::mt19937_64 random(7);
  std::uint64_t file_at = 100;
  for (int i = 0; i < 300; ++i) {
    const std::uint64_t size = 1 + random() % (3 << 20);
    const std::uint32_t file = i < 200 ? 0 : 1;
    if (i % 50 == 49) file_at += 12345;  // a gap
    extents.push_back(
        {file,
         file_at,
         {{Device::cpu(), nullptr, size / 3}, {Device::cpu(), nullptr, size - size / 3}}});
    file_at += size;
  }
  const std::uint64_t chunk = 4 << 20, edge = 16 << 20, edge_chunk = 1 << 20;
  const detail::StagedPlan plan = detail::plan_staged(extents, chunk, edge, edge_chunk);
  std::uint64_t total = 0;
  for (const auto& x : extents) total += total_size(x);
  // Pieces: in order, tiling each extent.
  std::vector<std::uint64_t> covered(extents.size(), 0);
  std::vector<std::uint32_t> count(extents.size(), 0);
  for (const auto& p : plan.pieces) {
    ASSERT_EQ(p.extent_offset, covered[p.extent]);
    covered[p.extent] += p.size;
    ++count[p.extent];
    ASSERT_LE(p.size, chunk);
    const std::uint64_t end = extents[p.extent].file_offset + p.extent_offset + p.size;
    if (p.extent_offset + p.size < total_size(extents[p.extent])) {
      EXPECT_EQ(end % 4096, 0u);
    }
  }
  for (std::size_t e = 0; e < extents.size(); ++e) {
    EXPECT_EQ(covered[e], total_size(extents[e]));
    EXPECT_EQ(count[e], plan.pieces_per_extent[e]);
  }
  // Groups: consecutive pieces, back to back, within the limit of their place.
  std::uint32_t next = 0;
  std::uint64_t position = 0, largest = 0, merged_beyond_edge_size = 0;
  for (const auto& g : plan.groups) {
    ASSERT_EQ(g.first, next);
    std::uint64_t at = g.file_offset, size = 0;
    for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
      const auto& p = plan.pieces[i];
      EXPECT_EQ(extents[p.extent].file, g.file);
      EXPECT_EQ(extents[p.extent].file_offset + p.extent_offset, at);
      at += p.size;
      size += p.size;
    }
    EXPECT_EQ(size, g.size);
    const bool at_an_edge = position < edge || position + edge >= total;
    EXPECT_LE(g.size, at_an_edge ? edge_chunk : chunk) << "group at " << position;
    merged_beyond_edge_size += g.size > edge_chunk;
    largest = std::max(largest, g.size);
    position += g.size;
    next = g.first + g.count;
  }
  EXPECT_EQ(next, plan.pieces.size());
  EXPECT_EQ(position, total);
  EXPECT_EQ(plan.largest_group, largest);
  EXPECT_GT(merged_beyond_edge_size, 0u);  // the middle is grouped in larger runs
  // A small submission has no edges: one group.
  const auto small =
      detail::plan_staged({{0, 0, {{Device::cpu(), nullptr, 3 << 20}}}}, chunk, edge, edge_chunk);
  EXPECT_EQ(small.groups.size(), 1u);
}

// Round robin: each extent's pieces tile it in order, and the k-th piece of every extent comes
// before the (k+1)-th of any; groups still join pieces back to back in one file.
TEST(StagedPlan, RoundRobinTakesEachExtentsNextPieceInTurn) {
  std::vector<Extent> extents;
  std::uint64_t file_at = 0;
  const std::uint64_t sizes[] = {9 << 20, 64 << 10, 64 << 10, 3 << 20, 0, 4097, 17 << 20, 1 << 20};
  for (const std::uint64_t size : sizes) {
    extents.push_back({0, file_at, {{Device::cpu(), nullptr, size}}});
    file_at += (size + 4095) / 4096 * 4096;
  }
  const std::uint64_t chunk = 4 << 20;
  for (const std::uint64_t edge : {std::uint64_t{0}, std::uint64_t{4} << 20}) {
    const detail::StagedPlan plan = detail::plan_staged(extents, chunk, edge, 1 << 20, true);
    std::vector<std::uint64_t> covered(extents.size(), 0);
    std::vector<std::uint32_t> round(extents.size(), 0);
    std::uint32_t current = 0;  // the round of the last piece seen
    for (const auto& p : plan.pieces) {
      ASSERT_EQ(p.extent_offset, covered[p.extent]);
      covered[p.extent] += p.size;
      ASSERT_GE(round[p.extent], current) << "a piece came before its round";
      current = round[p.extent]++;
    }
    for (std::size_t e = 0; e < extents.size(); ++e) {
      EXPECT_EQ(covered[e], sizes[e]);
      EXPECT_EQ(round[e], plan.pieces_per_extent[e]);
    }
    EXPECT_EQ(plan.pieces_per_extent[4], 0u);  // an empty extent has no piece
    // The first round's pieces come first, one per non-empty extent, in extent order.
    for (std::uint32_t i = 0; i < 7; ++i) EXPECT_EQ(plan.pieces[i].extent, i < 4 ? i : i + 1);
    std::uint32_t next = 0;
    for (const auto& g : plan.groups) {
      ASSERT_EQ(g.first, next);
      std::uint64_t at = g.file_offset;
      for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
        EXPECT_EQ(extents[plan.pieces[i].extent].file_offset + plan.pieces[i].extent_offset, at);
        at += plan.pieces[i].size;
      }
      EXPECT_EQ(at - g.file_offset, g.size);
      EXPECT_LE(g.size, chunk);
      next = g.first + g.count;
    }
    EXPECT_EQ(next, plan.pieces.size());
  }
  // Small extents back to back still share groups.
  std::vector<Extent> small;
  for (std::uint64_t i = 0; i < 16; ++i)
    small.push_back({0, i * (256 << 10), {{Device::cpu(), nullptr, 256 << 10}}});
  EXPECT_EQ(detail::plan_staged(small, chunk, 0, 0, true).groups.size(), 1u);
}

// An observed read's units: no extent crosses two, every group is in one, and they are given up
// where a few large extents would leave workers idle.
TEST(StagedUnits, NoExtentCrossesTwoUnitsAndFewLargeExtentsTakeRounds) {
  std::vector<Extent> extents;
  std::uint64_t file_at = 0;
  // Small extents back to back (sharing groups), ones of several chunks, an empty one.
  const std::uint64_t sizes[] = {1 << 20, 1 << 20, 9 << 20, 0, 64 << 10, 6 << 20, 1 << 20, 4097};
  for (int copy = 0; copy < 8; ++copy)
    for (const std::uint64_t size : sizes) {
      extents.push_back({0, file_at, {{Device::cpu(), nullptr, size}}});
      file_at += (size + 4095) / 4096 * 4096;
    }
  const detail::StagedPlan plan = detail::plan_staged(extents, 4 << 20, 0, 0, false);
  const std::vector<std::size_t> units = detail::observed_units(plan, 4);
  ASSERT_GE(units.size(), 2u);
  EXPECT_EQ(units.front(), 0u);
  EXPECT_EQ(units.back(), plan.groups.size());
  std::vector<std::size_t> unit_of(extents.size(), SIZE_MAX);
  for (std::size_t u = 0; u + 1 < units.size(); ++u) {
    ASSERT_LT(units[u], units[u + 1]);
    for (std::size_t g = units[u]; g < units[u + 1]; ++g)
      for (std::uint32_t i = plan.groups[g].first; i < plan.groups[g].first + plan.groups[g].count;
           ++i) {
        const std::uint32_t e = plan.pieces[i].extent;
        if (unit_of[e] == SIZE_MAX) unit_of[e] = u;
        EXPECT_EQ(unit_of[e], u) << "extent " << e << " crosses units";
      }
  }
  // 4 extents of 16 MiB: 4 workers take one each; 16 workers would mostly wait.
  std::vector<Extent> large;
  for (std::uint64_t i = 0; i < 4; ++i)
    large.push_back({0, i << 24, {{Device::cpu(), nullptr, 1 << 24}}});
  const detail::StagedPlan large_plan = detail::plan_staged(large, 4 << 20, 0, 0, false);
  EXPECT_EQ(detail::observed_units(large_plan, 4).size(), 5u);
  EXPECT_TRUE(detail::observed_units(large_plan, 16).empty());
  EXPECT_TRUE(detail::observed_units(large_plan, 3).empty());  // one worker does two
}

// A submission's workers are posted as one batch: every copy runs, on the pool's threads, or on
// the caller's where the system gives no thread at all.
TEST(WorkerPool, ABatchRunsEveryCopyOnThreadsOrOnTheCaller) {
  detail::WorkerPool pool(3);
  EXPECT_EQ(pool.reserve(3), 3u);
  std::atomic<int> ran{0};
  pool.post([&] { ++ran; }, 10);
  while (ran < 10) std::this_thread::yield();
  pool.post([&] { ++ran; }, 0);
  EXPECT_EQ(ran.load(), 10);

  detail::WorkerPool none(8, [](std::function<void()>) -> std::thread {
    throw std::system_error(EAGAIN, std::generic_category(), "no threads");
  });
  std::vector<std::thread::id> ran_on;
  none.post([&] { ran_on.push_back(std::this_thread::get_id()); }, 5);
  EXPECT_EQ(ran_on, std::vector<std::thread::id>(5, std::this_thread::get_id()));
}

// Threads made but not yet waiting count as idle: a batch posted right after reserve() runs on
// the threads reserved instead of making more, up to the cap (64 stacks of address space).
TEST(WorkerPool, ABatchPostedRightAfterReserveMakesNoExtraThreads) {
  detail::WorkerPool pool(64);
  ASSERT_EQ(pool.reserve(2), 2u);
  std::atomic<int> ran{0};
  pool.post([&] { ++ran; }, 2);
  EXPECT_EQ(pool.threads(), 2u);
  while (ran < 2) std::this_thread::yield();
  // One worker asked for (`--threads 1`), one job: one thread.
  detail::WorkerPool single(64);
  ASSERT_EQ(single.reserve(1), 1u);
  single.post([&] { ++ran; }, 1);
  EXPECT_EQ(single.threads(), 1u);
  single.post([&] { ++ran; });
  EXPECT_LE(single.threads(), 2u);
  while (ran < 4) std::this_thread::yield();
}

class Pipeline : public ::testing::TestWithParam<IoMode> {};

TEST_P(Pipeline, ManyUnalignedExtentsWriteAndReadBackExactly) {
  TempDir dir;
  if (GetParam() == IoMode::Direct && !direct_works(dir.path())) GTEST_SKIP() << "no O_DIRECT";
  auto memory = test::random_bytes(3000 * 9000, 41);
  Layout layout = make_layout(memory, 3000, 9000, 42);
  auto set = FileSet::create();
  set->add(dir / "f.bin", FileAccess::ReadWrite);
  TransferOptions options;
  options.io = GetParam();
  options.threads = 3;
  options.slots_per_thread = 4;
  options.chunk_bytes = 64 << 10;  // a few extents per slot
  Ticket put = submit(set, Direction::MemoryToFile, layout.extents, options);
  put.wait();
  put.rethrow_if_failed();
  EXPECT_EQ(put.stats().slots_per_thread, 4u);
  const auto written = file_bytes(dir / "f.bin");
  ASSERT_EQ(written.size(), layout.file_bytes);
  std::uint64_t memory_at = 0;
  for (std::size_t e = 0; e < layout.extents.size(); ++e) {
    const Extent& x = layout.extents[e];
    const std::uint64_t n = total_size(x);
    EXPECT_EQ(put.status(e).state, ExtentStatus::State::Done);
    EXPECT_EQ(put.status(e).bytes_done, n);
    ASSERT_EQ(std::memcmp(written.data() + x.file_offset, memory.data() + memory_at, n), 0) << e;
    memory_at += n;
  }
  // Back into other memory, through the same grouping.
  std::vector<std::byte> back(memory.size());
  std::vector<Extent> reads = layout.extents;
  for (auto& x : reads)
    for (auto& s : x.spans)
      s.data = back.data() + (static_cast<std::byte*>(s.data) - memory.data());
  Ticket get = submit(set, Direction::FileToMemory, reads, options);
  get.wait();
  get.rethrow_if_failed();
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + memory_at, memory.begin()));
}

INSTANTIATE_TEST_SUITE_P(Paths, Pipeline, ::testing::Values(IoMode::Buffered, IoMode::Direct));

TEST(Pipeline, AReadPastTheEndAmongGroupedExtentsFailsAlone) {
  TempDir dir;
  auto content = test::random_bytes(100000, 43);
  test::write_file(dir / "f.bin",
                   std::string(reinterpret_cast<char*>(content.data()), content.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  std::vector<std::byte> out(60 * 2100);
  std::vector<Extent> extents;
  for (std::uint64_t i = 0; i < 60; ++i)  // back to back: one group, reaching past the end
    extents.push_back({0, i * 2100, {host(out, i * 2100, 2100)}});
  TransferOptions options;
  options.threads = 2;
  Ticket t = submit(set, Direction::FileToMemory, extents, options);
  t.wait();
  for (std::uint64_t i = 0; i < 60; ++i) {
    const ExtentStatus s = t.status(i);
    if ((i + 1) * 2100 <= content.size()) {
      EXPECT_EQ(s.state, ExtentStatus::State::Done) << i << ": " << s.error;
      EXPECT_EQ(std::memcmp(out.data() + i * 2100, content.data() + i * 2100, 2100), 0) << i;
    } else {
      EXPECT_EQ(s.state, ExtentStatus::State::Failed) << i;
      EXPECT_NE(s.error.find("end of file"), std::string::npos) << s.error;
      EXPECT_NE(s.error.find("f.bin"), std::string::npos) << s.error;
    }
  }
  EXPECT_THROW(t.rethrow_if_failed(), std::exception);
}

// Extents that each land in one span of page-aligned host memory at aligned offsets are read
// straight into it (no staging), O_DIRECT and buffered; the bytes are exact either way, and an
// unaligned one among them still goes through staging.
TEST_P(Pipeline, AlignedHostExtentsReadStraightIntoMemoryAreExact) {
  TempDir dir;
  if (GetParam() == IoMode::Direct && !direct_works(dir.path())) GTEST_SKIP() << "no O_DIRECT";
  auto content = test::random_bytes(4 << 20, 46);
  test::write_file(dir / "f.bin",
                   std::string(reinterpret_cast<char*>(content.data()), content.size()));
  auto set = FileSet::create();
  set->add(dir / "f.bin");
  std::unique_ptr<std::byte, decltype(&std::free)> memory(
      static_cast<std::byte*>(std::aligned_alloc(4096, 4 << 20)), &std::free);
  std::memset(memory.get(), 0, 4 << 20);
  std::vector<Extent> extents;
  for (std::uint64_t at = 0; at < (4u << 20); at += 256 << 10)  // gaps: one group each
    extents.push_back(
        {0, at, {{Device::cpu(), memory.get() + at, std::uint64_t{128 << 10} + (at ? 0 : 5)}}});
  TransferOptions options;
  options.io = GetParam();
  options.threads = 2;
  Ticket t = submit(set, Direction::FileToMemory, extents, options);
  t.wait();
  t.rethrow_if_failed();
  for (const auto& x : extents)
    EXPECT_EQ(
        std::memcmp(memory.get() + x.file_offset, content.data() + x.file_offset, x.spans[0].size),
        0)
        << x.file_offset;
  EXPECT_EQ(t.stats().files.at(0).io_path,
            GetParam() == IoMode::Direct ? IoPath::Direct : IoPath::Buffered);
}

// A cancel while writes pipeline (copies queued ahead of writes): the ticket completes, each
// extent is Done (its bytes in the file) or Cancelled, and nothing hangs or writes half a piece.
TEST(Pipeline, CancellingPipelinedWritesLeavesDoneOrCancelledExtents) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "f.bin", FileAccess::ReadWrite);
  auto memory = test::random_bytes(2000 * 3000, 45);
  std::vector<Extent> extents;
  for (std::uint64_t i = 0; i < 2000; ++i)
    extents.push_back({0, i * 3000, {host(memory, i * 3000, 3000)}});
  TransferOptions options;
  options.threads = 2;
  options.slots_per_thread = 4;
  options.chunk_bytes = 64 << 10;
  std::atomic<Ticket*> self{nullptr};
  options.progress = [&](std::uint64_t done, std::uint64_t) {
    Ticket* t = self.load();
    if (t && done >= 100 * 3000) t->cancel();
  };
  Ticket t = submit(set, Direction::MemoryToFile, extents, options);
  self = &t;
  t.wait();
  const auto written = file_bytes(dir / "f.bin");
  std::size_t done = 0;
  for (std::uint64_t i = 0; i < extents.size(); ++i) {
    const ExtentStatus s = t.status(i);
    if (s.state == ExtentStatus::State::Done) {
      ++done;
      ASSERT_GE(written.size(), (i + 1) * 3000);
      EXPECT_EQ(std::memcmp(written.data() + i * 3000, memory.data() + i * 3000, 3000), 0) << i;
    } else {
      EXPECT_EQ(s.state, ExtentStatus::State::Cancelled) << i << ": " << s.error;
    }
  }
  EXPECT_GT(done, 0u);
  if (t.cancelled()) {
    EXPECT_LT(done, extents.size());
    EXPECT_THROW(t.rethrow_if_failed(), Cancelled);
  }
}

// The process's file-size limit lowered for one test (writes past it fail with EFBIG, and the
// signal that would end the process is ignored), restored after.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(std::uint64_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &_old);
    _old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lower = _old;
    lower.rlim_cur = bytes;
    _ok = ::setrlimit(RLIMIT_FSIZE, &lower) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &_old);
    std::signal(SIGXFSZ, _old_handler);
  }
  bool ok() const { return _ok; }

 private:
  struct rlimit _old {};
  void (*_old_handler)(int) = nullptr;
  bool _ok = false;
};

TEST(Pipeline, AWritePastTheFileSizeLimitAmongGroupedExtentsFailsAlone) {
  TempDir dir;
  auto set = FileSet::create();
  set->add(dir / "f.bin", FileAccess::ReadWrite);
  auto memory = test::random_bytes(40 * 3000, 44);
  std::vector<Extent> extents;
  for (std::uint64_t i = 0; i < 40; ++i)  // back to back: one group, crossing the limit
    extents.push_back({0, i * 3000, {host(memory, i * 3000, 3000)}});
  const std::uint64_t limit = 64 << 10;
  Ticket t;
  {
    FileSizeLimit guard(limit);
    if (!guard.ok()) GTEST_SKIP() << "cannot lower RLIMIT_FSIZE";
    t = submit(set, Direction::MemoryToFile, extents, {});
    t.wait();
  }
  const auto written = file_bytes(dir / "f.bin");
  for (std::uint64_t i = 0; i < 40; ++i) {
    const ExtentStatus s = t.status(i);
    if ((i + 1) * 3000 <= limit) {
      EXPECT_EQ(s.state, ExtentStatus::State::Done) << i << ": " << s.error;
      ASSERT_GE(written.size(), (i + 1) * 3000);
      EXPECT_EQ(std::memcmp(written.data() + i * 3000, memory.data() + i * 3000, 3000), 0) << i;
    } else {
      EXPECT_EQ(s.state, ExtentStatus::State::Failed) << i;
      EXPECT_NE(s.error.find("f.bin"), std::string::npos) << s.error;
    }
  }
}

// Three writers with deep pipelines (8 slots each, 4 workers) under a bound that holds a few
// slots: leases take fewer slots or wait, and the pool never holds more than the bound.
TEST(Pipeline, TheStagingBoundHoldsWhileWritesPipeline) {
  TempDir dir;
  const std::uint64_t limit = 6 * ((256 << 10) + 8192);
  StagingLimit bound(limit);
  std::vector<std::thread> writers;
  std::atomic<int> wrong{0};
  for (int w = 0; w < 3; ++w)
    writers.emplace_back([&, w] {
      try {
        auto set = FileSet::create();
        set->add(dir / ("w" + std::to_string(w)), FileAccess::ReadWrite);
        auto memory = test::random_bytes(400 * 6000, 50 + w);
        Layout layout = make_layout(memory, 400, 6000, 60 + w);
        TransferOptions options;
        options.threads = 4;
        options.slots_per_thread = 8;
        options.chunk_bytes = 256 << 10;
        Ticket t = submit(set, Direction::MemoryToFile, layout.extents, options);
        t.wait();
        t.rethrow_if_failed();
        const auto written = file_bytes(dir / ("w" + std::to_string(w)));
        std::uint64_t memory_at = 0;
        for (const Extent& x : layout.extents) {
          const std::uint64_t n = total_size(x);
          if (std::memcmp(written.data() + x.file_offset, memory.data() + memory_at, n) != 0)
            ++wrong;
          memory_at += n;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++wrong;
      }
    });
  for (auto& t : writers) t.join();
  const auto stats = detail::staging_pool().stats();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(stats.high_water, 0u);
  EXPECT_LE(stats.high_water, limit);
  EXPECT_EQ(stats.leased_bytes, 0u);
}

}  // namespace
}  // namespace ferry
