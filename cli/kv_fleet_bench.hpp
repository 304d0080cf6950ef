// `ferry kv bench --writers N`: a fleet of N writer processes (KVStoreOptions::fleet_writers) on
// one namespace. Each writer is a child process with its own memory on the bench's device, putting
// its own keys in batches; measured beside one writer of the same store alone, and beside raw
// O_DIRECT writes of the same bytes by one writer and by all of them. While the fleet writes, a
// reader process (the bench itself) times prefix lookups (each folds in every writer's journal
// first); after, it gets every writer's blocks (slabs dropped from the page cache) and compares
// them with what was put. POSIX only (the writers are forked).
#pragma once

#include <cstdint>
#include <vector>

#include "kv_bench.hpp"

namespace ferry {

// A writer's put pass by the store's counters, seconds: moving the blocks, making the slabs
// durable, appending the journal.
struct KVPassTimes {
  double move = 0, sync = 0, journal = 0;
  // GPU blocks (the staged path): its workers' thread-seconds writing, waiting for their copies
  // out of GPU memory, and in all (their transfers' wall time x their count); 0 for host memory.
  double workers_io = 0, workers_copy_wait = 0, workers_span = 0;
  unsigned writers_active = 1;  // the writers it saw writing at its end (KVStats::writers_active)
};

struct KVFleetBenchRow {
  unsigned writers = 0;
  std::uint64_t block_bytes = 0, blocks_per_writer = 0, batch = 0;
  unsigned rounds = 0;  // the put figures are medians of this many
  // Durable puts, GB/s: one writer of the store alone, then all writers at once (every writer's
  // bytes over the time from the first one's start to the last one's end), and each writer's own
  // rate in that run.
  double one_writer_put_gbps = 0, fleet_put_gbps = 0;
  std::vector<double> writer_put_gbps;
  // Each round's one writer and fleet, in order (a round runs one right after the other).
  std::vector<double> one_writer_round_gbps, fleet_round_gbps;
  // Where a writer's pass went: writer 0 alone, and every writer in the fleet's runs (medians).
  KVPassTimes alone_times, fleet_times;
  // Raw O_DIRECT writes of the same bytes (kv_bench_raw.hpp), each writer to its own file, timed
  // the same way: writer 0 alone, then all writers at once; what the disk gives without the store.
  double raw_one_writer_gbps = 0, raw_fleet_gbps = 0;
  // All at once again, each writer with 16 / writers threads (at least 2): the writes in flight
  // the fleet's puts keep (KVStats::writers_active).
  double raw_fleet_shared_gbps = 0;
  // lookup() of a 16-key prefix of a writer's blocks, microseconds: while the fleet writes
  // (every call folds in the other writers' journals first), then with every writer idle.
  std::uint64_t lookups = 0;
  double lookup_p50_us = 0, lookup_p99_us = 0, idle_lookup_p50_us = 0, idle_lookup_p99_us = 0;
  // The reader's gets of every writer's last round (cold: slabs dropped from the page cache),
  // every byte compared with what was put.
  std::uint64_t blocks_read = 0;
  double reader_get_gbps = 0;
  std::uint64_t store_blocks = 0;  // the blocks the reader's index holds at the end
};

// Runs the fleet bench for `o.writers` writers (at least 1) and one block size (the layout's, or
// the first of o.block_sizes), on o.device; blocks per writer: o.bytes / block, a whole number of
// batches. Throws where a process, put or get fails or a byte read back differs.
KVFleetBenchRow run_kv_fleet_bench(const KVBenchOptions& o);

}  // namespace ferry
