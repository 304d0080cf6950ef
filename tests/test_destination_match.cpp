// match_destinations: tied weights filled once and never missing; missing and unexpected names
// as load_state_dict reports them; the match then loads through load_into bit-exact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "load/destination_match.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using ::testing::ElementsAre;

TEST(DestinationMatch, TiedWeightsAreFilledOnceFromTheNameTheCheckpointHolds) {
  test::TempDir dir;
  const auto path = dir / "tied.safetensors";
  // As transformers saves a tied model: embed_tokens.weight only.
  const auto written = test::write_random_checkpoint(path,
                                                     {{"embed_tokens.weight", DType::F32, {16, 8}},
                                                      {"norm.weight", DType::F32, {8}},
                                                      {"rotary.inv_freq", DType::F32, {4}}},
                                                     3);
  const auto checkpoint = Checkpoint::open(path);
  std::vector<std::byte> embed(16 * 8 * 4), norm(8 * 4), bias(8 * 4);
  const std::vector<TensorDestination> destinations = {
      {"lm_head.weight", embed.data(), embed.size()},  // the same memory under two names
      {"embed_tokens.weight", embed.data(), embed.size()},
      {"norm.weight", norm.data(), norm.size()},
      {"norm.bias", bias.data(), bias.size()},
  };
  const DestinationMatch match = match_destinations(checkpoint, destinations);
  ASSERT_EQ(match.to_fill.size(), 2u);
  EXPECT_EQ(match.to_fill[0].name, "embed_tokens.weight");
  EXPECT_EQ(match.to_fill[0].data, embed.data());
  EXPECT_EQ(match.to_fill[1].name, "norm.weight");
  EXPECT_THAT(match.missing, ElementsAre("norm.bias"));
  EXPECT_THAT(match.unexpected, ElementsAre("rotary.inv_freq"));

  load_into(checkpoint, match.to_fill, LoadOptions{});
  EXPECT_EQ(embed, written.at("embed_tokens.weight"));
  EXPECT_EQ(norm, written.at("norm.weight"));
}

TEST(DestinationMatch, EveryAliasAbsentIsMissingAndSeparateMemoriesStaySeparate) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {4}}, {"b", DType::U8, {4}}}, 1);
  const auto checkpoint = Checkpoint::open(path);
  std::vector<std::byte> x(4), y(4), z(4);
  const std::vector<TensorDestination> destinations = {
      {"a", x.data(), 4}, {"b", y.data(), 4}, {"c", z.data(), 4}, {"d", z.data(), 4}};
  const DestinationMatch match = match_destinations(checkpoint, destinations);
  ASSERT_EQ(match.to_fill.size(), 2u);
  EXPECT_THAT(match.missing, ElementsAre("c", "d"));
  EXPECT_TRUE(match.unexpected.empty());
}

}  // namespace
}  // namespace ferry
