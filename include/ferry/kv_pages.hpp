// The blocks of a paged KV cache, described per layer instead of per piece: serving engines keep
// one tensor per layer (or per K and V) whose rows are blocks (vLLM's per-layer
// (num_blocks, page_bytes) pages, SGLang's K and V buffers). Block i of a batch is row rows[i]
// of every layer, in layer order. Building the pieces here costs one entry per layer for the
// caller instead of one per piece (a 16k-token prompt of a 32-layer model is 33,000 pieces).
#pragma once

#include <cstdint>
#include <span>

#include "ferry/device.hpp"
#include "ferry/kv_store.hpp"

namespace ferry {

struct KVPagedLayer {
  const void* base = nullptr;    // row 0
  std::uint64_t row_bytes = 0;   // one block's page in this layer
  std::uint64_t row_stride = 0;  // bytes from one row to the next (>= row_bytes)
  std::uint64_t rows = 0;        // blocks the layer holds
  Device device = Device::cpu();
};

// The pieces of each block `rows[i]`: its row of every layer. Throws std::invalid_argument
// naming the layer or the block where a layer has no rows, a row of 0 bytes, rows that overlap
// (stride < row bytes), or a row index past the layer's rows.
KVBlockList paged_blocks(std::span<const KVPagedLayer> layers, std::span<const std::uint64_t> rows);

}  // namespace ferry
