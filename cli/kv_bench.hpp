// `ferry kv bench`: the KV store's put and get throughput per block size and data path, beside
// the limits measured in the same run on the same root: raw O_DIRECT writes (synced per batch, as
// puts are) and reads of the same bytes, a batch's blocks on as many threads as the store keeps
// in flight (16), and pinned device<->host copies of a batch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/kv_store.hpp"

namespace ferry {

struct KVBenchOptions {
  std::filesystem::path root;  // a scratch directory on the storage to measure
  Device device = Device::cpu();
  std::vector<std::uint64_t> block_sizes = {256ull << 10, 1ull << 20, 4ull << 20, 16ull << 20};
  std::uint64_t bytes = 1ull << 30;  // moved per block size and path (at least one batch)
  std::uint64_t batch = 16;          // blocks per put/get call
  // Where not 0: blocks per call = batch_bytes / block size (at least 1), instead of `batch`:
  // a prefix of tens to hundreds of blocks, so that per-call costs are not what is measured.
  std::uint64_t batch_bytes = 0;
  unsigned pieces = 1;               // pieces per block (vLLM: 2 x layers)
  // An engine's paged KV layout for the blocks' pieces, instead of `pieces` equal parts of one
  // contiguous block (empty): "vllm" (FlashAttention, per layer one tensor [2, blocks,
  // block_tokens, kv_heads, head_dim]: a K and a V page per layer), "vllm-canonical" (per layer
  // (blocks, page_bytes) int8: one page per layer), "mla" (per layer [blocks, block_tokens, 576]:
  // one latent page), "sglang" (per layer a K and a V buffer [tokens, kv_heads, head_dim]). The
  // block size is then the layout's (block_sizes is not used).
  std::string layout;
  unsigned layers = 32, block_tokens = 16, kv_heads = 8, head_dim = 128, element_bytes = 2;
  // The GPU paths to measure; empty: staged, and direct where cuFile can run. Host memory always
  // takes the host path.
  std::vector<KVPath> paths;
  // Rounds per size and path: each a put, a cold get and a warm get, the raw write and read of
  // the same bytes alternating with them (which goes first swaps every round); medians kept.
  unsigned rounds = 3;
  // KVStoreOptions::page_cache_pin_bytes for the stores measured (0: off). With it, each round
  // has three warm get passes: one through a reader of the same store without page-cache DMA
  // (warm staged), the first with it (warm: the usual path while its windows are registered in
  // the background), one that copies from them once registered (warm registered).
  std::uint64_t page_cache_pin = 0;
  // Where not 0: the fleet bench (kv_fleet_bench.hpp) with this many writer processes instead.
  unsigned writers = 0;
  // The fleet's writers' memory where they are on several devices (`--device cuda:0,cuda:1`, as
  // a node's engine instances each have a GPU): writer w's on writer_devices[w % size]; empty:
  // every writer's on `device`.
  std::vector<Device> writer_devices;
  // KVStoreOptions::gpu_groups for the stores measured (zeros: ferry's choice).
  KVGpuGroups gpu_groups;
};

// Where one pass's time went (seconds, the mean of the rounds), from KVStats.
struct KVBenchTimes {
  double pass = 0;                         // the pass, as the caller saw it
  double move = 0, sync = 0, journal = 0;  // KVStats put_*/get_move_seconds
  double io = 0, copy_wait = 0, queue = 0, hash = 0, hash_wait = 0;  // staged workers' thread-s
  double setup = 0;                                                  // (KVStats staged_*)
  double transfer = 0, span = 0, copies = 0;  // KVStats staged_transfer_seconds, _thread_span_*
  double lead = 0, tail = 0, prepare = 0;     // KVStats staged_lead/_tail, get_prepare_seconds
};

struct KVBenchRow {
  std::uint64_t block_bytes = 0, blocks = 0;
  std::uint64_t batch = 0;            // blocks per put/get call
  std::string path;                   // the route the blocks took: host, staged, cufile-*
  std::string checksum;               // the XXH3 build that checksummed them: avx2 or default
  double put_gbps = 0;                // durable
  double get_cold_gbps = 0;           // slabs not in the page cache
  double get_warm_gbps = 0;           // slabs read into the page cache first
  double put_iops = 0, get_iops = 0;  // blocks per second (cold get)
  double raw_write_gbps = 0, raw_read_gbps = 0;     // O_DIRECT, the same bytes and batches
  double raw_warm_read_gbps = 0;                    // the same reads from the page cache
  unsigned rounds = 0;                              // the figures are medians of this many
  // Each round's rates in order: a round's put and raw write ran one after the other, as did
  // its cold get and raw read (the disk's speed drifts between rounds).
  std::vector<double> put_round_gbps, raw_write_round_gbps, get_cold_round_gbps,
      raw_read_round_gbps;
  // A row of several pieces a block without page-cache DMA: warm gets of as many blocks of its
  // size in one piece each, from a store of their own, taking turns with this row's in every
  // round (a layout is held to one piece's warm get; in separate runs the machine's drift moved
  // that ratio by 0.15). Each round's rates are the median of its passes; 0 and empty otherwise.
  double one_piece_warm_gbps = 0;
  std::vector<double> get_warm_round_gbps, one_piece_warm_round_gbps;
  // Pinned copies of max(256 MiB, a batch's bytes) in this row's run; 0 for host memory.
  double pinned_d2h_gbps = 0, pinned_h2d_gbps = 0;
  // XXH3 of a batch's blocks computed by the GPU that holds them (its digests checked against the
  // host's first); 0 with the reason in the note where it cannot run; 0 for host memory.
  double gpu_checksum_gbps = 0;
  std::string gpu_checksum_note;
  // The lowest share of the slabs' bytes found in the page cache after a warm pass (1: the
  // warm gets were all served from it); 0 also where that cannot be told (Windows).
  double warm_resident = 0;
  KVBenchTimes put_times, cold_times, warm_times;
  // With page_cache_pin: the second warm pass (windows registered after the first), the seconds
  // the background spent registering the first's windows (median), and the share of the second's bytes copied
  // from registered windows (lowest of the rounds).
  double get_warm_registered_gbps = 0;
  double page_cache_register_seconds = 0;
  double page_cache_dma_share = 0;
  std::string warm_registered_path;  // the route of the second pass's blocks
  // With page_cache_pin: the same warm gets without it (a reader of the store, on the usual
  // path: staged or cuFile) and its route; where the warm registered pass's time went (seconds
  // per pass, the mean of the rounds): its wall time, then device time of the copies out of the
  // page cache, of the GPU checksums of what landed and of multi-piece blocks' scatters
  // (KVStats page_cache_*_seconds; chunks overlap on two streams).
  double get_warm_staged_gbps = 0;
  std::string warm_staged_path;
  double registered_pass_seconds = 0, page_cache_dma_seconds = 0,
         page_cache_checksum_seconds = 0, page_cache_scatter_seconds = 0;
};

// Blocks per put/get call for `block`-byte blocks.
std::uint64_t kv_bench_batch(const KVBenchOptions& options, std::uint64_t block);

// Where one pass of `pass` seconds went: the difference of the store's statistics around it.
KVBenchTimes kv_bench_times_between(const KVStats& before, const KVStats& after, double pass);

// Runs every size and path, calling `on_row` as each finishes. Every block got back is compared
// with what was put (a wrong byte throws). Throws where a put or get fails.
// The block size of `o.layout` (0 where none is set); throws std::invalid_argument for an unknown
// layout.
std::uint64_t kv_layout_block_bytes(const KVBenchOptions& o);

std::vector<KVBenchRow> run_kv_bench(const KVBenchOptions& options,
                                     const std::function<void(const KVBenchRow&)>& on_row = {});

}  // namespace ferry
