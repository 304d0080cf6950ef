// Loading one checkpoint onto several devices of this node from one process: whole replicas, or
// tensor-parallel slices (see shard_plan.hpp). Every byte is read from storage once; each
// device's host link carries its share; NCCL all-gathers fan replicated bytes out over NVLink,
// on streams of their own, while the next reads run.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/load_options.hpp"
#include "ferry/load_stats.hpp"
#include "ferry/shard_plan.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

struct FanoutOptions {
  // Engine settings, tensor names, progress and keep_going as for one device; `device` is
  // ignored. Reader threads and staging are per device: N devices get N times
  // one load's, within the worker pool's 64 threads and half the process's staging limit. Only
  // the staged path runs (cuFile registers one destination per load).
  LoadOptions load;
  std::vector<Device> devices;  // the ranks, in rank order: distinct cuda:N, or all cpu
  ShardRule rule = replicate_all;
  std::uint64_t round_bytes = 0;  // each rank's share of one all-gather round; 0: 256 MiB
  // When round k + 1's reads start. Eager: as soon as round k - 1's have landed, so that two
  // rounds read at once (twice the reader threads run). AtTail: when round k has no read left to
  // hand out (its remaining bytes fit in one read per thread), so that one round's threads read
  // at a time and the next round's take over as they finish.
  enum class NextRound { Eager, AtTail };
  NextRound next_round = NextRound::Eager;
  // Each round's reads: one submission with every device's reader threads (PerRound), or one per
  // device with its own threads, its reads only (PerDevice, as one process per GPU runs).
  enum class Submissions { PerRound, PerDevice };
  Submissions submissions = Submissions::PerRound;
};

// What one rank holds of one tensor, and where.
struct LoadedShard {
  const ShardPiece* piece = nullptr;  // the slice: dim, begin, end, shape, bytes
  void* data = nullptr;               // in the rank's allocation on its device
};

class LoadedRank {
 public:
  const Device& device() const noexcept { return _device; }
  const std::vector<LoadedShard>& tensors() const noexcept { return _tensors; }
  const LoadedShard* find(std::string_view name) const;
  // The rank's one allocation; valid while any copy is held.
  const std::shared_ptr<void>& memory() const noexcept { return _memory; }

 private:
  friend class FanoutLoader;
  Device _device;
  std::shared_ptr<void> _memory;
  std::vector<LoadedShard> _tensors;
  std::unordered_map<std::string_view, std::size_t> _by_name;
};

struct RankLoadStats {
  std::string device;
  std::uint64_t tensor_bytes = 0;       // what the rank holds
  std::uint64_t link_bytes = 0;         // copied into it from host memory
  std::uint64_t peer_bytes = 0;         // received from other ranks (all-gathers and scatters)
  double gigabytes_per_second() const;  // tensor_bytes over the load's seconds
  double seconds = 0;
};

// Where a load's time went. Reader-thread seconds are summed over the reader threads of every
// round's submission; their sum over the reads' wall time is how many readers were busy on
// average.
struct FanoutPhases {
  double read_thread_seconds = 0;   // reading files into staging (page cache or storage)
  double wait_thread_seconds = 0;   // for a slot's copies to land (the host links), and drains
  double queue_thread_seconds = 0;  // queueing copies
  double setup_thread_seconds = 0;  // streams and events
  double staging_seconds = 0;       // the longest staging lease of any round
  double reads_seconds = 0;         // from the first submission until the last reads landed
  double tail_seconds = 0;          // then until every collective finished
  double loader_wait_seconds = 0;   // the loading thread blocked on rounds' reads
  unsigned pool_threads = 0;        // the transfer core's worker threads after the load
};

struct FanoutStats {
  std::string collective;  // "nccl 2.27.3 (libnccl.so.2)" (where it was found), "host memcpy"
  double seconds = 0;      // from planning until every rank holds its bytes
  double collective_setup_seconds = 0;  // starting NCCL, the first time (outside `seconds`)
  double collective_seconds = 0;  // device time in all-gathers and scatters (overlapping reads)
  double allocate_seconds = 0;    // of `seconds`: the ranks' allocations
  std::uint64_t bytes_read = 0;   // from storage, counted by the engine
  // Page-cache DMA (LoadOptions::page_cache_pin_bytes): of bytes_read, those the devices copied
  // straight from registered page-cache mappings (each file's path is in `files`), and the time
  // this load spent registering files (0 where every registration was kept from an earlier load).
  std::uint64_t bytes_from_registered_page_cache = 0;
  double page_cache_register_seconds = 0;
  unsigned direct_streams = 0;  // copy streams per rank for those (0: none; --copy-streams)
  std::uint64_t checkpoint_bytes = 0;  // the selected tensors, once
  std::uint64_t tensor_bytes = 0;      // landed, summed over ranks
  std::size_t rounds = 0;
  unsigned reader_threads = 0;
  std::uint64_t chunk_bytes = 0;
  std::string settings_source;
  std::string next_round;   // "eager" or "at-tail" (FanoutOptions::next_round)
  std::string submissions;  // "per-round" or "per-device" (FanoutOptions::submissions)
  FanoutPhases phases;
  // As LoadStats::timeline: planned, allocated, page_cache_mapped, each round submitted, read
  // and its exchanges queued, round 0's start-up (its workers, staging, streams), reads_done,
  // done; seconds from the load's start, in order.
  std::vector<std::pair<std::string, double>> timeline;
  std::vector<RankLoadStats> ranks;
  std::vector<FileLoadStats> files;
  double gigabytes_per_second() const {  // aggregate: bytes landed on all ranks
    return seconds > 0 ? static_cast<double>(tensor_bytes) / seconds / 1e9 : 0.0;
  }
};

// The statistics as one JSON object (`ferry load --device a,b --json`).
std::string to_json(const FanoutStats& stats);

class FanoutLoad {
 public:
  const Checkpoint& checkpoint() const noexcept { return *_checkpoint; }
  const FanoutPlan& plan() const noexcept { return *_plan; }
  const std::vector<LoadedRank>& ranks() const noexcept { return _ranks; }
  const FanoutStats& stats() const noexcept { return _stats; }

 private:
  friend class FanoutLoader;
  std::shared_ptr<const Checkpoint> _checkpoint;
  std::shared_ptr<const FanoutPlan> _plan;  // the pieces the ranks point into
  std::vector<LoadedRank> _ranks;
  FanoutStats _stats;
};

// One process per rank: the ranks of the group that read on this machine at once, and the rounds
// each has reading at once. Where the engine chooses the reader threads (no reader_threads given),
// they are shared: from storage the machine's ranks together keep 16 reads in flight (the one
// device's depth), from the page cache one load's each, at most the machine's cores.
struct MachineShare {
  unsigned ranks_on_machine = 1;
  unsigned rounds_at_once = 1;
};

// One process per rank (torch.distributed, MPI): rank `rank`'s reads of round `round`, into its
// allocation at `memory` (plan.layouts[rank].dest_bytes) and its scratch at `scratch` (2 x
// plan.scratch_bank_bytes[rank]) on `device`. The caller then runs the round's scatters and
// all-gather with its own collectives, and before round k + 2's reads starts waits for round k's
// scatters (they share a scratch bank). options.device and names are ignored.
class FanoutRoundRead {
 public:
  FanoutRoundRead() = default;
  // Until every read landed (its bytes are in memory); rethrows the first failure. Once.
  LoadStats wait();

 private:
  friend FanoutRoundRead start_fanout_round(const Checkpoint&, const FanoutPlan&, std::size_t,
                                            unsigned, const Device&, void*, void*,
                                            const LoadOptions&, const MachineShare&);
  Ticket _ticket;  // waits in its destructor: memory is never freed under a copy
  bool _started = false;
  LoadOptions _options;
  LoadStats _stats;
  std::chrono::steady_clock::time_point _began;
  double _submitted = 0;  // seconds from _began to the submission
};

// Starts the reads and returns at once, so that the next round's reads can be queued behind them
// while the caller exchanges this round's bytes.
FanoutRoundRead start_fanout_round(const Checkpoint& checkpoint, const FanoutPlan& plan,
                                   std::size_t round, unsigned rank, const Device& device,
                                   void* memory, void* scratch, const LoadOptions& options,
                                   const MachineShare& share = {});

// start_fanout_round(...).wait().
LoadStats read_fanout_round(const Checkpoint& checkpoint, const FanoutPlan& plan, std::size_t round,
                            unsigned rank, const Device& device, void* memory, void* scratch,
                            const LoadOptions& options, const MachineShare& share = {});

// XXH3-64 of everything ranks must agree on before they exchange bytes: the rank count, every
// piece, read, scatter and gather. Ranks that opened different files, or the same file with
// different slice plans, get different digests.
std::uint64_t fanout_plan_digest(const FanoutPlan& plan);

// Throws std::invalid_argument for no device, a device listed twice, cpu mixed with cuda, a
// cuFile backend, and whatever plan_fanout refuses; CudaError where NCCL or a GPU cannot start;
// what a single load throws for the files.
FanoutLoad load_fanout(std::shared_ptr<const Checkpoint> checkpoint, const FanoutOptions& options);

}  // namespace ferry
