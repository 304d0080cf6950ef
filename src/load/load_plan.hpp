// The load plan: where every selected tensor lands in one destination allocation, and the
// large file reads (chunks) that bring its bytes in. Planning reads no tensor data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"

namespace ferry {

struct PlanOptions {
  std::uint64_t chunk_bytes = 8ull << 20;  // largest single read
  std::uint64_t alignment = 256;           // of each tensor in the destination allocation
  std::uint64_t max_gap_bytes = 1ull << 20;  // holes up to this are read through, not split
};

// `size` bytes at `chunk_offset` of a chunk belong at `tensor_offset` of plan tensor `tensor`.
struct CopySegment {
  std::uint32_t tensor = 0;  // index into LoadPlan::tensors
  std::uint64_t tensor_offset = 0;
  std::uint64_t chunk_offset = 0;
  std::uint64_t size = 0;
};

// One read of [file_offset, file_offset + size) of one file, at most chunk_bytes long.
struct ReadChunk {
  std::uint32_t file_index = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::vector<CopySegment> copies;
};

struct LoadPlan {
  std::vector<const TensorInfo*> tensors;   // the selection, in read order
  std::vector<std::uint64_t> dest_offsets;  // per tensor, multiples of alignment
  std::uint64_t dest_bytes = 0;             // size of the one destination allocation
  std::uint64_t tensor_bytes = 0;           // sum of tensor sizes
  std::uint64_t read_bytes = 0;             // sum of chunk sizes (holes read through count)
  std::vector<ReadChunk> chunks;
};

// Plans a load of the named tensors (all when `names` is empty). Throws std::invalid_argument
// for a name the checkpoint does not hold or a zero chunk size or non-power-of-two alignment.
LoadPlan plan_load(const Checkpoint& checkpoint, std::span<const std::string> names,
                   const PlanOptions& options = {});

}  // namespace ferry
