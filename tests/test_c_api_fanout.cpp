// The C ABI of loads onto several devices, used as a C host would, on host ranks ("cpu"): the
// same route as on GPUs (the memcpy collective), each device's bytes checked against slices cut
// on the host from the written bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "ferry/tensor_digest.hpp"
#include "test_support.hpp"

namespace {

using ferry::test::TempDir;

// Columns [begin, end) of a row-major rows x cols matrix of `unit`-byte elements.
std::vector<std::byte> columns(const std::vector<std::byte>& whole, std::uint64_t rows,
                               std::uint64_t cols, std::uint64_t unit, std::uint64_t begin,
                               std::uint64_t end) {
  std::vector<std::byte> out;
  for (std::uint64_t r = 0; r < rows; ++r)
    out.insert(out.end(), whole.begin() + (r * cols + begin) * unit,
               whole.begin() + (r * cols + end) * unit);
  return out;
}

std::vector<std::byte> bytes_at(const ferry_shard_info& s) {
  const auto* p = static_cast<const std::byte*>(s.data);
  return {p, p + s.bytes};
}

class CApiFanout : public ::testing::Test {
 protected:
  void SetUp() override {
    written = ferry::test::write_random_checkpoint(
        dir / "m.safetensors",
        {{"model.layers.0.self_attn.q_proj.weight", ferry::DType::BF16, {7, 6}},
         {"model.layers.0.self_attn.o_proj.weight", ferry::DType::BF16, {6, 7}},
         {"model.norm.weight", ferry::DType::F32, {6}},
         {"extra", ferry::DType::F32, {4, 5}}},
        41);
    ASSERT_EQ(ferry_checkpoint_open((dir / "m.safetensors").string().c_str(), &checkpoint),
              FERRY_STATUS_OK)
        << ferry_last_error();
    ferry_load_options_init(&load);
    load.io_mode = FERRY_IO_MODE_BUFFERED;
    ferry_fanout_options_init(&options);
    options.load = &load;
    options.round_bytes = 64;  // several rounds
  }
  void TearDown() override { ferry_checkpoint_free(checkpoint); }

  TempDir dir;
  std::map<std::string, std::vector<std::byte>> written;
  ferry_checkpoint* checkpoint = nullptr;
  ferry_load_options load;
  ferry_fanout_options options;
};

TEST_F(CApiFanout, ReplicasOnThreeHostDevices) {
  const char* devices[] = {"cpu", "cpu", "cpu"};
  options.devices = devices;
  options.device_count = 3;
  ferry_fanout* fanout = nullptr;
  ASSERT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_checkpoint_free(checkpoint);  // the result keeps what it needs
  checkpoint = nullptr;
  ASSERT_EQ(ferry_fanout_device_count(fanout), 3u);
  for (size_t d = 0; d < 3; ++d)
    for (const auto& [name, bytes] : written) {
      ferry_shard_info s{};
      ASSERT_EQ(ferry_fanout_tensor(fanout, d, name.c_str(), &s), FERRY_STATUS_OK) << name;
      EXPECT_EQ(s.dim, -1);
      EXPECT_EQ(bytes_at(s), bytes) << name << " on device " << d;
      std::uint64_t digest = 0;
      ASSERT_EQ(ferry_fanout_tensor_digest(fanout, d, name.c_str(), &digest), FERRY_STATUS_OK);
      EXPECT_EQ(digest, ferry::bytes_digest(bytes));
    }
  ferry_fanout_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(ferry_fanout_stats_get(fanout, &stats), FERRY_STATUS_OK);
  EXPECT_EQ(stats.device_count, 3u);
  EXPECT_EQ(stats.bytes_read, stats.checkpoint_bytes);  // once, not three times
  EXPECT_EQ(stats.tensor_bytes, 3 * stats.checkpoint_bytes);
  EXPECT_GT(stats.rounds, 1u);
  EXPECT_STREQ(stats.collective, "host memcpy");
  std::uint64_t links = 0;
  for (size_t d = 0; d < 3; ++d) {
    ferry_fanout_device_stats ds{};
    ASSERT_EQ(ferry_fanout_device_stats_get(fanout, d, &ds), FERRY_STATUS_OK);
    EXPECT_STREQ(ds.device, "cpu");
    EXPECT_EQ(ds.tensor_bytes, stats.checkpoint_bytes);
    links += ds.link_bytes;
  }
  EXPECT_EQ(links, stats.checkpoint_bytes);
  ferry_fanout_free(fanout);
}

TEST_F(CApiFanout, TensorParallelWithTheCallersSpecs) {
  const char* devices[] = {"cpu", "cpu"};
  options.devices = devices;
  options.device_count = 2;
  options.shard_mode = FERRY_SHARD_MODE_TENSOR_PARALLEL;
  const std::uint64_t sizes[] = {1, 3};  // uneven, given
  const ferry_shard_spec specs[] = {{"extra", 0, sizes, 2},
                                    {"model.layers.0.self_attn.o_proj.weight", -1, nullptr, 0}};
  options.specs = specs;
  options.spec_count = 2;
  ferry_fanout* fanout = nullptr;
  ASSERT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout), FERRY_STATUS_OK)
      << ferry_last_error();
  const auto& q = written.at("model.layers.0.self_attn.q_proj.weight");  // rows 4 + 3
  const auto& extra = written.at("extra");
  for (size_t d = 0; d < 2; ++d) {
    ferry_shard_info s{};
    ASSERT_EQ(ferry_fanout_tensor(fanout, d, "model.layers.0.self_attn.q_proj.weight", &s),
              FERRY_STATUS_OK);
    EXPECT_EQ(s.dim, 0);
    EXPECT_EQ(s.begin, d == 0 ? 0u : 4u);
    EXPECT_EQ(s.end, d == 0 ? 4u : 7u);
    ASSERT_EQ(s.rank, 2u);
    EXPECT_EQ(s.shape[0], s.end - s.begin);
    EXPECT_EQ(s.shape[1], 6u);
    EXPECT_EQ(bytes_at(s), columns(q, 1, 7 * 6, 2, s.begin * 6, s.end * 6));
    // The spec replicates o_proj, which the mode's rule would split by columns.
    ASSERT_EQ(ferry_fanout_tensor(fanout, d, "model.layers.0.self_attn.o_proj.weight", &s),
              FERRY_STATUS_OK);
    EXPECT_EQ(s.dim, -1);
    EXPECT_EQ(bytes_at(s), written.at("model.layers.0.self_attn.o_proj.weight"));
    ASSERT_EQ(ferry_fanout_tensor(fanout, d, "extra", &s), FERRY_STATUS_OK);
    EXPECT_EQ(s.end - s.begin, sizes[d]);
    EXPECT_EQ(bytes_at(s), columns(extra, 1, 4 * 5, 4, s.begin * 5, s.end * 5));
  }
  ferry_fanout_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(ferry_fanout_stats_get(fanout, &stats), FERRY_STATUS_OK);
  EXPECT_EQ(stats.bytes_read, stats.checkpoint_bytes);
  ferry_fanout_free(fanout);
}

TEST_F(CApiFanout, ColumnSplitsMatchHostSlices) {
  const char* devices[] = {"cpu", "cpu"};
  options.devices = devices;
  options.device_count = 2;
  const ferry_shard_spec specs[] = {{"extra", 1, nullptr, 0}};  // 5 columns: 3 + 2
  options.specs = specs;
  options.spec_count = 1;
  ferry_fanout* fanout = nullptr;
  ASSERT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout), FERRY_STATUS_OK)
      << ferry_last_error();
  for (size_t d = 0; d < 2; ++d) {
    ferry_shard_info s{};
    ASSERT_EQ(ferry_fanout_tensor(fanout, d, "extra", &s), FERRY_STATUS_OK);
    EXPECT_EQ(s.begin, d == 0 ? 0u : 3u);
    EXPECT_EQ(bytes_at(s), columns(written.at("extra"), 4, 5, 4, s.begin, s.end));
  }
  ferry_fanout_free(fanout);
}

TEST_F(CApiFanout, BadRequestsAreStatusesWithMessages) {
  ferry_fanout* fanout = nullptr;
  // No devices.
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("no device"), std::string::npos);
  const char* devices[] = {"cpu", "cuda:0"};
  options.devices = devices;
  options.device_count = 2;
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("mixed"), std::string::npos);
  const char* hosts[] = {"cpu", "cpu"};
  options.devices = hosts;
  options.shard_mode = 7;
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("shard_mode 7"), std::string::npos);
  options.shard_mode = FERRY_SHARD_MODE_REPLICAS;
  const ferry_shard_spec unknown[] = {{"nope", 0, nullptr, 0}};
  options.specs = unknown;
  options.spec_count = 1;
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("\"nope\""), std::string::npos);
  const std::uint64_t wrong[] = {1, 1};  // 2 of 4 rows
  const ferry_shard_spec short_split[] = {{"extra", 0, wrong, 2}};
  options.specs = short_split;
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("extra"), std::string::npos);
  const ferry_shard_spec too_deep[] = {{"model.norm.weight", 1, nullptr, 0}};
  options.specs = too_deep;
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("model.norm.weight"), std::string::npos);
  options.specs = nullptr;
  options.spec_count = 0;
  options.struct_size = 0;
  EXPECT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(fanout, nullptr);
  EXPECT_EQ(ferry_checkpoint_load_fanout(nullptr, &options, &fanout),
            FERRY_STATUS_INVALID_ARGUMENT);

  // Asking a loaded result for what it lacks.
  ferry_fanout_options_init(&options);
  options.load = &load;
  options.devices = hosts;
  options.device_count = 2;
  ASSERT_EQ(ferry_checkpoint_load_fanout(checkpoint, &options, &fanout), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_shard_info s{};
  EXPECT_EQ(ferry_fanout_tensor(fanout, 2, "extra", &s), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("out of range"), std::string::npos);
  EXPECT_EQ(ferry_fanout_tensor(fanout, 0, "nope", &s), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("\"nope\""), std::string::npos);
  ferry_fanout_stats stats{};
  EXPECT_EQ(ferry_fanout_stats_get(fanout, &stats), FERRY_STATUS_INVALID_ARGUMENT);  // size 0
  ferry_fanout_device_stats ds{};
  EXPECT_EQ(ferry_fanout_device_stats_get(fanout, 5, &ds), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_fanout_device_count(nullptr), 0u);
  ferry_fanout_free(fanout);
  ferry_fanout_free(nullptr);
}

}  // namespace
