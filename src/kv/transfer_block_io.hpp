// BlockIo over the transfer core (ferry/transfer.hpp): blocks with any piece in GPU memory go
// as ONE extent each to the
// staged backend (device <-> pinned slots <-> O_DIRECT) or to cuFile (straight between device
// memory and the slab files, handles registered once in the core's cache). cuFile moves one
// contiguous device range per call, so a block of several pieces is first gathered on the
// device into a bounce buffer (device-to-device copies), written with one cuFile call, and read
// back the same way: never one write per piece. On the staged path too, a block of several
// pieces all on one GPU (vLLM's per-layer K and V pages) is gathered into one run of a device
// bounce buffer by one kernel launch per batch (cuda/device_copies.hpp) and moves as one span
// (large copies to host staging, not one per 32 KiB page); a get's runs land there, are
// verified, and only then scattered into the pieces by one launch. Blocks wholly in host memory
// go to HostBlockIo.
//
// The path is chosen per batch by KVPath (auto: cuFile only where it does true GPUDirect
// Storage) and reported per block. Checksums come from BlockHasher (the bytes copied down from
// the device), or from the device bounce buffer before it is scattered.
//
// With page-cache DMA enabled (kv/page_cache_gets.hpp), a get's blocks go to it first, whatever
// their memory; what it does not serve takes the paths above.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/device_copies.hpp"
#include "ferry/file_set.hpp"
#include "ferry/kv_store.hpp"
#include "ferry/transfer.hpp"
#include "kv/block_hasher.hpp"
#include "kv/host_block_io.hpp"
#include "kv/page_cache_gets.hpp"

namespace ferry::detail::kv {

class TransferBlockIo final : public BlockIo {
 public:
  // For tests and CPU profiling of the staged path on machines without a GPU:
  // `host_through_core`: host blocks too go through the transfer core, as GPU blocks do;
  // `threads`: the core's workers per batch (0: its default, one per core up to 16).
  TransferBlockIo(SlabFiles& slabs, std::uint64_t slot_bytes, bool writable, KVPath path,
                  bool allow_compat, bool host_through_core = false, unsigned threads = 0);
  // KVStoreOptions::gpu_groups (its zeros: the defaults).
  void set_groups(const KVGpuGroups& groups) { _groups = groups; }
  // Page-cache DMA for gets (KVStoreOptions::page_cache_pin_bytes) over slabs of `slab_bytes`.
  void enable_page_cache(std::uint64_t budget_bytes, std::uint64_t slot_bytes,
                         std::uint64_t slab_bytes);
  void write(std::span<BlockRequest> batch, void* after_event) override;
  void read(std::span<BlockRequest> batch) override;
  PageCacheCounters page_cache_counters() const override;
  void sync(int slab) override { _host.sync(slab); }
  bool direct() const override { return _host.direct(); }
  void share_writes(unsigned writers) override;
  StagedTimes staged_times() const override;

 private:
  // Runs `move` over the blocks with GPU pieces, HostBlockIo over the others.
  template <class HostMove, class GpuMove>
  void split(std::span<BlockRequest> batch, HostMove&& host, GpuMove&& gpu);
  // read() without page-cache DMA.
  void read_moved(std::span<BlockRequest> batch);
  void move_gpu(std::vector<BlockRequest*>& blocks, bool writing, void* after_event);
  // The blocks in groups, one submission each; blocks of several pieces go through a device
  // bounce buffer (cuFile: any block but one piece of GPU memory; staged: pieces all on one GPU,
  // where its kernels run). Each group is started (gathered, submitted) before the ones before
  // it are finished (waited for, verified, scattered), the core's workers shared between them
  // (see kFlights; KVGpuGroups changes the sizes).
  struct Group;
  struct Flight;
  bool reads_buffered(std::span<BlockRequest* const> blocks) const;
  std::vector<std::span<BlockRequest* const>> cut_groups(std::span<BlockRequest* const> blocks,
                                                         bool direct, std::uint64_t group_bytes);
  void reserve_bounce(std::span<const std::span<BlockRequest* const>> groups, bool direct,
                      std::size_t flights);
  std::unique_ptr<Flight> start_group(std::span<BlockRequest* const> blocks, bool writing,
                                      bool direct, bool buffered, void* after_event,
                                      std::size_t flight, unsigned threads);
  void finish_group(Flight& f, void* after_event);
  bool through_bounce(const BlockRequest& r, bool direct);
  bool kernels_usable(int ordinal);
  // The groups' steps: each bounced block's run in its device's bounce buffer; the gather of
  // pieces into runs (a put) or the scatter of verified runs into pieces (a get), one kernel
  // launch per device where its pieces are all on it; the submission's options; the blocks'
  // outcomes and routes from the ticket.
  void place_in_bounce(Group& g);
  void bounce_copies(Group& g, bool into_bounce, void* after_event);
  // A staged get's scatters block by block (Group::parts): uploaded while the transfer starts
  // (none where that fails), block `i`'s queued behind the core's `event`
  // (TransferOptions::extent_copied; never throws: a block not scattered here is after the group),
  // all waited for.
  void prepare_scatters(Group& g) noexcept;
  std::map<int, DeviceCopyParts> scatter_parts(const Group& g);
  void scatter_block(Group& g, std::size_t i, void* event) noexcept;
  void wait_scatters(const Group& g);
  TransferOptions group_options(const Group& g, void* after_event) const;
  void record_times(const TransferStats& stats);
  void settle(Group& g, const Ticket& ticket);
  static std::vector<Extent> extents_of(const Group& g);
  void hash_direct_put(const Group& g, void* after_event);
  std::vector<std::uint64_t> hash_direct_get(const Group& g, const Ticket& ticket);
  void verify(const Group& g, const std::vector<bool>& landed,
              const std::vector<std::uint64_t>& sums);
  TransferOptions options(void* after_event) const;
  // XXH3 of each wanted block's device-side bytes, on up to kHashers threads (a hasher each, its
  // own pinned buffers and stream): the copies down and the hashing of several blocks overlap.
  // `landed` (if given) waits until block i's transfer ended and says whether it landed (else it
  // is not hashed): a get's blocks are hashed while later ones are still being read.
  std::vector<std::uint64_t> hash_blocks(const std::vector<std::vector<BlockSpan>>& views,
                                         const std::vector<bool>& wanted,
                                         const std::vector<void*>& after_events,
                                         const std::function<bool(std::size_t)>& landed = {});
  // Part `flight` of `ordinal`'s bounce buffer (reserve_bounce made it), at least `bytes`.
  std::uintptr_t bounce_part(int ordinal, std::size_t flight, std::uint64_t bytes);

  HostBlockIo _host;
  SlabFiles& _slabs;
  bool _writable;
  KVPath _path;
  bool _allow_compat;
  bool _host_through_core;
  unsigned _threads;
  KVGpuGroups _groups;
  std::atomic<unsigned> _writers{1};  // share_writes
  std::shared_ptr<FileSet>
      _files;         // the slabs for the transfer core, opened at the first GPU batch
  std::mutex _mutex;  // one GPU batch at a time: the hashers and bounce buffers are shared
  static constexpr std::size_t kHashers = 4;
  std::array<BlockHasher, kHashers> _hashers;
  struct Gather {
    std::shared_ptr<void> memory;
    std::uint64_t bytes = 0;
  };
  std::map<int, Gather> _gather;
  std::map<int, std::uint64_t> _flight_bytes;      // this batch's bounce part per device
  std::map<int, DeviceCopyScratch> _copy_scratch;  // the gather/scatter kernels' copy tables
  // A staged get's block-by-block scatter tables, per device and flight.
  std::map<std::pair<int, std::size_t>, DeviceCopyScratch> _part_tables;
  std::map<int, std::string> _no_kernels;          // per device: why its kernels cannot run
  mutable std::mutex _times_mutex;
  StagedTimes _times;
  void add_time(double& counter, double seconds);
  std::unique_ptr<PageCacheGets> _page_cache;  // null: off
};

}  // namespace ferry::detail::kv
