// KVStore: the index, the journal and checkpoint, eviction and sharing. Bytes move only through
// BlockIo (kv/block_io.hpp). Lock order: _commit (journal, checkpoint, refresh) before _mutex
// (index, counters); no I/O on slabs is done under either.
#include "ferry/kv_store.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_set>

#include "ferry/error.hpp"
#include "platform/file_descriptor.hpp"
#include "kv/durable_file.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"
#include "kv/kv_store_impl.hpp"
#include "kv/slab_files.hpp"
#include "kv/transfer_block_io.hpp"

namespace ferry {

namespace {

KVResult result(KVStatus status, std::string message = {}) {
  return {status, std::move(message), KVRoute::none, {}};
}

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::uint64_t total_size(KVBlock block) {
  std::uint64_t sum = 0;
  for (const KVPiece& p : block) sum += p.size;
  return sum;
}

// Why a block's pieces cannot be used, or an empty string.
std::string check_pieces(KVBlock block) {
  int gpu = -1;
  for (const KVPiece& p : block) {
    if (p.data == nullptr && p.size != 0) return "a piece of " + std::to_string(p.size) +
                                                 " bytes has no memory (null pointer)";
    if (p.device.is_cuda() && !cuda_available())
      return "a piece is on " + p.device.to_string() + ", but no GPU is usable here";
    if (p.size == 0 || !p.device.is_cuda()) continue;
    if (gpu >= 0 && p.device.index != gpu)
      return "its pieces lie on cuda:" + std::to_string(gpu) + " and " + p.device.to_string() +
             " (a block's GPU pieces must all be on one GPU)";
    gpu = p.device.index;
  }
  // No two pieces may share a byte (a get would write it twice, in no defined order).
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < block.size(); ++i)
    if (block[i].size) order.push_back(i);
  const auto address = [&](std::size_t i) {
    return reinterpret_cast<std::uintptr_t>(block[i].data);
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const bool ga = block[a].device.is_cuda(), gb = block[b].device.is_cuda();
    return ga != gb ? gb : address(a) < address(b);
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const KVPiece& a = block[order[k - 1]];
    const KVPiece& b = block[order[k]];
    if (a.device.is_cuda() == b.device.is_cuda() &&
        address(order[k - 1]) + a.size > address(order[k]))
      return "pieces " + std::to_string(std::min(order[k - 1], order[k])) + " and " +
             std::to_string(std::max(order[k - 1], order[k])) + " overlap (" +
             std::to_string(a.size) + " bytes at " + std::to_string(address(order[k - 1])) +
             " and " + std::to_string(b.size) + " bytes at " + std::to_string(address(order[k])) +
             " on " + a.device.to_string() + ")";
  }
  return {};
}

KVStatus status_of(BlockOutcome outcome) {
  switch (outcome) {
    case BlockOutcome::ok:
      return KVStatus::ok;
    case BlockOutcome::checksum_mismatch:
      return KVStatus::missing;
    case BlockOutcome::unsupported:
      return KVStatus::unsupported;
    case BlockOutcome::io_error:
      break;
  }
  return KVStatus::io_error;
}

}  // namespace

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
  const auto pass = _impl->enter("put");
  return _impl->put(keys, sources, options);
}

std::vector<KVResult> KVStore::get(std::span<const KVKey> keys,
                                   std::span<const KVBlock> destinations) {
  const auto pass = _impl->enter("get");
  return _impl->get(keys, destinations);
}

std::vector<KVResult> KVStore::Impl::put(std::span<const KVKey> keys,
                                         std::span<const KVBlock> sources,
                                         const KVPutOptions& options) {
  Impl& s = *this;
  FERRY_EXPECT(keys.size() == sources.size(), std::invalid_argument, "KV put: ", keys.size(),
               " keys but ", sources.size(), " sources");
  std::vector<KVResult> results(keys.size());
  if (s.options.read_only) {
    for (auto& r : results) r = result(KVStatus::read_only, "KV put: this store is a reader");
    return results;
  }
  struct Work {
    std::size_t index;
    std::uint32_t slot;
  };
  std::vector<Work> work;
  // A slot taken from an evicted block is written only once a remove record of that block is in
  // the journal: else a writer killed before this put's own record leaves the old key's record
  // pointing at new bytes, a visible block that fails its checksum. Admission runs under the
  // commit lock so that those records keep the order of the evictions (a later put of the same
  // key cannot slip its record in before the remove).
  std::unique_lock commit_admission(s.commit);
  std::vector<Record> evictions;
  std::vector<SlotEntry> evicted_entries;  // to put back where their removal cannot be written
  {
    std::lock_guard lock(s.mutex);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint64_t size = total_size(sources[i]);
      if (std::string why = check_pieces(sources[i]); !why.empty()) {
        results[i] = result(KVStatus::unsupported, "KV put of key " + std::to_string(keys[i]) +
                                                        ": " + why);
        continue;
      }
      if (size == 0 || size > s.block_bytes) {
        results[i] = result(KVStatus::bad_size, "KV put of key " + std::to_string(keys[i]) +
                                                    ": " + std::to_string(size) +
                                                    " bytes; blocks are 1 to " +
                                                    std::to_string(s.block_bytes));
        continue;
      }
      if (const std::uint32_t found = s.index->find(keys[i]); found != kNoSlot) {
        s.index->touch(found);
        results[i] = result(KVStatus::already_present);
        continue;
      }
      if (!s.pending.insert(keys[i]).second) {  // in this batch or another thread's
        results[i] = result(KVStatus::already_present);
        continue;
      }
      std::optional<std::uint64_t> evicted;
      SlotEntry evicted_entry;
      const std::uint32_t slot = s.index->take_slot(evicted, evicted_entry);
      if (slot == kNoSlot) {
        s.pending.erase(keys[i]);
        results[i] = result(KVStatus::no_space,
                            "KV put: every slot is busy with reads or writes in flight");
        continue;
      }
      if (evicted) {
        ++s.counters.evictions;
        evictions.push_back(
            {RecordKind::remove, s.last_sequence + evictions.size() + 1, *evicted, slot, 0, 0});
        evicted_entries.push_back(evicted_entry);
      }
      work.push_back({i, slot});
    }
  }
  if (!evictions.empty()) {
    try {
      // Written, not yet synced: a process kill keeps it (the page cache holds it); the
      // journal's sync at this put's commit makes it durable with the put's records.
      s.append_records(evictions, false);
      s.last_sequence = evictions.back().sequence;
    } catch (const std::exception& e) {
      // The journal still maps the evicted blocks to their slots, whose bytes are intact (nothing
      // was written over them): they are put back, so no later put reuses those slots as free
      // before a removal is written. The other slots go back to the free list; the batch fails.
      std::lock_guard lock(s.mutex);
      for (const Work& w : work) {
        s.pending.erase(keys[w.index]);
        results[w.index] = result(KVStatus::io_error, e.what());
        const auto back = std::find_if(evictions.begin(), evictions.end(),
                                       [&](const Record& r) { return r.slot == w.slot; });
        if (back == evictions.end()) {
          s.index->release_writing(w.slot);
          continue;
        }
        const SlotEntry& old = evicted_entries[static_cast<std::size_t>(back - evictions.begin())];
        s.index->publish(w.slot, old.key, old.length, old.checksum);
      }
      return results;
    }
  }
  commit_admission.unlock();
  if (work.empty()) return results;

  // Data first: write every block, then make each touched slab durable.
  std::vector<std::vector<BlockSpan>> spans(work.size());
  std::vector<BlockRequest> requests(work.size());
  for (std::size_t w = 0; w < work.size(); ++w) {
    for (const KVPiece& p : sources[work[w].index]) spans[w].push_back({p.data, p.size, p.device});
    requests[w].slab = s.slab_of(work[w].slot);
    requests[w].offset = s.offset_of(work[w].slot);
    requests[w].pieces = spans[w];
  }
  const auto start = Clock::now();
  s.io->write(requests, options.after_event);
  const auto written = Clock::now();
  std::set<int> touched;
  for (const BlockRequest& r : requests)
    if (r.outcome == BlockOutcome::ok) touched.insert(r.slab);
  // The slabs' syncs at once (each a flush of the device's cache; together they can share one).
  const std::vector<int> to_sync(touched.begin(), touched.end());
  std::vector<std::string> sync_errors(to_sync.size());
  const auto sync_one = [&](std::size_t k) {
    try {
      s.io->sync(to_sync[k]);
    } catch (const std::exception& e) {
      sync_errors[k] = e.what();
    }
  };
  std::vector<std::thread> syncing;
  for (std::size_t k = 1; k < to_sync.size(); ++k) {
    try {
      syncing.emplace_back(sync_one, k);
    } catch (const std::system_error&) {
      sync_one(k);  // no thread: this one syncs it
    }
  }
  if (!to_sync.empty()) sync_one(0);
  for (auto& t : syncing) t.join();
  for (std::size_t k = 0; k < to_sync.size(); ++k) {
    if (sync_errors[k].empty()) continue;
    for (BlockRequest& r : requests)
      if (r.slab == to_sync[k] && r.outcome == BlockOutcome::ok) {
        r.outcome = BlockOutcome::io_error;
        r.message = sync_errors[k];
      }
  }

  const auto synced = Clock::now();

  // Then the records that make them visible, durable before the index shows them.
  std::lock_guard commit_lock(s.commit);
  std::vector<Record> records;
  for (std::size_t w = 0; w < work.size(); ++w)
    if (requests[w].outcome == BlockOutcome::ok)
      records.push_back({RecordKind::put, s.last_sequence + records.size() + 1,
                         keys[work[w].index], work[w].slot, total_size(sources[work[w].index]),
                         requests[w].checksum});
  std::string journal_error;
  if (!records.empty()) {
    try {
      s.append_records(records);
      s.last_sequence = records.back().sequence;
    } catch (const std::exception& e) {
      journal_error = e.what();
    }
  }
  const auto journaled = Clock::now();
  {
    std::lock_guard lock(s.mutex);
    s.counters.put_move_seconds += seconds(start, written);
    s.counters.put_sync_seconds += seconds(written, synced);
    s.counters.put_journal_seconds += seconds(synced, journaled);
    for (std::size_t w = 0; w < work.size(); ++w) {
      const std::size_t i = work[w].index;
      s.pending.erase(keys[i]);
      if (requests[w].outcome == BlockOutcome::ok && journal_error.empty()) {
        s.index->publish(work[w].slot, keys[i], static_cast<std::uint32_t>(total_size(sources[i])),
                         requests[w].checksum);
        ++s.counters.puts;
        results[i] = result(KVStatus::ok);
      } else {
        s.index->release_writing(work[w].slot);
        results[i] = requests[w].outcome == BlockOutcome::ok
                         ? result(KVStatus::io_error, journal_error)
                         : result(status_of(requests[w].outcome), requests[w].message);
      }
      results[i].route = requests[w].route;
      results[i].route_reason = std::move(requests[w].route_reason);
    }
  }
  if (s.records_since_checkpoint >= s.options.checkpoint_every) {
    try {
      s.checkpoint_locked();
    } catch (...) {
      // The journal keeps every commit; the next checkpoint tries again.
    }
  }
  return results;
}

std::vector<KVResult> KVStore::Impl::get(std::span<const KVKey> keys,
                                         std::span<const KVBlock> destinations) {
  Impl& s = *this;
  FERRY_EXPECT(keys.size() == destinations.size(), std::invalid_argument, "KV get: ",
               keys.size(), " keys but ", destinations.size(), " destinations");
  if (s.options.read_only) s.refresh();
  std::vector<KVResult> results(keys.size());
  struct Work {
    std::size_t index;
    std::uint32_t slot;
  };
  std::vector<Work> work;
  std::vector<BlockRequest> requests;
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
      if (!s.options.read_only) s.index->pin(slot);  // no eviction while it is read
      s.index->touch(slot);
      BlockRequest request;
      request.slab = s.slab_of(slot);
      request.offset = s.offset_of(slot);
      request.checksum = e.checksum;
      requests.push_back(std::move(request));
      work.push_back({i, slot});
    }
  }
  std::vector<std::vector<BlockSpan>> spans(work.size());
  for (std::size_t w = 0; w < work.size(); ++w) {
    for (const KVPiece& p : destinations[work[w].index])
      spans[w].push_back({p.data, p.size, p.device});
    requests[w].pieces = spans[w];
  }
  const auto start = Clock::now();
  if (!requests.empty()) s.io->read(requests);
  const auto read = Clock::now();
  std::lock_guard lock(s.mutex);
  s.counters.get_move_seconds += seconds(start, read);
  for (std::size_t w = 0; w < work.size(); ++w) {
    const std::size_t i = work[w].index;
    const std::uint32_t slot = work[w].slot;
    if (!s.options.read_only) s.index->unpin(slot);
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
  Impl& s = *_impl;
  const auto pass = s.enter("remove");
  std::vector<KVResult> results(keys.size());
  if (s.options.read_only) {
    for (auto& r : results) r = result(KVStatus::read_only, "KV remove: this store is a reader");
    return results;
  }
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
  Impl& s = *_impl;
  const auto pass = s.enter("lookup");
  if (s.options.read_only) s.refresh();
  std::lock_guard lock(s.mutex);
  std::size_t n = 0;
  while (n < keys.size() && s.index->find(keys[n]) != kNoSlot) ++n;
  return n;
}

std::vector<bool> KVStore::contains(std::span<const KVKey> keys) {
  Impl& s = *_impl;
  const auto pass = s.enter("contains");
  if (s.options.read_only) s.refresh();
  std::lock_guard lock(s.mutex);
  std::vector<bool> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = s.index->find(keys[i]) != kNoSlot;
  return out;
}

std::uint64_t KVStore::stored_length(KVKey key) {
  Impl& s = *_impl;
  const auto pass = s.enter("stored_length");
  if (s.options.read_only) s.refresh();
  std::lock_guard lock(s.mutex);
  const std::uint32_t slot = s.index->find(key);
  return slot == kNoSlot ? 0 : s.index->slot(slot).length;
}

void KVStore::checkpoint() {
  const auto pass = _impl->enter("checkpoint");
  FERRY_EXPECT(!_impl->options.read_only, std::invalid_argument, _impl->dir.string(),
               ": a reader cannot checkpoint");
  std::lock_guard commit_lock(_impl->commit);
  _impl->checkpoint_locked();
}

void KVStore::refresh() {
  const auto pass = _impl->enter("refresh");
  if (_impl->options.read_only) _impl->refresh();
}

KVStats KVStore::stats() {
  Impl& s = *_impl;
  const auto pass = s.enter("stats");
  if (s.options.read_only) s.refresh();
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
  const PageCacheCounters page_cache = s.io->page_cache_counters();
  out.page_cache_dma_bytes = page_cache.bytes;
  out.page_cache_windows_registered = page_cache.registered;
  out.page_cache_register_seconds = page_cache.register_seconds;
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
  Impl& s = *_impl;
  const auto pass = s.enter("keys");
  if (s.options.read_only) s.refresh();
  std::lock_guard lock(s.mutex);
  std::vector<KVKey> out;
  for (std::uint32_t slot : s.index->lru_order()) out.push_back(s.index->slot(slot).key);
  return out;
}

}  // namespace ferry
