#include <gtest/gtest.h>

#include <numeric>

#include "ferry/error.hpp"
#include "load/load_plan.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

std::vector<TensorSpec> specs_of_sizes(const std::vector<std::uint64_t>& sizes) {
  std::vector<TensorSpec> specs;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    specs.push_back({"t" + std::to_string(1000 + i), DType::U8, {sizes[i]}});
  return specs;
}

// Every byte of every selected tensor is covered exactly once, within chunk bounds.
void expect_covers_exactly(const LoadPlan& plan, const PlanOptions& options) {
  std::vector<std::vector<int>> covered(plan.tensors.size());
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) covered[i].assign(plan.tensors[i]->size, 0);
  for (const auto& c : plan.chunks) {
    EXPECT_LE(c.size, options.chunk_bytes);
    for (const auto& s : c.copies) {
      const TensorInfo& t = *plan.tensors[s.tensor];
      EXPECT_EQ(t.file_index, c.file_index);
      EXPECT_EQ(c.file_offset + s.chunk_offset, t.offset + s.tensor_offset);
      EXPECT_LE(s.chunk_offset + s.size, c.size);
      for (std::uint64_t b = 0; b < s.size; ++b) ++covered[s.tensor][s.tensor_offset + b];
    }
  }
  for (const auto& bytes : covered)
    for (int n : bytes) ASSERT_EQ(n, 1);
}

TEST(LoadPlan, PlacesEveryTensorAlignedWithoutOverlap) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", specs_of_sizes({1, 255, 256, 257, 4096, 3}), 1);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  PlanOptions options;
  auto plan = plan_load(ckpt, {}, options);
  ASSERT_EQ(plan.tensors.size(), 6u);
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    EXPECT_EQ(plan.dest_offsets[i] % 256, 0u);
    EXPECT_GE(plan.dest_offsets[i], end);
    end = plan.dest_offsets[i] + plan.tensors[i]->size;
  }
  EXPECT_EQ(plan.dest_bytes, end);
  EXPECT_EQ(plan.tensor_bytes, 1u + 255 + 256 + 257 + 4096 + 3);
  expect_covers_exactly(plan, options);
}

TEST(LoadPlan, CoalescesManySmallTensorsIntoFewReads) {
  TempDir dir;
  std::vector<std::uint64_t> sizes(300, 2048);
  test::write_random_checkpoint(dir / "m.safetensors", specs_of_sizes(sizes), 2);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  PlanOptions options;
  options.chunk_bytes = 256 << 10;
  auto plan = plan_load(ckpt, {}, options);
  // 600 KiB of tensors in 256 KiB reads: three chunks, not 300 reads.
  EXPECT_EQ(plan.chunks.size(), 3u);
  EXPECT_EQ(plan.read_bytes, plan.tensor_bytes);
  expect_covers_exactly(plan, options);
}

TEST(LoadPlan, SplitsLargeTensorsAtPageBoundaries) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", specs_of_sizes({100, 1 << 20, 77}), 3);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  PlanOptions options;
  options.chunk_bytes = 64 << 10;
  auto plan = plan_load(ckpt, {}, options);
  EXPECT_GE(plan.chunks.size(), 16u);
  for (std::size_t i = 0; i + 1 < plan.chunks.size(); ++i) {
    const auto& c = plan.chunks[i];
    if (c.file_offset + c.size == plan.chunks[i + 1].file_offset) {
      EXPECT_EQ((c.file_offset + c.size) % 4096, 0u) << "chunk " << i;
    }
  }
  expect_covers_exactly(plan, options);
}

TEST(LoadPlan, SubsetReadsThroughSmallHolesAndSplitsAtLargeOnes) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors",
                                specs_of_sizes({1000, 50, 1000, 3 << 20, 1000}), 4);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  std::vector<std::string> names = {"t1000", "t1002", "t1004"};
  PlanOptions options;
  auto plan = plan_load(ckpt, names, options);
  ASSERT_EQ(plan.tensors.size(), 3u);
  EXPECT_EQ(plan.tensors[0]->name, "t1000");
  EXPECT_EQ(plan.tensors[2]->name, "t1004");
  // t1000 and t1002 share a read across the 50-byte hole; the 3 MiB hole splits the reads.
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].copies.size(), 2u);
  EXPECT_EQ(plan.read_bytes, 2050u + 1000u);
  expect_covers_exactly(plan, options);
}

TEST(LoadPlan, UnknownNameIsAnError) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", specs_of_sizes({8}), 5);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  std::vector<std::string> names = {"missing"};
  try {
    plan_load(ckpt, names);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
}

TEST(LoadPlan, RejectsBadOptions) {
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", specs_of_sizes({8}), 6);
  auto ckpt = Checkpoint::open(dir / "m.safetensors");
  PlanOptions zero_chunk;
  zero_chunk.chunk_bytes = 0;
  EXPECT_THROW(plan_load(ckpt, {}, zero_chunk), std::invalid_argument);
  PlanOptions odd_alignment;
  odd_alignment.alignment = 100;
  EXPECT_THROW(plan_load(ckpt, {}, odd_alignment), std::invalid_argument);
}

TEST(LoadPlan, ShardsNeverShareAChunk) {
  TempDir dir;
  test::write_random_checkpoint(dir / "a.safetensors", {{"x", DType::F32, {10}}}, 7);
  test::write_random_checkpoint(dir / "b.safetensors", {{"y", DType::F32, {10}}}, 8);
  auto ckpt = Checkpoint::open(dir.path());
  PlanOptions options;
  auto plan = plan_load(ckpt, {}, options);
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_NE(plan.chunks[0].file_index, plan.chunks[1].file_index);
  expect_covers_exactly(plan, options);
}

}  // namespace
}  // namespace ferry
