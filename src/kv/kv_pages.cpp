// paged_blocks: a batch's pieces from per-layer geometry (include/ferry/kv_pages.hpp).
#include "ferry/kv_pages.hpp"

#include <cstddef>
#include <stdexcept>

#include "ferry/error.hpp"

namespace ferry {
namespace {

void check_layer(const KVPagedLayer& layer, std::size_t index) {
  FERRY_EXPECT(layer.base != nullptr, std::invalid_argument, "KV paged layer ", index,
               " has no memory");
  FERRY_EXPECT(layer.rows > 0, std::invalid_argument, "KV paged layer ", index, " has no rows");
  FERRY_EXPECT(layer.row_bytes > 0, std::invalid_argument, "KV paged layer ", index,
               ": rows of 0 bytes");
  FERRY_EXPECT(layer.rows == 1 || layer.row_stride >= layer.row_bytes, std::invalid_argument,
               "KV paged layer ", index, ": rows of ", layer.row_bytes, " bytes overlap (stride ",
               layer.row_stride, ")");
}

}  // namespace

KVBlockList paged_blocks(std::span<const KVPagedLayer> layers,
                         std::span<const std::uint64_t> rows) {
  FERRY_EXPECT(!layers.empty(), std::invalid_argument, "KV paged blocks need at least one layer");
  for (std::size_t l = 0; l < layers.size(); ++l) check_layer(layers[l], l);
  KVBlockList out(rows.size());
  for (std::size_t b = 0; b < rows.size(); ++b) {
    out[b].reserve(layers.size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const KVPagedLayer& layer = layers[l];
      FERRY_EXPECT(rows[b] < layer.rows, std::invalid_argument, "KV block ", b, ": row ", rows[b],
                   " is past paged layer ", l, "'s ", layer.rows, " rows");
      auto* row = static_cast<const std::byte*>(layer.base) + rows[b] * layer.row_stride;
      out[b].push_back({const_cast<std::byte*>(row), layer.row_bytes, layer.device});
    }
  }
  return out;
}

}  // namespace ferry
