// What a KVStore holds: its geometry, files, journal state and index, and the locks over them.
// Shared by kv_store.cpp (the operations) and kv_persistence.cpp (journal, checkpoint, replay).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "ferry/kv_store.hpp"
#include "platform/file_descriptor.hpp"
#include "kv/async_runner.hpp"
#include "kv/call_gate.hpp"
#include "kv/block_io.hpp"
#include "kv/durable_file.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"
#include "kv/slab_files.hpp"

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

  detail::FileDescriptor lock_fd;
  std::unique_ptr<SlabFiles> slabs;
  std::unique_ptr<BlockIo> io;

  std::mutex commit;  // the journal, checkpoints, a reader's refresh
  AppendFile journal;
  std::uint64_t epoch = 0, last_sequence = 0, records_since_checkpoint = 0;
  std::uint64_t journal_inode = 0;   // a reader: the journal file it follows (its inode)
  std::uint64_t journal_offset = 0;  // a reader: bytes of it applied

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
  AsyncRunner& runner();
  KVTicket post_batch(const char* call, std::size_t keys, KVCallback done,
                      std::function<std::vector<KVResult>(Impl&)> batch);

  std::vector<KVResult> put(std::span<const KVKey> keys, std::span<const KVBlock> sources,
                            const KVPutOptions& options);
  std::vector<KVResult> get(std::span<const KVKey> keys, std::span<const KVBlock> destinations);
  void check_manifest(bool writable);
  void load_state(bool writable);
  void load_checkpoint(std::span<const std::byte> bytes, std::uint64_t count, KvIndex& into);
  void apply(const Record& r);
  // `sync`: fdatasync the journal after (false: written only, enough for a process kill).
  void append_records(const std::vector<Record>& records, bool sync = true);
  void checkpoint_locked();
  void refresh();
};

}  // namespace ferry
