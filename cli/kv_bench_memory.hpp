// What `ferry kv bench` and its fleet form (kv_fleet_bench.hpp) share: a batch of blocks in the
// bench's memory laid out as an engine lays out its KV cache, and the page-cache helpers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/kv_store.hpp"
#include "kv_bench.hpp"

namespace ferry::detail {
class PrimaryContext;
}

namespace ferry::kv_bench {

// Where a block's pieces sit in a batch's memory: equal parts of one contiguous block, or an
// engine's layout over per-layer cache tensors laid back to back (all of them together hold the
// batch's blocks exactly, so the memory is the same size either way).
struct PieceLayout {
  std::string name;  // empty: equal parts
  unsigned pieces = 1, layers = 0, per_layer = 0;
  std::uint64_t page = 0;  // bytes of one piece
  // Offset and size of piece p of block b among `batch`.
  std::pair<std::uint64_t, std::uint64_t> piece(std::uint64_t block, std::uint64_t batch,
                                                std::uint64_t b, unsigned p) const;
};

// The layout `o` asks for; throws std::invalid_argument for an unknown one.
PieceLayout piece_layout(const KVBenchOptions& o);

// One batch of blocks in memory on the bench's device: `batch` blocks laid out as `layout`.
class BatchMemory {
 public:
  BatchMemory(const Device& device, std::uint64_t block, std::uint64_t batch, PieceLayout layout);
  std::byte* base() const { return static_cast<std::byte*>(_memory.get()); }
  std::vector<KVPiece> block(std::uint64_t b) const;
  void fill(const std::vector<std::byte>& bytes) const;
  std::vector<std::byte> read() const;

 private:
  Device _device;
  std::uint64_t _block, _batch;
  PieceLayout _layout;
  std::shared_ptr<detail::PrimaryContext> _context;
  std::shared_ptr<void> _memory;
};

// The median (of an even count, the mean of the middle two); 0 for none.
double median(std::vector<double> v);

// Drops the file's pages from the page cache (clean ones: the slabs are written O_DIRECT or
// synced), so the next read comes from the device.
void drop_cache(const std::filesystem::path& file);

// Reads a file through the page cache.
void warm(const std::filesystem::path& file);

// The slab files of a store's directory.
std::vector<std::filesystem::path> slabs_of(const std::filesystem::path& directory);

}  // namespace ferry::kv_bench
