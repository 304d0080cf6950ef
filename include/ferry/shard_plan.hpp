// A plan for loading one checkpoint onto N ranks (GPUs of one node) at once: what each rank holds
// (whole tensors, or slices along one dimension as tensor parallelism shards them) and which
// reads bring the bytes in, so that every byte is read from storage once per node and each
// rank's host link carries about 1/N of the bytes. Bytes every rank holds (replicated) lie in one
// region at the same offset on every rank and are read in rounds: in each round rank r reads its
// 1/N of the round's range into its own memory, then one in-place all-gather gives every rank the
// whole range. A split of the outermost dimension is one contiguous range per rank, which that
// rank reads itself. A split of an inner dimension is strided in the file: one rank (the one
// whose link carries least so far) reads the tensor whole into scratch memory and cuts every
// rank's slice from it over the GPUs' links (a 2-D copy per rank). Pure: no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"

namespace ferry {

// How the ranks share one tensor: every rank holds all of it (dim < 0), or rank r holds the r-th
// range of dimension `dim` (of TensorInfo::shape, outermost first). `sizes` gives each rank's
// length along dim (they must add up to the dimension); empty splits as evenly as possible, the
// first (length % N) ranks one longer, so ranks past the length hold empty slices.
struct ShardSpec {
  int dim = -1;
  std::vector<std::uint64_t> sizes = {};

  static ShardSpec replicate() { return {}; }
  static ShardSpec split(int dim, std::vector<std::uint64_t> sizes = {}) {
    return {dim, std::move(sizes)};
  }
  bool replicated() const noexcept { return dim < 0; }
};

// Chooses each tensor's spec; a serving framework maps its parameter names here.
using ShardRule = std::function<ShardSpec(const TensorInfo&)>;

// Every rank holds every tensor (replicas).
ShardSpec replicate_all(const TensorInfo& tensor);

// Tensor parallelism as vLLM shards Llama, Qwen and Mistral: q/k/v/gate/up projections split by
// output rows (dim 0), o/down projections by input columns (dim 1), the embedding and lm_head
// by vocabulary rows; norms, biases of row-split layers excepted, and anything else replicated.
// Knows Hugging Face names (q_proj, o_proj, embed_tokens...) and GGUF's (attn_q, attn_output,
// token_embd, output...).
ShardSpec llama_tensor_parallel(const TensorInfo& tensor);

struct FanoutPlanOptions {
  std::uint64_t chunk_bytes = 8ull << 20;    // largest single read
  std::uint64_t round_bytes = 256ull << 20;  // each rank's share of one all-gather round
  std::uint64_t alignment = 256;             // of every tensor in a rank's allocation
};

// What one rank holds of one tensor: the slice [begin, end) of dimension `dim` (the whole tensor
// when dim < 0), `bytes` long at `dest_offset` of the rank's allocation, row-major as in the file.
struct ShardPiece {
  const TensorInfo* info = nullptr;
  int dim = -1;
  std::uint64_t begin = 0, end = 0;  // along dim; 0..0 for a whole tensor
  std::vector<std::uint64_t> shape;  // of the slice
  std::uint64_t bytes = 0;
  std::uint64_t dest_offset = 0;
  bool replicated() const noexcept { return dim < 0; }
};

struct RankLayout {
  std::vector<ShardPiece> pieces;  // one per selected tensor, in read order (file, offset)
  std::uint64_t dest_bytes = 0;    // the rank's allocation
  std::uint64_t tensor_bytes = 0;  // sum of its pieces
};

// `size` bytes at `chunk_offset` of a read land at `dest_offset` of rank `rank`'s allocation, or
// of its scratch memory when `to_scratch`.
struct FanoutCopy {
  std::uint32_t rank = 0;
  std::uint64_t dest_offset = 0;
  std::uint64_t chunk_offset = 0;
  std::uint64_t size = 0;
  bool to_scratch = false;
};

// One read of [file_offset, file_offset + size) of one file, by `reader`, whose host link carries
// it: every copy goes to the reader's own memory.
struct FanoutRead {
  std::uint32_t file_index = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::uint32_t reader = 0;
  std::vector<FanoutCopy> copies;  // in chunk order, not overlapping
};

// One rank's slice of a tensor split along an inner dimension: of each of the tensor's rows (in
// the reader's scratch), `width` bytes from `row_begin`, packed at `dest_offset` of `rank`.
struct ScatterPart {
  std::uint32_t rank = 0;
  std::uint64_t dest_offset = 0;
  std::uint64_t row_begin = 0;
  std::uint64_t width = 0;
};

// A tensor read whole into `reader`'s scratch at `scratch_offset`: `rows` rows of `row_bytes`
// (the product of the dimensions before the split one, and the bytes from the split dimension
// on), cut into every rank's slice.
struct FanoutScatter {
  const TensorInfo* info = nullptr;
  std::uint32_t reader = 0;
  std::uint64_t scratch_offset = 0;
  std::uint64_t rows = 0;
  std::uint64_t row_bytes = 0;
  std::vector<ScatterPart> parts;  // one per rank with a non-empty slice
};

// A batch of reads, then its scatters, then (when gather_bytes_per_rank > 0) the in-place
// all-gather of the replicated bytes [gather_offset, gather_offset + ranks *
// gather_bytes_per_rank): before it, rank r holds its own part [gather_offset + r *
// gather_bytes_per_rank, ...); after it every rank holds the whole range. Rounds run in order; a
// round's reads may overlap the previous gather.
struct FanoutRound {
  std::vector<FanoutRead> reads;  // interleaved across readers, so that every link stays busy
  std::vector<FanoutScatter> scatters;
  std::uint64_t gather_offset = 0;
  std::uint64_t gather_bytes_per_rank = 0;
};

struct FanoutPlan {
  unsigned ranks = 0;
  std::vector<RankLayout> layouts;     // per rank
  std::uint64_t replicated_bytes = 0;  // the region at offset 0 of every rank (padding included)
  std::vector<FanoutRound> rounds;
  std::uint64_t read_bytes = 0;           // from storage: every tensor byte exactly once
  std::vector<std::uint64_t> link_bytes;  // per rank: bytes copied from host memory into it
  std::vector<std::uint64_t> peer_bytes;  // per rank: bytes it receives from other ranks
  // Per rank: scratch memory for scatters, two banks that rounds use in turn (round k uses bank
  // k % 2, which begins at 0 or at scratch_bank_bytes[rank]): round k's reads may start only
  // after round k - 2's scatters finished.
  std::vector<std::uint64_t> scratch_bank_bytes;
};

// Plans a load of the named tensors (all when `names` is empty) onto `ranks` ranks. Throws
// std::invalid_argument naming the tensor for an unknown name, a dimension the tensor lacks,
// split sizes that do not add up to it or whose count is not `ranks`, and a split that would cut
// a quantized GGUF block; and for zero ranks, chunk or round bytes.
FanoutPlan plan_fanout(const Checkpoint& checkpoint, unsigned ranks, const ShardRule& rule,
                       std::span<const std::string> names = {},
                       const FanoutPlanOptions& options = {});

// The same over tensor records alone (the checkpoint's files are not needed to plan).
FanoutPlan plan_fanout(std::span<const TensorInfo> tensors, unsigned ranks, const ShardRule& rule,
                       std::span<const std::string> names = {},
                       const FanoutPlanOptions& options = {});

}  // namespace ferry
