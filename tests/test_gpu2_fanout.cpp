// Multi-GPU loads from one process (ctest label gpu2; skipped below two GPUs): every rank's
// tensors and slices bit-exact with a single-GPU load sliced on the host, for replicas and
// tensor parallelism, uneven splits, tensors smaller than the ranks, safetensors and GGUF, staged
// and by page-cache DMA (copies straight from registered mappings of the files).
// On machines with NVLink multicast, run with NCCL_NVLS_ENABLE=0 (tools/gpu_check.sh sets it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "ferry/fanout_load.hpp"
#include "ferry/ferry.h"
#include "ferry/ggml_type.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tensor_digest.hpp"
#include "gguf_bytes.hpp"
#include "shard_reference.hpp"
#include "shim/cuda_driver.hpp"
#include "test_support.hpp"
#include "services/page_cache_registry.hpp"

namespace ferry {
namespace {

using test::TempDir;

class Gpu2 : public ::testing::Test {
 protected:
  void SetUp() override {
    // NVLink multicast stays off in this process unless the caller chose otherwise.
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
    ::setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
    const auto& d = shim::CudaDriver::get();
    if (!d.usable) GTEST_SKIP() << "no usable GPU: " << d.why_unusable;
    if (d.device_count < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << d.device_count;
  }
};

// The reference: one single-GPU load of everything, read back to the host.
std::map<std::string, std::vector<std::byte>> single_gpu_bytes(
    const std::shared_ptr<const Checkpoint>& ckpt) {
  LoadOptions o;
  o.device = Device::cuda(0);
  const LoadedCheckpoint single = load(ckpt, o);
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& t : single.tensors())
    out[t.info->name] = test::read_device(t.data, t.info->size);
  return out;
}

void expect_ranks_match(const FanoutLoad& loaded,
                        const std::map<std::string, std::vector<std::byte>>& reference) {
  for (const LoadedRank& rank : loaded.ranks())
    for (const LoadedShard& t : rank.tensors()) {
      const auto want = test::host_slice(reference.at(t.piece->info->name), *t.piece);
      ASSERT_EQ(t.piece->bytes, want.size());
      EXPECT_TRUE(test::read_device(t.data, want.size()) == want)
          << t.piece->info->name << " on " << rank.device().to_string();
    }
}

FanoutOptions on_two_gpus(ShardRule rule) {
  FanoutOptions o;
  o.devices = {Device::cuda(0), Device::cuda(1)};
  o.rule = std::move(rule);
  o.round_bytes = 1 << 20;  // many rounds: reads overlap all-gathers
  o.load.io = IoMode::Buffered;
  return o;
}

std::vector<TensorSpec> model_specs() {
  std::vector<TensorSpec> specs = {{"model.embed_tokens.weight", DType::BF16, {1001, 256}},
                                   {"model.norm.weight", DType::F32, {257}},
                                   {"model.tiny.q_proj.weight", DType::U8, {1}},
                                   {"lm_head.weight", DType::BF16, {1001, 256}}};
  for (int l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "self_attn.q_proj.weight", DType::BF16, {257, 256}});  // uneven rows
    specs.push_back({p + "self_attn.o_proj.weight", DType::BF16, {256, 257}});  // uneven columns
    specs.push_back({p + "mlp.up_proj.weight", DType::F32, {1024, 256}});
    specs.push_back({p + "mlp.down_proj.weight", DType::F32, {256, 1024}});
    specs.push_back({p + "input_layernorm.weight", DType::F32, {256}});
  }
  return specs;
}

TEST_F(Gpu2, SafetensorsReplicasAndTensorParallelMatchASingleGpuLoad) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 21);
  auto ckpt = Checkpoint::open_shared(file);
  const auto reference = single_gpu_bytes(ckpt);
  ASSERT_EQ(reference, written);
  for (ShardRule rule : {ShardRule(replicate_all), ShardRule(llama_tensor_parallel)})
    for (auto next : {FanoutOptions::NextRound::Eager, FanoutOptions::NextRound::AtTail}) {
      FanoutOptions o = on_two_gpus(rule);
      o.next_round = next;
      // Both ways of submitting: one submission of every device's threads, one per device.
      if (next == FanoutOptions::NextRound::AtTail)
        o.submissions = FanoutOptions::Submissions::PerDevice;
      const FanoutLoad loaded = load_fanout(ckpt, o);
      expect_ranks_match(loaded, reference);
      const FanoutStats& s = loaded.stats();
      EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);  // once per node
      EXPECT_GT(s.rounds, 1u);
      EXPECT_NE(s.collective.find("nccl"), std::string::npos);
    }
}

TEST_F(Gpu2, GgufQuantizedAndPlainTensors) {
  const GgmlTypeTraits& q4 = ggml_type_traits(GgmlType::Q4_0);
  test::GgufBytes f;
  std::uint64_t offset = 0;
  auto add = [&](const std::string& name, std::vector<std::uint64_t> dims, GgmlType type) {
    const GgmlTypeTraits& tr = ggml_type_traits(type);
    std::uint64_t bytes = dims[0] / tr.block_size * tr.type_size;
    for (std::size_t i = 1; i < dims.size(); ++i) bytes *= dims[i];
    f.tensors.push_back(test::tensor_info(name, dims, static_cast<std::uint32_t>(type), offset));
    offset += (bytes + 31) / 32 * 32;
  };
  add("token_embd.weight", {128, 999}, GgmlType::F16);
  add("blk.0.attn_q.weight", {32 * 6, 77}, GgmlType::Q4_0);
  add("blk.0.attn_output.weight", {32 * 6, 64}, GgmlType::Q4_0);  // 6 blocks a row: 3 + 3
  add("blk.0.ffn_down.weight", {300, 128}, GgmlType::F32);
  add("blk.0.attn_norm.weight", {128}, GgmlType::F32);
  add("output.weight", {128, 999}, GgmlType::F16);
  const auto data = test::random_bytes(offset, 5);
  f.data.assign(reinterpret_cast<const char*>(data.data()), data.size());
  TempDir dir;
  const auto file = dir / "m.gguf";
  test::write_file(file, f.build());
  auto ckpt = Checkpoint::open_shared(file);
  const auto reference = single_gpu_bytes(ckpt);
  (void)q4;
  for (ShardRule rule : {ShardRule(replicate_all), ShardRule(llama_tensor_parallel)}) {
    const FanoutLoad loaded = load_fanout(ckpt, on_two_gpus(rule));
    expect_ranks_match(loaded, reference);
  }
  const FanoutLoad tp = load_fanout(ckpt, on_two_gpus(llama_tensor_parallel));
  EXPECT_EQ(tp.ranks()[1].find("blk.0.attn_output.weight")->piece->shape[1], 3 * q4.type_size);
}

TEST_F(Gpu2, EveryGpuOfTheMachine) {
  const int n = shim::CudaDriver::get().device_count;
  TempDir dir;
  const auto file = dir / "m.safetensors";
  test::write_random_checkpoint(file, model_specs(), 22);
  auto ckpt = Checkpoint::open_shared(file);
  const auto reference = single_gpu_bytes(ckpt);
  FanoutOptions o = on_two_gpus(llama_tensor_parallel);
  o.devices.clear();
  for (int i = n - 1; i >= 0; --i) o.devices.push_back(Device::cuda(i));  // any order
  expect_ranks_match(load_fanout(ckpt, o), reference);
}

// Page-cache DMA: the first load registers the shards, later ones copy from the registrations it
// kept; a budget that holds one shard only leaves the other staged, saying why.
TEST_F(Gpu2, PageCacheDmaReplicasAndSlicesMatchASingleGpuLoad) {
  TempDir dir;
  auto specs = model_specs();
  const std::vector<TensorSpec> first(specs.begin(), specs.begin() + 9);
  const std::vector<TensorSpec> second(specs.begin() + 9, specs.end());
  test::write_random_checkpoint(dir / "model-00001-of-00002.safetensors", first, 24);
  test::write_random_checkpoint(dir / "model-00002-of-00002.safetensors", second, 25);
  auto ckpt = Checkpoint::open_shared(dir.path());
  ASSERT_EQ(ckpt->files().size(), 2u);
  const auto reference = single_gpu_bytes(ckpt);
  detail::page_cache_registry().release_idle();
  for (ShardRule rule : {ShardRule(replicate_all), ShardRule(llama_tensor_parallel)})
    for (int repeat = 0; repeat < 3; ++repeat) {
      FanoutOptions o = on_two_gpus(rule);
      o.load.page_cache_pin_bytes = 1ull << 30;
      const FanoutLoad loaded = load_fanout(ckpt, o);
      expect_ranks_match(loaded, reference);
      const FanoutStats& s = loaded.stats();
      EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);
      EXPECT_EQ(s.bytes_from_registered_page_cache, s.checkpoint_bytes);
      if (repeat > 0) {
        EXPECT_EQ(s.page_cache_register_seconds, 0.0);
      }
      ASSERT_EQ(s.files.size(), 2u);
      for (const FileLoadStats& f : s.files) {
        EXPECT_EQ(f.io_path, IoPath::PageCacheDma) << f.path << ": " << f.reason;
        EXPECT_GT(f.bytes_read, 0u) << f.path;
      }
    }
  detail::page_cache_registry().release_idle();
  FanoutOptions one_shard = on_two_gpus(llama_tensor_parallel);
  one_shard.load.page_cache_pin_bytes = ckpt->files()[0].size;
  for (int repeat = 0; repeat < 2; ++repeat) {
    const FanoutLoad loaded = load_fanout(ckpt, one_shard);
    expect_ranks_match(loaded, reference);
    const FanoutStats& s = loaded.stats();
    EXPECT_EQ(s.bytes_read, s.checkpoint_bytes);
    EXPECT_GT(s.bytes_from_registered_page_cache, 0u);
    EXPECT_LT(s.bytes_from_registered_page_cache, s.checkpoint_bytes);
    for (const FileLoadStats& f : s.files)
      if (f.path == ckpt->files()[1].path) {
        EXPECT_NE(f.io_path, IoPath::PageCacheDma);
        EXPECT_NE(f.reason.find("no page-cache DMA"), std::string::npos) << f.reason;
      }
  }
  detail::page_cache_registry().release_idle();
}

// The C ABI (ferry_checkpoint_load_fanout) on two GPUs: each device's digests equal those of
// the written bytes (replicas) or of their slices cut on the host (tensor parallel).
TEST_F(Gpu2, TheCAbiLoadsReplicasAndSlices) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(file, model_specs(), 23);
  ferry_checkpoint* checkpoint = nullptr;
  ASSERT_EQ(ferry_checkpoint_open(file.string().c_str(), &checkpoint), FERRY_STATUS_OK)
      << ferry_last_error();
  const char* devices[] = {"cuda:0", "cuda:1"};
  for (int mode : {FERRY_SHARD_MODE_REPLICAS, FERRY_SHARD_MODE_TENSOR_PARALLEL}) {
    ferry_fanout_options options;
    ferry_fanout_options_init(&options);
    options.devices = devices;
    options.device_count = 2;
    options.shard_mode = mode;
    options.round_bytes = 1 << 20;
    ferry_fanout* fanout = nullptr;
    ASSERT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout), FERRY_STATUS_OK)
        << ferry_last_error();
    for (size_t d = 0; d < 2; ++d)
      for (const auto& [name, whole] : written) {
        ferry_shard_info s{};
        ASSERT_EQ(ferry_fanout_tensor(fanout, d, name.c_str(), &s), FERRY_STATUS_OK) << name;
        ferry_tensor_info info{};
        for (size_t i = 0; i < ferry_checkpoint_tensor_count(checkpoint); ++i) {
          ASSERT_EQ(ferry_checkpoint_tensor_info(checkpoint, i, &info), FERRY_STATUS_OK);
          if (name == info.name) break;
        }
        TensorInfo t;
        t.shape.assign(info.shape, info.shape + info.rank);
        ShardPiece piece{&t, s.dim, s.begin, s.end, {}, s.bytes, 0};
        const auto want = test::host_slice(whole, piece);
        ASSERT_EQ(s.bytes, want.size()) << name;
        std::uint64_t digest = 0;
        ASSERT_EQ(ferry_fanout_tensor_digest(fanout, d, name.c_str(), &digest), FERRY_STATUS_OK);
        EXPECT_EQ(digest, bytes_digest(want)) << name << " on cuda:" << d;
      }
    ferry_fanout_stats stats{};
    stats.struct_size = sizeof stats;
    ASSERT_EQ(ferry_fanout_stats_get(fanout, &stats), FERRY_STATUS_OK);
    EXPECT_EQ(stats.bytes_read, stats.checkpoint_bytes);
    EXPECT_NE(std::string(stats.collective).find("nccl"), std::string::npos);
    ferry_fanout_free(fanout);
  }
  ferry_checkpoint_free(checkpoint);
}

}  // namespace
}  // namespace ferry
