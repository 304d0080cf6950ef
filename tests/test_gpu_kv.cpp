// The KV store with GPU memory, both paths (staged; direct = cuFile, in compatibility mode where
// no nvidia-fs exists): round trips bit-exact against the host path in both directions, per-layer
// pieces gathered into one block, the asynchronous forms with callbacks, a put ordered after work
// still writing its source, a corrupt block never reported as a hit, and the path reported per
// key. Skipped without a GPU (direct cases also without cuFile).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include "cuda/cuda_resources.hpp"
#include "shim/gds_mode.hpp"
#include "ferry/error.hpp"
#include "kv_test_support.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

class GpuKv : public ::testing::TestWithParam<KVPath> {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
    if (GetParam() == KVPath::Direct &&
        detail::driver_verdict(detail::probe_cufile()).mode == detail::CuFileMode::Unavailable)
      GTEST_SKIP() << "no cuFile";
    context = std::make_shared<detail::PrimaryContext>(0);
    context->make_current();
  }
  KVStore open(const TempDir& dir, std::uint64_t capacity, std::uint64_t block) {
    KVStoreOptions options;
    options.gpu_path = GetParam();
    options.allow_compat = true;
    return KVStore::open(dir.path(), kv_namespace(), capacity, block, options);
  }
  std::shared_ptr<void> device(std::uint64_t size) {
    return detail::allocate_device_memory(context, size);
  }
  void upload(void* to, const std::vector<std::byte>& bytes) {
    context->make_current();
    FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(to), bytes.data(),
             bytes.size(), nullptr);
    FERRY_CU(cuStreamSynchronize, nullptr);
  }
  // The route a GPU block must report on this path.
  void expect_gpu_route(const KVResult& r) {
    if (GetParam() == KVPath::Direct)
      EXPECT_TRUE(r.route == KVRoute::cufile_gds || r.route == KVRoute::cufile_compat)
          << to_string(r.route);
    else if (GetParam() == KVPath::Staged)
      EXPECT_EQ(r.route, KVRoute::staged);
    else
      EXPECT_NE(r.route, KVRoute::host);
  }
  std::shared_ptr<detail::PrimaryContext> context;
};

INSTANTIATE_TEST_SUITE_P(Paths, GpuKv,
                         ::testing::Values(KVPath::Staged, KVPath::Direct, KVPath::Auto),
                         [](const auto& info) {
                           return std::string(info.param == KVPath::Staged   ? "staged"
                                              : info.param == KVPath::Direct ? "direct"
                                                                             : "auto");
                         });

// GPU -> store -> host and host -> store -> GPU, for each size and a batch of 8: every block
// equals the host path's bytes.
TEST_P(GpuKv, RoundTripsAreBitExactAgainstTheHostPath) {
  for (std::uint64_t size : {4 * kKiB, 4 * kKiB + 100, 256 * kKiB, 1 * kMiB, 16 * kMiB + 8}) {
    TempDir dir;
    const std::size_t n = size > kMiB ? 3 : 8;
    auto store = open(dir, 2 * n * ((size + 4095) / 4096 * 4096), size);
    std::vector<std::shared_ptr<void>> gpu_in, gpu_out;
    std::vector<std::vector<std::byte>> host_in, host_out;
    std::vector<KVPiece> from_gpu, to_host, from_host, to_gpu;
    std::vector<KVKey> gpu_keys, host_keys;
    for (std::size_t i = 0; i < n; ++i) {
      gpu_keys.push_back(100 + i);
      host_keys.push_back(200 + i);
      gpu_in.push_back(device(size));
      upload(gpu_in.back().get(), kv_bytes(gpu_keys[i], size));
      gpu_out.push_back(device(size));
      host_in.push_back(kv_bytes(host_keys[i], size));
      host_out.emplace_back(size, std::byte{0x55});
    }
    for (std::size_t i = 0; i < n; ++i) {
      from_gpu.push_back({gpu_in[i].get(), size, Device::cuda(0)});
      to_gpu.push_back({gpu_out[i].get(), size, Device::cuda(0)});
      from_host.push_back({host_in[i].data(), size});
      to_host.push_back({host_out[i].data(), size});
    }
    std::vector<KVBlock> b_from_gpu, b_to_gpu, b_from_host, b_to_host;
    for (std::size_t i = 0; i < n; ++i) {
      b_from_gpu.emplace_back(&from_gpu[i], 1);
      b_to_gpu.emplace_back(&to_gpu[i], 1);
      b_from_host.emplace_back(&from_host[i], 1);
      b_to_host.emplace_back(&to_host[i], 1);
    }
    for (const KVResult& r : store.put(gpu_keys, b_from_gpu)) {
      ASSERT_TRUE(r.ok()) << size << ": " << r.message;
      expect_gpu_route(r);
    }
    for (const KVResult& r : store.put(host_keys, b_from_host)) {
      ASSERT_TRUE(r.ok()) << r.message;
      EXPECT_EQ(r.route, KVRoute::host);
    }
    for (const KVResult& r : store.get(gpu_keys, b_to_host)) ASSERT_TRUE(r.ok()) << r.message;
    for (const KVResult& r : store.get(host_keys, b_to_gpu)) {
      ASSERT_TRUE(r.ok()) << r.message;
      expect_gpu_route(r);
    }
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(host_out[i], kv_bytes(gpu_keys[i], size)) << size << " block " << i;
      ASSERT_EQ(read_device(gpu_out[i].get(), size), host_in[i]) << size << " block " << i;
    }
    // GPU -> store -> GPU.
    for (const KVResult& r : store.get(gpu_keys, b_to_gpu)) ASSERT_TRUE(r.ok()) << r.message;
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(read_device(gpu_out[i].get(), size), kv_bytes(gpu_keys[i], size));
  }
}

// vLLM's paged KV: K and V of each layer in separate tensors; a block's pieces are one page of
// each, scattered over GPU memory (and one host piece mixed in). Put and get as one block each.
TEST_P(GpuKv, PerLayerPiecesGatherIntoOneBlock) {
  const int layers = 6;
  const std::uint64_t page = 16 * kKiB + 256;  // not a multiple of 4 KiB
  const std::size_t blocks = 5;
  const std::uint64_t block_bytes = 2 * layers * page + 4096;
  TempDir dir;
  auto store = open(dir, 2 * blocks * 256 * kKiB, block_bytes);
  // One tensor per layer and K/V, holding `blocks` pages back to back (plus a spare page).
  std::vector<std::shared_ptr<void>> tensors, targets;
  std::vector<std::vector<std::byte>> contents;
  for (int t = 0; t < 2 * layers; ++t) {
    contents.push_back(random_bytes((blocks + 1) * page, 1000 + t));
    tensors.push_back(device((blocks + 1) * page));
    upload(tensors.back().get(), contents.back());
    targets.push_back(device((blocks + 1) * page));
    upload(targets.back().get(), std::vector<std::byte>((blocks + 1) * page, std::byte{0}));
  }
  std::vector<std::vector<std::byte>> host_parts, host_back;
  std::vector<std::vector<KVPiece>> in(blocks), out(blocks);
  std::vector<KVKey> keys;
  for (std::size_t b = 0; b < blocks; ++b) {
    keys.push_back(500 + b);
    host_parts.push_back(random_bytes(4096, 77 + b));
    host_back.emplace_back(4096, std::byte{0});
    for (int t = 0; t < 2 * layers; ++t) {
      // Block b lives in page (b + 1) % (blocks + 1) of each tensor: not in page order.
      const std::uint64_t at = ((b + 1) % (blocks + 1)) * page;
      in[b].push_back({static_cast<std::byte*>(tensors[t].get()) + at, page, Device::cuda(0)});
      out[b].push_back({static_cast<std::byte*>(targets[t].get()) + at, page, Device::cuda(0)});
    }
    in[b].push_back({host_parts[b].data(), 4096});
    out[b].push_back({host_back[b].data(), 4096});
  }
  std::vector<KVBlock> sources(in.begin(), in.end()), destinations(out.begin(), out.end());
  for (const KVResult& r : store.put(keys, sources)) {
    ASSERT_TRUE(r.ok()) << r.message;
    expect_gpu_route(r);
  }
  for (const KVResult& r : store.get(keys, destinations)) ASSERT_TRUE(r.ok()) << r.message;
  for (int t = 0; t < 2 * layers; ++t) {
    auto back = read_device(targets[t].get(), (blocks + 1) * page);
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::uint64_t at = ((b + 1) % (blocks + 1)) * page;
      ASSERT_TRUE(std::equal(back.begin() + at, back.begin() + at + page, contents[t].begin() + at))
          << "tensor " << t << " block " << b;
    }
  }
  for (std::size_t b = 0; b < blocks; ++b) EXPECT_EQ(host_back[b], host_parts[b]);
  // The same block read into one host buffer is the pieces back to back (the host path's view).
  std::vector<std::byte> whole(store.stored_length(keys[2]));
  ASSERT_EQ(whole.size(), 2 * layers * page + 4096);
  ASSERT_TRUE(get_one(store, keys[2], whole).ok());
  std::uint64_t at = 0;
  const std::uint64_t page_at = 3 * page;
  for (int t = 0; t < 2 * layers; ++t, at += page)
    ASSERT_TRUE(
        std::equal(whole.begin() + at, whole.begin() + at + page, contents[t].begin() + page_at));
  EXPECT_TRUE(std::equal(whole.begin() + at, whole.end(), host_parts[2].begin()));
}

TEST_P(GpuKv, AsyncFormsCompleteWithCallbacks) {
  const std::uint64_t size = 256 * kKiB;
  TempDir dir;
  auto store = open(dir, 64 * size, size);
  std::vector<std::shared_ptr<void>> in, out;
  KVBlockList sources, destinations;
  std::vector<KVKey> keys;
  for (int i = 0; i < 16; ++i) {
    keys.push_back(900 + i);
    in.push_back(device(size));
    upload(in.back().get(), kv_bytes(keys.back(), size));
    out.push_back(device(size));
    sources.push_back({{in.back().get(), size, Device::cuda(0)}});
    destinations.push_back({{out.back().get(), size, Device::cuda(0)}});
  }
  std::atomic<int> called{0};
  std::atomic<std::size_t> ok_in_callback{0};
  KVTicket put = store.put_async(keys, sources, {}, [&](const std::vector<KVResult>& results) {
    for (const auto& r : results) ok_in_callback += r.ok();
    ++called;
  });
  put.wait();
  EXPECT_EQ(called.load(), 1);  // before wait() returned
  EXPECT_EQ(ok_in_callback.load(), keys.size());
  for (const auto& r : put.results()) expect_gpu_route(r);
  KVTicket get =
      store.get_async(keys, destinations, [&](const std::vector<KVResult>&) { ++called; });
  get.wait();
  EXPECT_EQ(called.load(), 2);
  for (const auto& r : get.results()) ASSERT_TRUE(r.ok()) << r.message;
  for (std::size_t i = 0; i < keys.size(); ++i)
    ASSERT_EQ(read_device(out[i].get(), size), kv_bytes(keys[i], size));
}

// The caller's stream fills the source with 0xAB after a long copy; the put is ordered after the
// event recorded behind the fill, so the stored block is 0xAB everywhere, never the old bytes.
TEST_P(GpuKv, APutOrderedAfterAnEventNeverStoresHalfWrittenMemory) {
  const std::uint64_t size = 16 * kMiB;
  TempDir dir;
  auto store = open(dir, 4 * size, size);
  auto source = device(size);
  upload(source.get(), std::vector<std::byte>(size, std::byte{0x11}));
  auto big = device(1ull << 30);
  detail::HostBuffer pinned(1ull << 30, context.get());
  detail::Stream stream;
  detail::Event filled;
  FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(big.get()), pinned.data(),
           1ull << 30, stream.get());
  FERRY_CU(cuMemsetD8Async, reinterpret_cast<shim::cu::DevicePtr>(source.get()), 0xAB, size,
           stream.get());
  filled.record(stream);
  KVPiece piece{source.get(), size, Device::cuda(0)};
  KVBlock block(&piece, 1);
  const KVKey key = 42;
  KVPutOptions options;
  options.after_event = filled.get();
  const auto results = store.put(std::span(&key, 1), std::span(&block, 1), options);
  ASSERT_TRUE(results[0].ok()) << results[0].message;
  std::vector<std::byte> back(size);
  ASSERT_TRUE(get_one(store, key, back).ok());  // the host path checks the stored checksum too
  EXPECT_EQ(back, std::vector<std::byte>(size, std::byte{0xAB}));
}

// A flipped byte in the slab: a GPU get reports a miss and drops the block; never a hit.
TEST_P(GpuKv, ACorruptBlockIsAMissNeverAHit) {
  const std::uint64_t size = 64 * kKiB;
  TempDir dir;
  const KVKey key = 7;
  {
    auto store = open(dir, 4 * size, size);
    ASSERT_TRUE(put_one(store, key, kv_bytes(key, size)).ok());
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (entry.path().filename().string().rfind("slab-", 0) != 0) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(100);
    f.write(&c, 1);
  }
  auto store = open(dir, 4 * size, size);
  auto target = device(size);
  KVPiece piece{target.get(), size, Device::cuda(0)};
  KVBlock block(&piece, 1);
  const auto results = store.get(std::span(&key, 1), std::span(&block, 1));
  EXPECT_EQ(results[0].status, KVStatus::missing);
  EXPECT_NE(results[0].message.find("checksum"), std::string::npos) << results[0].message;
  EXPECT_FALSE(store.contains(std::vector<KVKey>{key})[0]);
  EXPECT_EQ(store.stats().corrupt_dropped, 1u);
}

}  // namespace
}  // namespace ferry::test
