// KVStore: the index, the journal and checkpoint, eviction and sharing. Bytes move only through
// BlockIo (kv/block_io.hpp). Lock order: _commit (journal, checkpoint, refresh) before _mutex
// (index, counters); no I/O on slabs is done under either.
#include "ferry/kv_store.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ferry/error.hpp"
#include "platform/file_descriptor.hpp"
#include "kv/durable_file.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"
#include "kv/kv_call_support.hpp"
#include "kv/kv_store_impl.hpp"
#include "kv/slab_files.hpp"
#include "kv/transfer_block_io.hpp"
#include "platform/system.hpp"

namespace ferry {


KVKey kv_key(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

const char* to_string(KVStatus status) {
  switch (status) {
    case KVStatus::ok: return "ok";
    case KVStatus::already_present: return "already present";
    case KVStatus::missing: return "missing";
    case KVStatus::bad_size: return "bad size";
    case KVStatus::no_space: return "no space";
    case KVStatus::io_error: return "I/O error";
    case KVStatus::unsupported: return "unsupported";
    case KVStatus::read_only: return "read only";
  }
  return "unknown";
}

const char* to_string(KVRoute route) {
  switch (route) {
    case KVRoute::none:
      return "none";
    case KVRoute::host:
      return "host";
    case KVRoute::staged:
      return "staged";
    case KVRoute::cufile_gds:
      return "cufile-gds";
    case KVRoute::cufile_compat:
      return "cufile-compat";
    case KVRoute::page_cache_dma:
      return "page-cache-dma";
  }
  return "unknown";
}

KVPath parse_kv_path(std::string_view text) {
  if (text == "auto") return KVPath::Auto;
  if (text == "staged") return KVPath::Staged;
  if (text == "direct") return KVPath::Direct;
  detail::fail<std::invalid_argument>("KV path \"", text, "\": use auto, staged or direct");
}

KVStore::KVStore(std::unique_ptr<Impl> impl) : _impl(std::move(impl)) {}
KVStore::KVStore(KVStore&&) noexcept = default;
KVStore& KVStore::operator=(KVStore&& other) noexcept {
  if (this != &other) {
    if (_impl) _impl->close();  // as its destructor would
    _impl = std::move(other._impl);
  }
  return *this;
}

KVStore::~KVStore() {
  if (_impl) _impl->close();
}

void KVStore::close() {
  if (_impl) _impl->close();
}

void KVStore::Impl::close() {
  if (detail::process_id() != opened_by) {
    // A fork()ed child: the parent's threads are not here (joining them would hang), and a
    // checkpoint would replace the parent's journal under it. The files stay as the parent's.
    // Calls the parent had in flight never leave here: close without waiting for them.
    forget_threads_after_fork();
    options.checkpoint_on_close = false;
    gate.close(false);
    return;
  }
  // On one of this store's worker threads (a completion callback), its own batch is in flight:
  // no waiting, and the runner stays for ~Impl (run by the last batch's thread).
  bool worker = false;
  {
    std::lock_guard lock(mutex);
    worker = async && async->on_this_thread();
  }
  gate.close(!worker);
  if (worker) return;
  std::unique_ptr<AsyncRunner> idle;
  {
    std::lock_guard lock(mutex);
    idle = std::move(async);
  }
  idle.reset();  // joins its threads: no batch holds the store after this
}

void KVStore::Impl::finish_close() {
  if (!options.read_only && options.checkpoint_on_close) {
    try {
      std::lock_guard commit_lock(commit);
      if (records_since_checkpoint > 0) checkpoint_locked();
    } catch (...) {
      // The journal already holds every commit; the next open replays it.
    }
  }
  std::lock_guard commit_lock(commit);
  journal = AppendFile();
  io.reset();
  slabs.reset();
  lock_fd = detail::FileDescriptor();
}

std::vector<KVResult> KVStore::put(std::span<const KVKey> keys, std::span<const KVBlock> sources,
                                   const KVPutOptions& options) {
  _impl->check_process("put");
  const auto pass = _impl->enter("put");
  return _impl->put(keys, sources, options);
}

std::vector<KVResult> KVStore::get(std::span<const KVKey> keys,
                                   std::span<const KVBlock> destinations) {
  _impl->check_process("get");
  const auto pass = _impl->enter("get");
  return _impl->get(keys, destinations);
}

template <class Work>
std::vector<KVKey> keys_of(std::span<const KVKey> keys, const std::vector<Work>& work) {
  std::vector<KVKey> out;
  out.reserve(work.size());
  for (const Work& w : work) out.push_back(keys[w.index]);
  return out;
}

std::vector<KVResult> KVStore::Impl::get(std::span<const KVKey> keys,
                                         std::span<const KVBlock> destinations) {
  Impl& s = *this;
  FERRY_EXPECT(keys.size() == destinations.size(), std::invalid_argument, "KV get: ",
               keys.size(), " keys but ", destinations.size(), " destinations");
  const auto entered = Clock::now();
  s.catch_up();
  std::vector<KVResult> results(keys.size());
  struct Work {
    std::size_t index;
    std::uint32_t slot;
  };
  std::vector<Work> work;
  std::vector<BlockRequest> requests;
  work.reserve(keys.size());
  requests.reserve(keys.size());
  {
    std::lock_guard lock(s.mutex);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      ++s.counters.gets;
      if (std::string why = check_pieces(destinations[i]); !why.empty()) {
        results[i] = result(KVStatus::unsupported,
                            "KV get of key " + std::to_string(keys[i]) + ": " + why);
        continue;
      }
      const std::uint32_t slot = s.index->find(keys[i]);
      if (slot == kNoSlot) {
        ++s.counters.misses;
        results[i] = result(KVStatus::missing);
        continue;
      }
      const SlotEntry& e = s.index->slot(slot);
      const std::uint64_t size = total_size(destinations[i]);
      if (size != e.length) {
        results[i] = result(KVStatus::bad_size, "KV get of key " + std::to_string(keys[i]) +
                                                    ": destination of " + std::to_string(size) +
                                                    " bytes for a block of " +
                                                    std::to_string(e.length));
        continue;
      }
      // No eviction while it is read (a reader's or another fleet writer's slot can change
      // under it anyway: its checksum and the re-check below catch that).
      if (!s.options.read_only && s.own_slot(slot)) s.index->pin(slot);
      s.index->touch(slot);
      BlockRequest request;
      request.slab = s.slab_of(slot);
      request.offset = s.offset_of(slot);
      request.checksum = e.checksum;
      requests.push_back(std::move(request));
      work.push_back({i, slot});
    }
  }
  for (std::size_t w = 0; w < work.size(); ++w) requests[w].pieces = destinations[work[w].index];
  const auto start = Clock::now();
  if (!requests.empty()) s.io->read(requests);
  std::vector<std::uint32_t> slots(work.size());
  for (std::size_t w = 0; w < work.size(); ++w) slots[w] = work[w].slot;
  std::vector<bool> moved;  // a reader's block the writer replaced while it was read
  if (s.options.read_only || s.fleet > 0)
    moved = s.recheck_mismatches(keys_of(keys, work), slots, requests);
  const auto read = Clock::now();
  std::lock_guard lock(s.mutex);
  s.counters.get_move_seconds += seconds(start, read);
  s.counters.get_prepare_seconds += seconds(entered, start);
  for (std::size_t w = 0; w < work.size(); ++w) {
    const std::size_t i = work[w].index;
    const std::uint32_t slot = work[w].slot;
    if (!s.options.read_only && s.own_slot(slot)) s.index->unpin(slot);
    if (!moved.empty() && moved[w]) {  // not corrupt: gone from the writer's index meanwhile
      ++s.counters.misses;
      results[i] = result(KVStatus::missing);
      continue;
    }
    switch (requests[w].outcome) {
      case BlockOutcome::ok:
        ++s.counters.hits;
        results[i] = result(KVStatus::ok);
        break;
      case BlockOutcome::checksum_mismatch: {
        // Drop it (unless the slot already holds something else) and report a miss.
        const SlotEntry& e = s.index->slot(slot);
        if (e.state == SlotState::live && e.key == keys[i] && e.checksum == requests[w].checksum)
          s.index->erase(keys[i]);
        ++s.counters.corrupt_dropped;
        ++s.counters.misses;
        results[i] = result(KVStatus::missing, requests[w].message);
        break;
      }
      case BlockOutcome::io_error:
      case BlockOutcome::unsupported:
        results[i] = result(status_of(requests[w].outcome), requests[w].message);
        break;
    }
    results[i].route = requests[w].route;
    results[i].route_reason = std::move(requests[w].route_reason);
  }
  return results;
}

std::vector<KVResult> KVStore::remove(std::span<const KVKey> keys) {
  _impl->check_process("remove");
  Impl& s = *_impl;
  const auto pass = s.enter("remove");
  std::vector<KVResult> results(keys.size());
  if (s.options.read_only) {
    for (auto& r : results) r = result(KVStatus::read_only, "KV remove: this store is a reader");
    return results;
  }
  s.catch_up();
  std::lock_guard commit_lock(s.commit);
  std::vector<Record> records;
  {
    std::lock_guard lock(s.mutex);
    std::unordered_set<KVKey> seen;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (s.index->find(keys[i]) == kNoSlot || !seen.insert(keys[i]).second) {
        results[i] = result(KVStatus::missing);
        continue;
      }
      if (const std::uint32_t slot = s.index->find(keys[i]); !s.own_slot(slot)) {
        results[i] = result(KVStatus::unsupported,
                            "KV remove of key " + std::to_string(keys[i]) +
                                ": its block is in another fleet writer's slots (slot " +
                                std::to_string(slot) + "); only that writer removes it");
        continue;
      }
      records.push_back({RecordKind::remove, s.last_sequence + records.size() + 1, keys[i],
                         s.index->find(keys[i]), 0, 0});
    }
  }
  if (records.empty()) return results;
  try {
    s.append_records(records);
  } catch (const std::exception& e) {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (results[i].ok()) results[i] = result(KVStatus::io_error, e.what());
    return results;
  }
  s.last_sequence = records.back().sequence;
  std::lock_guard lock(s.mutex);
  for (const Record& r : records) s.index->erase(r.key);
  return results;
}

std::size_t KVStore::lookup(std::span<const KVKey> keys) {
  _impl->check_process("lookup");
  Impl& s = *_impl;
  const auto pass = s.enter("lookup");
  s.catch_up();
  std::lock_guard lock(s.mutex);
  std::size_t n = 0;
  while (n < keys.size() && s.index->find(keys[n]) != kNoSlot) ++n;
  return n;
}

std::vector<bool> KVStore::contains(std::span<const KVKey> keys) {
  _impl->check_process("contains");
  Impl& s = *_impl;
  const auto pass = s.enter("contains");
  s.catch_up();
  std::lock_guard lock(s.mutex);
  std::vector<bool> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = s.index->find(keys[i]) != kNoSlot;
  return out;
}

std::uint64_t KVStore::stored_length(KVKey key) {
  _impl->check_process("stored_length");
  Impl& s = *_impl;
  const auto pass = s.enter("stored_length");
  s.catch_up();
  std::lock_guard lock(s.mutex);
  const std::uint32_t slot = s.index->find(key);
  return slot == kNoSlot ? 0 : s.index->slot(slot).length;
}

void KVStore::checkpoint() {
  _impl->check_process("checkpoint");
  const auto pass = _impl->enter("checkpoint");
  FERRY_EXPECT(!_impl->options.read_only, std::invalid_argument, _impl->dir.string(),
               ": a reader cannot checkpoint");
  std::lock_guard commit_lock(_impl->commit);
  _impl->checkpoint_locked();
}

void KVStore::refresh() {
  _impl->check_process("refresh");
  const auto pass = _impl->enter("refresh");
  _impl->catch_up();
}

KVStats KVStore::stats() {
  _impl->check_process("stats");
  Impl& s = *_impl;
  const auto pass = s.enter("stats");
  s.catch_up();
  std::lock_guard commit_lock(s.commit);
  std::lock_guard lock(s.mutex);
  KVStats out = s.counters;
  out.directory = s.dir;
  out.block_bytes = s.block_bytes;
  out.slot_bytes = s.slot_bytes;
  out.capacity_blocks = s.slot_count;
  out.blocks = s.index->size();
  out.journal_records = s.records_since_checkpoint;
  out.index_bytes = s.index->memory_bytes();
  out.last_sequence = s.last_sequence;
  out.direct_io = s.io->direct();
  out.writers_active = s.writers_active;
  const StagedTimes staged = s.io->staged_times();
  out.staged_io_seconds = staged.io;
  out.staged_copy_wait_seconds = staged.copy_wait;
  out.staged_queue_seconds = staged.queue;
  out.staged_setup_seconds = staged.setup;
  out.staged_hash_seconds = staged.hash;
  out.staged_hash_wait_seconds = staged.hash_wait;
  out.staged_transfer_seconds = staged.transfer;
  out.staged_thread_span_seconds = staged.span;
  out.staged_copies = staged.copies;
  out.staged_lead_seconds = staged.lead;
  out.staged_tail_seconds = staged.tail;
  const PageCacheCounters page_cache = s.io->page_cache_counters();
  out.page_cache_dma_bytes = page_cache.bytes;
  out.page_cache_windows_registered = page_cache.registered;
  out.page_cache_register_seconds = page_cache.register_seconds;
  out.page_cache_windows_pending = page_cache.pending;
  out.page_cache_stale_rereads = page_cache.stale_rereads;
  out.page_cache_pin_bytes = s.options.page_cache_pin_bytes;
  out.page_cache_dma_seconds = page_cache.dma_seconds;
  out.page_cache_checksum_seconds = page_cache.checksum_seconds;
  out.page_cache_scatter_seconds = page_cache.scatter_seconds;
  out.gpu_path = s.options.gpu_path;
  out.read_only = s.options.read_only;
  return out;
}

std::vector<KVKey> KVStore::keys() {
  _impl->check_process("keys");
  Impl& s = *_impl;
  const auto pass = s.enter("keys");
  s.catch_up();
  std::lock_guard lock(s.mutex);
  std::vector<KVKey> out;
  for (std::uint32_t slot : s.index->lru_order()) out.push_back(s.index->slot(slot).key);
  return out;
}

}  // namespace ferry
