// The multi-device planner, on the CPU: plans are executed on host buffers (reads from a
// simulated file, then the all-gathers) and every rank's bytes compared with its slice cut on
// the host; every tensor byte must be read exactly once and the links share the bytes evenly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "ferry/ggml_type.hpp"
#include "ferry/shard_plan.hpp"
#include "shard_reference.hpp"

namespace ferry {
namespace {

// The byte at `offset` of file `file`: distinct enough that a misplaced byte shows.
std::byte file_byte(std::uint32_t file, std::uint64_t offset) {
  std::uint64_t x = (offset + 1) * 0x9E3779B97F4A7C15ull ^ (file + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}

std::vector<std::byte> whole(const TensorInfo& t) {
  std::vector<std::byte> out(t.size);
  for (std::uint64_t i = 0; i < t.size; ++i) out[i] = file_byte(t.file_index, t.offset + i);
  return out;
}

// Tensors packed back to back in `files` files, as safetensors lays them out.
struct Builder {
  std::vector<TensorInfo> tensors;
  std::vector<std::uint64_t> ends;
  explicit Builder(unsigned files = 1) : ends(files, 64) {}
  void add(std::string name, DType dtype, std::vector<std::uint64_t> shape,
           std::uint32_t file = 0) {
    std::uint64_t n = dtype_bits(dtype) / 8;
    for (auto d : shape) n *= d;
    tensors.push_back({std::move(name), dtype, std::move(shape), file, ends[file], n});
    ends[file] += n;
  }
};

// Runs the plan on host memory and checks every property the issue asks for.
void check_plan(const std::vector<TensorInfo>& tensors, unsigned ranks, const ShardRule& rule,
                const FanoutPlanOptions& options) {
  SCOPED_TRACE("ranks " + std::to_string(ranks));
  const FanoutPlan plan = plan_fanout(tensors, ranks, rule, {}, options);
  ASSERT_EQ(plan.ranks, ranks);
  ASSERT_EQ(plan.layouts.size(), ranks);
  std::vector<std::vector<std::byte>> memory(ranks), scratch(ranks);
  for (unsigned r = 0; r < ranks; ++r) {
    memory[r].assign(plan.layouts[r].dest_bytes, std::byte{0xEE});
    scratch[r].assign(2 * plan.scratch_bank_bytes[r], std::byte{0xDD});
  }

  std::map<std::pair<std::uint32_t, std::uint64_t>, int> times_read;  // per file byte
  std::uint64_t copied = 0;
  std::vector<std::uint64_t> link(ranks, 0);
  std::vector<std::uint64_t> peer(ranks, 0);
  for (std::size_t k = 0; k < plan.rounds.size(); ++k) {
    const FanoutRound& round = plan.rounds[k];
    for (const FanoutRead& read : round.reads) {
      ASSERT_LE(read.size, options.chunk_bytes);
      for (std::uint64_t i = 0; i < read.size; ++i)
        ++times_read[{read.file_index, read.file_offset + i}];
      std::uint64_t at = 0;
      for (const FanoutCopy& c : read.copies) {
        ASSERT_EQ(c.chunk_offset, at) << "copies are back to back";
        ASSERT_EQ(c.rank, read.reader) << "a read lands in its reader's memory only";
        auto& target = c.to_scratch ? scratch[c.rank] : memory[c.rank];
        ASSERT_LE(c.dest_offset + c.size, target.size());
        if (c.to_scratch) {  // inside the round's bank
          const std::uint64_t bank = plan.scratch_bank_bytes[c.rank];
          ASSERT_GE(c.dest_offset, k % 2 ? bank : 0);
          ASSERT_LE(c.dest_offset + c.size, k % 2 ? 2 * bank : bank);
        }
        for (std::uint64_t i = 0; i < c.size; ++i)
          target[c.dest_offset + i] =
              file_byte(read.file_index, read.file_offset + c.chunk_offset + i);
        at += c.size;
        link[c.rank] += c.size;
        copied += c.size;
        // Replicated bytes are read by the rank that owns that part of the round.
        if (!c.to_scratch && c.dest_offset < plan.replicated_bytes) {
          ASSERT_GT(round.gather_bytes_per_rank, 0u);
          ASSERT_EQ((c.dest_offset - round.gather_offset) / round.gather_bytes_per_rank, c.rank);
        }
      }
      ASSERT_EQ(at, read.size);
    }
    for (const FanoutScatter& sc : round.scatters)
      for (const ScatterPart& part : sc.parts) {
        ASSERT_LE(part.row_begin + part.width, sc.row_bytes);
        for (std::uint64_t row = 0; row < sc.rows; ++row)
          std::memcpy(
              memory[part.rank].data() + part.dest_offset + row * part.width,
              scratch[sc.reader].data() + sc.scratch_offset + row * sc.row_bytes + part.row_begin,
              part.width);
        if (part.rank != sc.reader) peer[part.rank] += part.width * sc.rows;
      }
    for (unsigned r = 0; r < ranks && ranks > 1; ++r)
      peer[r] += (ranks - 1) * round.gather_bytes_per_rank;
    for (unsigned from = 0; from < ranks; ++from)
      for (unsigned to = 0; to < ranks; ++to)
        if (to != from && round.gather_bytes_per_rank > 0)
          std::memcpy(
              memory[to].data() + round.gather_offset + from * round.gather_bytes_per_rank,
              memory[from].data() + round.gather_offset + from * round.gather_bytes_per_rank,
              round.gather_bytes_per_rank);
  }

  // Every tensor byte read exactly once, and nothing else.
  std::uint64_t total = 0;
  for (const TensorInfo& t : tensors) {
    total += t.size;
    for (std::uint64_t i = 0; i < t.size; ++i)
      ASSERT_EQ((times_read[{t.file_index, t.offset + i}]), 1) << t.name << " byte " << i;
  }
  EXPECT_EQ(times_read.size(), total);
  EXPECT_EQ(plan.read_bytes, total);
  EXPECT_EQ(copied, total);
  EXPECT_EQ(link, plan.link_bytes);
  EXPECT_EQ(peer, plan.peer_bytes);

  // Every rank holds exactly its slices.
  for (unsigned r = 0; r < ranks; ++r) {
    ASSERT_EQ(plan.layouts[r].pieces.size(), tensors.size());
    for (const ShardPiece& p : plan.layouts[r].pieces) {
      const auto want = test::host_slice(whole(*p.info), p);
      ASSERT_EQ(p.bytes, want.size()) << p.info->name;
      ASSERT_EQ(p.dest_offset % options.alignment, 0u);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), memory[r].begin() + p.dest_offset))
          << p.info->name << " on rank " << r;
    }
  }
}

FanoutPlanOptions small_options() {
  FanoutPlanOptions o;
  o.chunk_bytes = 4096;
  o.round_bytes = 8192;
  return o;
}

TEST(ShardPlan, ReplicasReadEveryByteOnceAndShareTheLinks) {
  Builder b;
  for (unsigned i = 0; i < 40; ++i)
    b.add("t" + std::to_string(i), DType::BF16, {32, 16u + 8u * (i % 5u)});
  for (unsigned n = 1; n <= 8; ++n) {
    check_plan(b.tensors, n, replicate_all, small_options());
    const FanoutPlan plan = plan_fanout(b.tensors, n, replicate_all, {}, small_options());
    // Each link carries 1/N, give or take the last round's alignment.
    const std::uint64_t share = plan.read_bytes / n;
    for (std::uint64_t bytes : plan.link_bytes)
      EXPECT_LE(bytes > share ? bytes - share : share - bytes, n * 256u + 256u) << n;
    EXPECT_EQ(plan.replicated_bytes % (n * 256u), 0u);
    EXPECT_GT(plan.rounds.size(), 1u);  // several rounds: reads overlap gathers
  }
}

std::vector<TensorInfo> llama_like(std::uint64_t hidden, std::uint64_t inter, std::uint64_t vocab,
                                   unsigned layers) {
  Builder b;
  b.add("model.embed_tokens.weight", DType::BF16, {vocab, hidden});
  for (unsigned l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.add(p + "input_layernorm.weight", DType::BF16, {hidden});
    b.add(p + "self_attn.q_proj.weight", DType::BF16, {hidden, hidden});
    b.add(p + "self_attn.k_proj.weight", DType::BF16, {hidden / 4, hidden});
    b.add(p + "self_attn.v_proj.weight", DType::BF16, {hidden / 4, hidden});
    b.add(p + "self_attn.o_proj.weight", DType::BF16, {hidden, hidden});
    b.add(p + "post_attention_layernorm.weight", DType::BF16, {hidden});
    b.add(p + "mlp.gate_proj.weight", DType::BF16, {inter, hidden});
    b.add(p + "mlp.up_proj.weight", DType::BF16, {inter, hidden});
    b.add(p + "mlp.down_proj.weight", DType::BF16, {hidden, inter});
  }
  b.add("model.norm.weight", DType::BF16, {hidden});
  b.add("lm_head.weight", DType::BF16, {vocab, hidden});
  return b.tensors;
}

TEST(ShardPlan, TensorParallelSlicesAsVllmDoes) {
  const auto tensors = llama_like(64, 192, 320, 2);
  for (unsigned n : {1u, 2u, 4u, 8u}) {
    check_plan(tensors, n, llama_tensor_parallel, small_options());
    const FanoutPlan plan = plan_fanout(tensors, n, llama_tensor_parallel, {}, small_options());
    const auto& pieces = plan.layouts[0].pieces;
    auto find = [&](std::string_view name) {
      return *std::find_if(pieces.begin(), pieces.end(),
                           [&](const ShardPiece& p) { return p.info->name == name; });
    };
    EXPECT_EQ(find("model.layers.0.self_attn.q_proj.weight").dim, 0);
    EXPECT_EQ(find("model.layers.0.self_attn.o_proj.weight").dim, 1);
    EXPECT_EQ(find("model.layers.0.mlp.down_proj.weight").dim, 1);
    EXPECT_EQ(find("model.embed_tokens.weight").dim, 0);
    EXPECT_EQ(find("lm_head.weight").shape, (std::vector<std::uint64_t>{320 / n, 64}));
    EXPECT_TRUE(find("model.norm.weight").replicated());
    // Inner splits are read whole by the least loaded link: the links differ by at most the
    // largest of them (and the norms' alignment).
    const std::uint64_t share = plan.read_bytes / n;
    const std::uint64_t down_proj = 64 * 192 * 2;
    for (std::uint64_t bytes : plan.link_bytes)
      EXPECT_LE(bytes > share ? bytes - share : share - bytes, down_proj + 4096u) << n;
  }
}

TEST(ShardPlan, UnevenSplitsAndTensorsSmallerThanTheRanks) {
  Builder b;
  b.add("a.q_proj.weight", DType::F32, {7, 5});   // 7 rows over 2..8 ranks
  b.add("a.o_proj.weight", DType::F16, {3, 11});  // 11 columns
  b.add("a.up_proj.weight", DType::U8, {2});      // fewer elements than ranks
  b.add("a.down_proj.weight", DType::BF16, {5, 1, 3});
  b.add("a.norm.weight", DType::F32, {3});
  b.add("empty.q_proj.weight", DType::F32, {0, 4});
  for (unsigned n = 1; n <= 8; ++n)
    check_plan(b.tensors, n, llama_tensor_parallel, small_options());
  const FanoutPlan plan = plan_fanout(b.tensors, 4, llama_tensor_parallel, {}, small_options());
  // The first (7 % 4) ranks hold one more row; ranks past the length hold empty slices.
  EXPECT_EQ(plan.layouts[0].pieces[0].shape, (std::vector<std::uint64_t>{2, 5}));
  EXPECT_EQ(plan.layouts[3].pieces[0].shape, (std::vector<std::uint64_t>{1, 5}));
  EXPECT_EQ(plan.layouts[3].pieces[2].bytes, 0u);
}

TEST(ShardPlan, RandomCheckpointsAndRules) {
  std::mt19937_64 rng(15);
  const DType dtypes[] = {DType::U8, DType::BF16, DType::F32, DType::F64};
  for (int trial = 0; trial < 40; ++trial) {
    Builder b(1 + rng() % 3);
    const int count = 1 + static_cast<int>(rng() % 25);
    for (int i = 0; i < count; ++i) {
      std::vector<std::uint64_t> shape(rng() % 4);
      for (auto& d : shape) d = rng() % 9;
      b.add("t" + std::to_string(i), dtypes[rng() % 4], shape,
            static_cast<std::uint32_t>(rng() % b.ends.size()));
    }
    const unsigned ranks = 1 + rng() % 8;
    std::map<std::string, ShardSpec> specs;
    for (const auto& t : b.tensors) {
      if (t.shape.empty() || rng() % 3 == 0) continue;
      ShardSpec s = ShardSpec::split(static_cast<int>(rng() % t.shape.size()));
      if (rng() % 2) {  // explicit, random sizes
        std::uint64_t left = t.shape[s.dim];
        for (unsigned r = 0; r + 1 < ranks; ++r) {
          s.sizes.push_back(left ? rng() % (left + 1) : 0);
          left -= s.sizes.back();
        }
        s.sizes.push_back(left);
      }
      specs[t.name] = s;
    }
    const ShardRule rule = [&](const TensorInfo& t) {
      auto it = specs.find(t.name);
      return it == specs.end() ? ShardSpec::replicate() : it->second;
    };
    FanoutPlanOptions o;
    o.chunk_bytes = 1 + rng() % 300;
    o.round_bytes = 1 + rng() % 700;
    o.alignment = std::uint64_t{1} << (rng() % 9);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_plan(b.tensors, ranks, rule, o);
  }
}

TEST(ShardPlan, QuantizedGgufSplitsKeepWholeBlocks) {
  const GgmlTypeTraits& q4 = ggml_type_traits(GgmlType::Q4_0);  // 32 elements in 18 bytes
  Builder b;
  b.add("blk.0.attn_output.weight", DType::U8, {6, 4 * q4.type_size});
  b.add("blk.0.attn_q.weight", DType::U8, {6, 4 * q4.type_size});
  for (auto& t : b.tensors) t.ggml_type = static_cast<std::int32_t>(GgmlType::Q4_0);
  check_plan(b.tensors, 2, llama_tensor_parallel, small_options());
  check_plan(b.tensors, 4, llama_tensor_parallel, small_options());
  const FanoutPlan plan = plan_fanout(b.tensors, 3, llama_tensor_parallel, {}, small_options());
  EXPECT_EQ(plan.layouts[0].pieces[0].shape[1], 2 * q4.type_size);  // 4 blocks over 3: 2, 1, 1
  EXPECT_EQ(plan.layouts[2].pieces[0].shape[1], q4.type_size);
  const ShardRule cut = [](const TensorInfo&) { return ShardSpec::split(1, {10, 62}); };
  EXPECT_THROW(
      {
        try {
          plan_fanout(b.tensors, 2, cut, {}, small_options());
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("quantized block"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
}

TEST(ShardPlan, BadSpecsAreClearErrors) {
  Builder b;
  b.add("w", DType::F32, {4, 6});
  auto message = [&](const ShardRule& rule, unsigned ranks = 2) -> std::string {
    try {
      plan_fanout(b.tensors, ranks, rule, {}, small_options());
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message([](auto&) { return ShardSpec::split(2); }).find("cannot split dimension 2"),
            std::string::npos);
  EXPECT_NE(message([](auto&) {
              return ShardSpec::split(0, {1, 1});
            }).find("add up to 2"),
            std::string::npos);
  EXPECT_NE(message([](auto&) {
              return ShardSpec::split(0, {1, 2, 1});
            }).find("3 split sizes"),
            std::string::npos);
  EXPECT_NE(message([](auto&) {
              return ShardSpec::split(1, {5, 5});
            }).find("more than"),
            std::string::npos);
  EXPECT_NE(message(replicate_all, 0).find("at least one"), std::string::npos);
  const std::string names[] = {"missing"};
  EXPECT_THROW(plan_fanout(b.tensors, 2, replicate_all, names), std::invalid_argument);
}

}  // namespace
}  // namespace ferry
