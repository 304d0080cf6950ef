// Reads served straight from host memory that holds a file's bytes and that every rank's device
// can DMA from: a registered, read-only mapping of the file's page cache. No reader thread and
// no copy into staging: each rank's share of a round becomes a few asynchronous copies from the
// mapping into that rank's memory over its own host link, queued by the loading thread on one
// stream per rank; the round's collectives wait for them on the device (no host sync). Files
// without a mapping (not resident, over the budget, the option off) take the staged path, and
// each file's statistics say which path it took and why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/fanout_load.hpp"
#include "transfer/staged/copier.hpp"

namespace ferry::detail {

// One file's bytes in host memory the ranks' devices can DMA from, or why the file is staged.
struct MappedSource {
  const std::byte* data = nullptr;   // the file's byte 0; null: the file goes through staging
  std::uint64_t size = 0;            // bytes at data
  std::shared_ptr<const void> hold;  // keeps the mapping (and its registration) for the load
  std::string reason;                // why this path (reported per file)
  double register_seconds = 0;       // this load mapped and registered it (0: kept from before)
};

// The source of each file of `checkpoint` the load reads (`used[i]`: file i is read), for ranks on
// `devices`. A refusal is a MappedSource without data, with its reason.
using MapSources = std::function<std::vector<MappedSource>(
    const Checkpoint& checkpoint, const std::vector<bool>& used, std::span<const Device> devices,
    const LoadOptions& options)>;

// Every file staged (page-cache DMA off).
MapSources staged_sources_only();

// The process's page-cache registry (services/page_cache_registry.hpp): a lease on each read
// file's registered mapping where options.page_cache_pin_bytes > 0 and the registrations serve
// every rank's device; else (not fully in the page cache, over the budget, host ranks...) the
// file is staged and says why.
MapSources page_cache_sources();

// `size` bytes from `src` to address `dst` of a rank's memory (device or host).
struct DirectCopy {
  std::uintptr_t dst = 0;
  const std::byte* src = nullptr;
  std::uint64_t size = 0;
};

// One round's reads split by path.
struct RoundReads {
  std::vector<FanoutRead> staged;               // through the transfer core, as before
  std::vector<std::vector<DirectCopy>> direct;  // per rank, in plan order
  std::vector<bool> direct_to_scratch;          // per rank: some direct copy lands in scratch
  bool staged_to_scratch = false;
  std::uint64_t direct_bytes = 0;
};

// Splits `round`: reads of a file with a mapping become copies into `bases` / `scratch` (per
// rank), neighbours merged where source and destination both continue. Adds each file's direct
// bytes to `file_bytes`. Throws std::invalid_argument where a read lies outside its mapping.
RoundReads split_round(const FanoutRound& round, std::span<const MappedSource> sources,
                       std::span<const std::uintptr_t> bases,
                       std::span<const std::uintptr_t> scratch, unsigned ranks,
                       std::vector<std::uint64_t>& file_bytes);

// The ranks' copy queues: `streams` per rank (for a GPU, streams borrowed from the transfer
// core's pool; for host ranks memcpy, which runs at once). A rank's copies of one round are
// shared among its streams in contiguous parts of at least `min_part_bytes`, so that several copy
// engines read the mapping at once: copies from a registered page-cache mapping run below pinned
// H2D on one stream.
class DirectCopies {
 public:
  static constexpr std::uint64_t kMinPartBytes = 64ull << 20;
  DirectCopies(std::span<const Device> devices, unsigned streams,
               std::uint64_t min_part_bytes = kMinPartBytes);
  DirectCopies(const DirectCopies&) = delete;
  DirectCopies& operator=(const DirectCopies&) = delete;
  ~DirectCopies();  // drains: memory is never freed under a copy

  // Queues rank `rank`'s copies; returns a CUevent behind them per stream used, valid for this
  // object's life (none on host memory, where they already ran).
  std::vector<void*> queue(unsigned rank, std::span<const DirectCopy> copies);
  // Later copies of rank `rank`, on every stream, start only after `cu_event` fired (null: none).
  void after(unsigned rank, void* cu_event);
  // Until every queued copy landed.
  void drain() noexcept;

 private:
  std::vector<std::vector<std::unique_ptr<Copier>>> _copiers;  // per rank, per stream
  std::vector<PooledEvent> _marks;
  std::uint64_t _min_part;
};

// load_fanout with the mapping of files chosen by `map` (tests inject host memory here).
FanoutLoad load_fanout(std::shared_ptr<const Checkpoint> checkpoint, const FanoutOptions& options,
                       const MapSources& map);

}  // namespace ferry::detail
