// The engines' paged KV layouts (kv_layouts.hpp) with the cache tensors in GPU memory, on the
// staged and direct paths and with page-cache DMA: put from the per-layer tensors, get back into
// fresh ones (and into / from one contiguous host buffer: the host path's view), sync and async,
// bit-exact, no byte outside the blocks' pieces touched; a call of several bounce groups; the
// routes and why; a writer killed while its source is refilled right after each put returns
// (synchronous puts, and async ones after wait()) leaves every visible block whole; pieces on two
// GPUs refused. Skipped without a GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "kv_layouts.hpp"
#include "kv_page_cache_support.hpp"
#include "kv_test_support.hpp"
#include "shim/cuda_driver.hpp"
#include "shim/gds_mode.hpp"

namespace ferry::test {
namespace {

struct Mode {
  KVPath path;
  bool page_cache;
};

class GpuKvLayouts : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
    if (GetParam().path == KVPath::Direct &&
        detail::driver_verdict(detail::probe_cufile()).mode == detail::CuFileMode::Unavailable)
      GTEST_SKIP() << "no cuFile";
    context = std::make_shared<detail::PrimaryContext>(0);
    context->make_current();
  }
  KVStore open(const TempDir& dir, const std::string& name, std::uint64_t block,
               std::uint64_t capacity_blocks = 16) {
    return open_at(dir.path(), name, block, capacity_blocks);
  }
  KVStore open_at(const std::filesystem::path& root, const std::string& name, std::uint64_t block,
                  std::uint64_t capacity_blocks = 16) {
    KVStoreOptions options;
    options.gpu_path = GetParam().path;
    options.allow_compat = true;
    if (GetParam().page_cache) options.page_cache_pin_bytes = 1ull << 30;
    return KVStore::open(root, kv_namespace(name), capacity_blocks * ((block + 4095) / 4096 * 4096),
                         block, options);
  }
  // The layout's tensors on cuda:0.
  struct Tensors {
    std::vector<std::shared_ptr<void>> memory;
    std::vector<KVPiece> pieces(const KvLayout& l, std::size_t b) const {
      std::vector<KVPiece> out;
      for (const PieceAt& p : l.blocks[b])
        out.push_back(
            {static_cast<std::byte*>(memory[p.tensor].get()) + p.offset, p.size, Device::cuda(0)});
      return out;
    }
  };
  Tensors tensors(const KvLayout& l, std::uint64_t seed) {
    Tensors t;
    for (std::size_t i = 0; i < l.tensor_bytes.size(); ++i) {
      t.memory.push_back(detail::allocate_device_memory(context, l.tensor_bytes[i]));
      const auto bytes = seed ? random_bytes(l.tensor_bytes[i], seed * 131 + i)
                              : std::vector<std::byte>(l.tensor_bytes[i], std::byte{0});
      FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(t.memory.back().get()),
               bytes.data(), bytes.size(), nullptr);
      FERRY_CU(cuStreamSynchronize, nullptr);
    }
    return t;
  }
  std::vector<std::byte> block_bytes(const KvLayout& l, const Tensors& t, std::size_t b) {
    std::vector<std::byte> out;
    for (const PieceAt& p : l.blocks[b]) {
      std::vector<std::byte> piece(p.size);
      FERRY_CU(cuMemcpyDtoH, piece.data(),
               reinterpret_cast<shim::cu::DevicePtr>(t.memory[p.tensor].get()) + p.offset, p.size);
      out.insert(out.end(), piece.begin(), piece.end());
    }
    return out;
  }
  // The SIGKILL trials of a GPU writer (below), its puts synchronous or async.
  void killed_writer_trials(bool async);
  std::shared_ptr<detail::PrimaryContext> context;
};

INSTANTIATE_TEST_SUITE_P(Paths, GpuKvLayouts,
                         ::testing::Values(Mode{KVPath::Staged, false}, Mode{KVPath::Direct, false},
                                           Mode{KVPath::Staged, true}),
                         [](const auto& info) {
                           return std::string(info.param.path == KVPath::Staged ? "staged"
                                                                                : "direct") +
                                  (info.param.page_cache ? "_page_cache" : "");
                         });

std::vector<KVResult> run(KVStore& store, bool put, bool async, const std::vector<KVKey>& keys,
                          const KVBlockList& blocks) {
  if (async) {
    KVTicket t = put ? store.put_async(keys, blocks) : store.get_async(keys, blocks);
    t.wait();
    return t.results();
  }
  std::vector<KVBlock> views(blocks.begin(), blocks.end());
  return put ? store.put(keys, views) : store.get(keys, views);
}

// Reads every slab into the page cache (so page-cache DMA has windows to serve).
void warm(const TempDir& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    if (e.path().filename().string().rfind("slab-", 0) == 0) {
      std::ifstream in(e.path(), std::ios::binary);
      std::vector<char> chunk(1 << 20);
      while (in.read(chunk.data(), chunk.size()) || in.gcount() > 0) {
      }
    }
}

TEST_P(GpuKvLayouts, EveryEngineLayoutRoundTripsBitExact) {
  const std::vector<std::size_t> order = {3, 0, 5, 1};
  for (const KvLayout& l : test_layouts(6)) {
    for (bool async : {false, true}) {
      SCOPED_TRACE(l.name + (async ? " async" : " sync"));
      TempDir dir;
      auto store = open(dir, l.name, l.block_bytes());
      Tensors source = tensors(l, 5), target = tensors(l, 0);
      std::vector<KVKey> keys;
      KVBlockList from, to;
      for (std::size_t b : order) {
        keys.push_back(100 + b);
        from.push_back(source.pieces(l, b));
        to.push_back(target.pieces(l, b));
      }
      for (const KVResult& r : run(store, true, async, keys, from))
        ASSERT_TRUE(r.ok()) << r.message;
      if (GetParam().page_cache) warm(dir);
      // Page-cache DMA: the first get takes the usual path while its windows are registered in
      // the background, the second copies from them.
      for (int pass = 0; pass < 2; ++pass) {
        for (const KVResult& r : run(store, false, async, keys, to)) {
          ASSERT_TRUE(r.ok()) << r.message;
          EXPECT_FALSE(r.route_reason.empty()) << to_string(r.route);
          if (GetParam().page_cache && pass == 0) {
            EXPECT_NE(r.route, KVRoute::page_cache_dma) << r.route_reason;
            EXPECT_NE(r.route_reason.find("registering it in the background"), std::string::npos)
                << r.route_reason;
          } else if (GetParam().page_cache) {
            EXPECT_EQ(r.route, KVRoute::page_cache_dma) << r.route_reason;
          }
        }
        if (GetParam().page_cache && pass == 0) wait_for_registrations(store);
      }
      for (std::size_t b : order)
        ASSERT_EQ(block_bytes(l, target, b), block_bytes(l, source, b)) << b;
      for (std::size_t b : {2, 4})
        ASSERT_EQ(block_bytes(l, target, b), std::vector<std::byte>(l.block_bytes(), std::byte{0}));
      // The host path's view: one contiguous host buffer per block, both ways.
      std::vector<std::vector<std::byte>> whole(order.size(),
                                                std::vector<std::byte>(l.block_bytes()));
      KVBlockList flat;
      for (auto& w : whole) flat.push_back({{w.data(), w.size()}});
      for (const KVResult& r : run(store, false, async, keys, flat))
        ASSERT_TRUE(r.ok()) << r.message;
      for (std::size_t i = 0; i < order.size(); ++i)
        ASSERT_EQ(whole[i], block_bytes(l, source, order[i]));
      std::vector<KVKey> flat_keys;
      for (std::size_t i = 0; i < order.size(); ++i) {
        flat_keys.push_back(500 + i);
        const auto bytes = random_bytes(l.block_bytes(), 77 + i);
        std::memcpy(whole[i].data(), bytes.data(), bytes.size());  // `flat` points into it
      }
      for (const KVResult& r : run(store, true, async, flat_keys, flat)) ASSERT_TRUE(r.ok());
      Tensors back = tensors(l, 0);
      KVBlockList into;
      for (std::size_t b : order) into.push_back(back.pieces(l, b));
      for (const KVResult& r : run(store, false, async, flat_keys, into)) ASSERT_TRUE(r.ok());
      for (std::size_t i = 0; i < order.size(); ++i)
        ASSERT_EQ(block_bytes(l, back, order[i]), whole[i]);
    }
  }
}

// KVGpuGroups (`ferry kv bench --group-bytes ...`): groups of an odd size, one worker each, two
// moving at once; and the whole call in one group on 16 workers: bit-exact both ways, from the
// device and from the page cache.
TEST_P(GpuKvLayouts, GroupSizesFromTheOptionsRoundTripBitExact) {
  const KvLayout l = vllm_layout(32, 40, 16, 8, 128, 2);  // 40 x 2 MiB
  for (const KVGpuGroups groups : {KVGpuGroups{3ull << 20, 2, 1}, KVGpuGroups{1ull << 30, 1, 16}}) {
    SCOPED_TRACE(std::to_string(groups.bytes) + " bytes a group");
    TempDir dir;
    KVStoreOptions options;
    options.gpu_path = GetParam().path;
    options.allow_compat = true;
    if (GetParam().page_cache) options.page_cache_pin_bytes = 1ull << 30;
    options.gpu_groups = groups;
    auto store = KVStore::open(dir.path(), kv_namespace("groups"), l.num_blocks * l.block_bytes(),
                               l.block_bytes(), options);
    Tensors source = tensors(l, 11);
    std::vector<KVKey> keys;
    KVBlockList from;
    for (std::size_t b = 0; b < l.num_blocks; ++b) {
      keys.push_back(700 + b);
      from.push_back(source.pieces(l, b));
    }
    for (const KVResult& r : run(store, true, false, keys, from)) ASSERT_TRUE(r.ok()) << r.message;
    for (bool cached : {false, true}) {
      if (cached) warm(dir);
      Tensors target = tensors(l, 0);
      KVBlockList to;
      for (std::size_t b = 0; b < l.num_blocks; ++b) to.push_back(target.pieces(l, b));
      for (const KVResult& r : run(store, false, false, keys, to)) ASSERT_TRUE(r.ok()) << r.message;
      for (std::size_t b = 0; b < l.num_blocks; ++b)
        ASSERT_EQ(block_bytes(l, target, b), block_bytes(l, source, b)) << b;
    }
  }
}

// A call larger than the device bounce buffer moves in groups of 128 MiB, three in flight, each
// bounce part taken again by later groups. Bit-exact both ways, from the device and from the page
// cache, sync and async; blocks whose slab bytes were flipped fail their checksum alone, their
// pieces untouched.
TEST_P(GpuKvLayouts, ACallOfSeveralGroupsRoundTripsAndCorruptBlocksFailAlone) {
  const KvLayout l = vllm_layout(32, 420, 16, 8, 128, 2);  // 420 x 2 MiB: 7 groups
  ASSERT_EQ(l.block_bytes(), 2u << 20);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    TempDir dir;
    Tensors source = tensors(l, 9);
    std::vector<KVKey> keys;
    KVBlockList from;
    for (std::size_t b = 0; b < l.num_blocks; ++b) {
      keys.push_back(1000 + b);
      from.push_back(source.pieces(l, b));
    }
    {
      auto store = open(dir, "groups", l.block_bytes(), l.num_blocks);
      for (const KVResult& r : run(store, true, async, keys, from))
        ASSERT_TRUE(r.ok()) << r.message;
      // From the device (overlapped groups), then from the page cache (one group at a time).
      for (bool cached : {false, true}) {
        SCOPED_TRACE(cached ? "from the page cache" : "from the device");
        if (cached) warm(dir);
        Tensors target = tensors(l, 0);
        KVBlockList to;
        for (std::size_t b = 0; b < l.num_blocks; ++b) to.push_back(target.pieces(l, b));
        for (const KVResult& r : run(store, false, async, keys, to))
          ASSERT_TRUE(r.ok()) << r.message;
        for (std::size_t b = 0; b < l.num_blocks; ++b)
          ASSERT_EQ(block_bytes(l, target, b), block_bytes(l, source, b)) << b;
      }
    }
    // A byte flipped in every 8th slot of every slab.
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
      if (e.path().filename().string().rfind("slab-", 0) != 0) continue;
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      for (std::uint64_t at = 100; at < std::filesystem::file_size(e.path());
           at += 8 * l.block_bytes()) {
        char c = 0;
        f.seekg(static_cast<std::streamoff>(at));
        f.read(&c, 1);
        c ^= 0x20;
        f.seekp(static_cast<std::streamoff>(at));
        f.write(&c, 1);
      }
    }
    auto store = open(dir, "groups", l.block_bytes(), l.num_blocks);
    Tensors target = tensors(l, 0);
    KVBlockList to;
    for (std::size_t b = 0; b < l.num_blocks; ++b) to.push_back(target.pieces(l, b));
    const auto results = run(store, false, async, keys, to);
    std::size_t failed = 0;
    for (std::size_t b = 0; b < l.num_blocks; ++b) {
      if (results[b].ok()) {
        ASSERT_EQ(block_bytes(l, target, b), block_bytes(l, source, b)) << b;
        continue;
      }
      ++failed;
      EXPECT_NE(results[b].message.find("checksum"), std::string::npos) << results[b].message;
      ASSERT_EQ(block_bytes(l, target, b), std::vector<std::byte>(l.block_bytes(), std::byte{0}))
          << b;
    }
    EXPECT_GT(failed, 0u);
  }
}

// A writer whose blocks are in GPU memory (2 pieces of one buffer, refilled right after each put
// returns, or after an async put's wait()), SIGKILLed at random points: every block visible after
// reopening is whole. The writer is this test binary run afresh (FERRY_GPU_KV_WRITER names its
// directory): CUDA cannot be used in a child forked from a parent that has initialised it.
constexpr std::uint64_t kCrashBlock = 1 << 20;

[[noreturn]] void run_gpu_writer(KVStore store, bool async) {
  try {
    auto context = std::make_shared<detail::PrimaryContext>(0);
    context->make_current();
    auto buffer = detail::allocate_device_memory(context, kCrashBlock);
    const auto at = reinterpret_cast<shim::cu::DevicePtr>(buffer.get());
    for (KVKey key = 1;; ++key) {
      const auto bytes = kv_bytes(key, kCrashBlock);
      FERRY_CU(cuMemcpyHtoDAsync, at, bytes.data(), bytes.size(), nullptr);
      FERRY_CU(cuStreamSynchronize, nullptr);
      std::vector<KVPiece> pieces = {{buffer.get(), kCrashBlock / 2, Device::cuda(0)},
                                     {static_cast<std::byte*>(buffer.get()) + kCrashBlock / 2,
                                      kCrashBlock / 2, Device::cuda(0)}};
      const KVBlockList blocks{pieces};
      if (!run(store, true, async, {key}, blocks)[0].ok()) std::_Exit(3);
      // Refilled at once (the null stream: after the put's copies, which it waits for).
      FERRY_CU(cuMemsetD8Async, at, static_cast<unsigned char>(key), kCrashBlock, nullptr);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "writer: %s\n", e.what());
    std::_Exit(2);
  }
}

void GpuKvLayouts::killed_writer_trials(bool async) {
  if (GetParam().page_cache) GTEST_SKIP() << "puts do not use page-cache DMA";
  if (const char* writer_dir = std::getenv("FERRY_GPU_KV_WRITER"))
    run_gpu_writer(open_at(writer_dir, "crash", kCrashBlock), async);
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter =
      std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  std::uint64_t checked = 0;
  for (int trial = 0; trial < 6; ++trial) {
    TempDir dir;
    const std::string dir_text = dir.path().string();
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::setenv("FERRY_GPU_KV_WRITER", dir_text.c_str(), 1);
      ::execl("/proc/self/exe", "/proc/self/exe", filter.c_str(), static_cast<char*>(nullptr));
      std::_Exit(4);
    }
    std::mt19937_64 random(trial + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500 + random() % 1500));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed by itself, exit " << WEXITSTATUS(status);
    if (!std::filesystem::exists(dir.path() / KVStore::directory_name(kv_namespace("crash"))))
      continue;
    auto store = open(dir, "crash", kCrashBlock);
    for (KVKey k : store.keys()) {
      std::vector<std::byte> out(store.stored_length(k));
      const KVResult r = get_one(store, k, out);
      ASSERT_TRUE(r.ok()) << "trial " << trial << " key " << k << ": " << r.message;
      ASSERT_EQ(out, kv_bytes(k, kCrashBlock)) << "trial " << trial << " key " << k;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

TEST_P(GpuKvLayouts, KilledWriterWithRefilledGpuSourceLeavesVisibleBlocksWhole) {
  killed_writer_trials(false);
}

TEST_P(GpuKvLayouts, KilledAsyncWriterWithRefilledGpuSourceLeavesVisibleBlocksWhole) {
  killed_writer_trials(true);
}

TEST_P(GpuKvLayouts, PiecesOnTwoGpusAreRefused) {
  int count = 0;
  FERRY_CU(cuDeviceGetCount, &count);
  if (count < 2) GTEST_SKIP() << "one GPU";
  TempDir dir;
  auto store = open(dir, "two", 8192);
  auto a = detail::allocate_device_memory(context, 4096);
  auto b = detail::allocate_device_memory(std::make_shared<detail::PrimaryContext>(1), 4096);
  std::vector<KVPiece> pieces = {{a.get(), 4096, Device::cuda(0)},
                                 {b.get(), 4096, Device::cuda(1)}};
  KVKey key = 1;
  const KVResult r = store.put(std::span(&key, 1), std::vector<KVBlock>{pieces})[0];
  EXPECT_EQ(r.status, KVStatus::unsupported);
  EXPECT_NE(r.message.find("cuda:0 and cuda:1"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace ferry::test
