// What a KVStore holds: its geometry, files, journal state and index, and the locks over them.
// Shared by kv_store.cpp (the operations) and kv_persistence.cpp (journal, checkpoint, replay).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ferry/kv_store.hpp"
#include "kv/async_runner.hpp"
#include "kv/block_io.hpp"
#include "kv/call_gate.hpp"
#include "kv/durable_file.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"
#include "kv/slab_files.hpp"
#include "platform/file_descriptor.hpp"

namespace ferry {

using namespace detail::kv;
namespace fs = std::filesystem;

struct KVStore::Impl : std::enable_shared_from_this<KVStore::Impl> {
  KVNamespace ns;
  KVStoreOptions options;
  fs::path dir, journal_path, checkpoint_path;
  std::uint64_t block_bytes = 0, slot_bytes = 0, slot_count = 0, slots_per_slab = 0;
  unsigned slab_count = 0;
  Limits limits;

  // The process that opened the store: a writer's lock, journal position and index are that
  // process's; a fork()ed child sharing them would commit behind the parent's back.
  std::uint64_t opened_by = 0;
  detail::FileDescriptor lock_fd;
  std::unique_ptr<SlabFiles> slabs;
  std::unique_ptr<BlockIo> io;

  std::mutex commit;  // the journal, checkpoints, a reader's refresh
  AppendFile journal;
  std::uint64_t epoch = 0, last_sequence = 0, records_since_checkpoint = 0;
  bool following = false;            // a reader: applying the journal of epoch `epoch`
  std::uint64_t journal_offset = 0;  // a reader: bytes of it applied

  // A fleet (kv_fleet.cpp; 0: one writer): the slots split into `fleet` shares, this writer's
  // own (`share`; its journal and checkpoint are journal_path and checkpoint_path), and every
  // other share followed as a reader follows a writer (a reader follows them all).
  unsigned fleet = 0, share = 0;
  struct Follower {
    fs::path journal, checkpoint;
    std::uint32_t first = 0, end = 0;  // its slots
    std::uint64_t epoch = 0, offset = 0, last_sequence = 0;
    bool following = false;
    std::chrono::steady_clock::time_point wrote_at{};   // when its journal was last written
    std::chrono::steady_clock::time_point looked_at{};  // when this process last folded it
    // Its blocks whose key another share's copy holds in the index (keys name content, so two
    // writers may store one): by slot, promoted when that key leaves the index.
    std::unordered_map<std::uint32_t, Record> shadows;
  };
  std::vector<Follower> followers;
  std::uint32_t share_first(unsigned m) const;
  bool own_slot(std::uint32_t slot) const {
    return fleet == 0 || (!options.read_only && slot >= share_first(share) &&
                          slot < share_first(share + 1));
  }
  // Before a call: a reader's refresh, a fleet member's fold of the other shares.
  void catch_up();
  void take_share();           // a fleet writer's open: the first share whose lock is free
  void set_up_followers();
  void fold(Follower& f);      // under `commit`
  void reload(Follower& f);    // under `commit`: the share again from its checkpoint
  void apply_foreign(Follower& f, const Record& r);  // under `mutex`
  void promote_shadows();                            // under `mutex`
  // This writer and the others whose journals were written in the last kActiveWriter (2 s): they
  // share the namespace's storage (BlockIo::share_writes). Set by catch_up; 1 outside a fleet.
  unsigned writers_active = 1;

  std::mutex mutex;  // the index, pending keys and counters
  std::unique_ptr<KvIndex> index;
  std::unordered_set<KVKey> pending;
  KVStats counters;

  // Calls in flight, and close (kv/call_gate.hpp); the finish releases the files.
  detail::kv::CallGate gate{[this] { finish_close(); }};
  detail::kv::CallGate::Pass enter(const char* call) { return gate.enter(call, dir); }
  void close();
  void finish_close();

  int slab_of(std::uint32_t slot) const { return static_cast<int>(slot / slots_per_slab); }
  std::uint64_t offset_of(std::uint32_t slot) const { return slot % slots_per_slab * slot_bytes; }

  // The asynchronous forms' worker threads, started at the first use. Declared last: destroyed
  // first, so queued batches finish while the rest of the store is still whole.
  std::unique_ptr<AsyncRunner> async;
  std::uint64_t async_pid = 0;  // the process whose threads `async` holds
  AsyncRunner& runner();
  // A writer used from a fork()ed child: throws naming both processes (every entry point).
  void check_process(const char* call) const;
  // In a fork()ed child: the parent's worker threads do not exist here, so they are leaked.
  void forget_threads_after_fork();
  KVTicket post_batch(const char* call, std::size_t keys, KVCallback done,
                      std::function<std::vector<KVResult>(Impl&)> batch);

  // A put in steps (kv_put.cpp): admit the batch (slots taken, bad input and duplicates
  // settled), write the blocks, make the touched slabs durable, commit the records to the
  // journal (under `commit`), publish them in the index, checkpoint where due.
  struct PutWork {
    std::size_t index;  // in the batch
    std::uint32_t slot;
    std::uint64_t size;
  };
  struct PutBatch {
    std::span<const KVKey> keys;
    std::span<const KVBlock> sources;
    std::vector<KVResult> results;
    std::vector<PutWork> work;  // the blocks to write
    std::vector<std::pair<std::size_t, std::size_t>> duplicates;  // (index, its first copy's)
    std::vector<BlockRequest> requests;  // per work item
    std::vector<Record> evictions;        // remove records of the blocks whose slots were taken
    std::vector<SlotEntry> evicted;       // their entries, to put back if those records fail
  };
  std::vector<KVResult> put(std::span<const KVKey> keys, std::span<const KVBlock> sources,
                            const KVPutOptions& options);
  void admit(PutBatch& batch);
  void journal_evictions(PutBatch& batch);  // where it fails: the batch failed, slots back
  void write_blocks(PutBatch& batch, void* after_event);
  void sync_slabs(PutBatch& batch);
  std::string commit_records(PutBatch& batch);  // the journal's error, or empty
  void publish(PutBatch& batch, const std::string& journal_error);
  void checkpoint_if_due();
  std::vector<KVResult> get(std::span<const KVKey> keys, std::span<const KVBlock> destinations);
  nlohmann::json manifest_json() const;
  nlohmann::json manifest_json_now() const;  // with a fleet's share count
  void check_manifest(bool writable);
  // A writer's open: makes the directory whole where it is missing (kv_create.cpp), and clears
  // an older ferry's unfinished creation (a manifest, no journal and no checkpoint).
  void create_directory_whole(const fs::path& root);
  void clear_unfinished_creation();
  void load_state(bool writable);
  void load_own_state(bool writable);  // the single writer's (or a fleet writer's own share)
  void load_checkpoint(std::span<const std::byte> bytes, std::uint64_t count, KvIndex& into);
  void apply(const Record& r);
  // `sync`: fdatasync the journal after (false: written only, enough for a process kill).
  void append_records(const std::vector<Record>& records, bool sync = true);
  void checkpoint_locked();
  void refresh();
  // A reader's blocks that failed their checksum (kv_reader.cpp): re-checked against the
  // writer's newer commits before they are called corrupt. Returns, per request, whether the
  // writer replaced the block meanwhile (a plain miss); requests that pass on a re-read turn ok.
  std::vector<bool> recheck_mismatches(const std::vector<KVKey>& keys,
                                       const std::vector<std::uint32_t>& slots,
                                       std::vector<BlockRequest>& requests);
};

}  // namespace ferry
