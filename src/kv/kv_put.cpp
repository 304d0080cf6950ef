// KVStore::put in named steps: admit the batch (slots taken, duplicates and bad input settled),
// write the blocks, make the touched slabs durable (on the worker pool), commit their records
// to the journal, publish them in the index, and checkpoint when the journal is long enough.
// Publish order: a block's bytes are durable before the record that makes it visible.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "ferry/error.hpp"
#include "kv/kv_call_support.hpp"
#include "kv/kv_store_impl.hpp"
#include "services/worker_pool.hpp"

namespace ferry {

namespace {

// The syncs of one put: shared with the pool's jobs, which may start after the put is done.
struct SyncRound {
  std::vector<int> slabs;
  std::vector<std::string> errors;
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::condition_variable finished;
  std::size_t done = 0;  // under mutex
};

// Takes slabs from `round` until none is left (the caller and the pool's jobs alike).
void run_syncs(SyncRound& round, BlockIo& io) {
  for (std::size_t k; (k = round.next.fetch_add(1)) < round.slabs.size();) {
    try {
      io.sync(round.slabs[k]);
    } catch (const std::exception& e) {
      round.errors[k] = e.what();
    }
    std::lock_guard lock(round.mutex);
    if (++round.done == round.slabs.size()) round.finished.notify_all();
  }
}

}  // namespace

std::vector<KVResult> KVStore::Impl::put(std::span<const KVKey> keys,
                                         std::span<const KVBlock> sources,
                                         const KVPutOptions& options) {
  FERRY_EXPECT(keys.size() == sources.size(), std::invalid_argument, "KV put: ", keys.size(),
               " keys but ", sources.size(), " sources");
  PutBatch batch;
  batch.keys = keys;
  batch.sources = sources;
  batch.results.resize(keys.size());
  if (this->options.read_only) {
    for (auto& r : batch.results) r = result(KVStatus::read_only, "KV put: this store is a reader");
    return std::move(batch.results);
  }
  if (fleet > 0) catch_up();  // the other writers' blocks count as present
  {
    // Admission runs under the commit lock so that eviction records keep the order of the
    // evictions (a later put of the same key cannot slip its record in before the remove).
    std::lock_guard commit_admission(commit);
    admit(batch);
    journal_evictions(batch);  // where it fails, the batch's work is settled as failed
  }
  if (!batch.work.empty()) {
    const auto start = Clock::now();
    write_blocks(batch, options.after_event);
    const auto written = Clock::now();
    sync_slabs(batch);
    const auto synced = Clock::now();
    std::lock_guard commit_lock(commit);
    const std::string journal_error = commit_records(batch);
    const auto journaled = Clock::now();
    publish(batch, journal_error);
    {
      std::lock_guard lock(mutex);
      counters.put_move_seconds += seconds(start, written);
      counters.put_sync_seconds += seconds(written, synced);
      counters.put_journal_seconds += seconds(synced, journaled);
    }
    checkpoint_if_due();
  }
  // A key repeated in the batch reports its first copy's outcome: already present once that
  // is stored, its failure otherwise.
  for (const auto& [i, first] : batch.duplicates)
    batch.results[i] = batch.results[first].ok() ? result(KVStatus::already_present)
                                                 : batch.results[first];
  return std::move(batch.results);
}

void KVStore::Impl::admit(PutBatch& b) {
  std::unordered_map<KVKey, std::size_t> first_of;
  std::lock_guard lock(mutex);
  for (std::size_t i = 0; i < b.keys.size(); ++i) {
    const KVKey key = b.keys[i];
    const std::uint64_t size = total_size(b.sources[i]);
    if (std::string why = check_pieces(b.sources[i]); !why.empty()) {
      b.results[i] =
          result(KVStatus::unsupported, "KV put of key " + std::to_string(key) + ": " + why);
      continue;
    }
    if (size == 0 || size > block_bytes) {
      b.results[i] = result(KVStatus::bad_size, "KV put of key " + std::to_string(key) + ": " +
                                                    std::to_string(size) +
                                                    " bytes; blocks are 1 to " +
                                                    std::to_string(block_bytes));
      continue;
    }
    if (const std::uint32_t found = index->find(key); found != kNoSlot) {
      index->touch(found);
      b.results[i] = result(KVStatus::already_present);
      continue;
    }
    if (const auto first = first_of.find(key); first != first_of.end()) {
      b.duplicates.push_back({i, first->second});
      continue;
    }
    if (!pending.insert(key).second) {  // another thread's put of it is in flight
      b.results[i] = result(KVStatus::already_present);
      continue;
    }
    first_of.emplace(key, i);
    std::optional<std::uint64_t> evicted;
    SlotEntry evicted_entry;
    const std::uint32_t slot = index->take_slot(evicted, evicted_entry);
    if (slot == kNoSlot) {
      pending.erase(key);
      b.results[i] =
          result(KVStatus::no_space, "KV put: every slot is busy with reads or writes in flight");
      continue;
    }
    if (evicted) {
      ++counters.evictions;
      b.evictions.push_back(
          {RecordKind::remove, last_sequence + b.evictions.size() + 1, *evicted, slot, 0, 0});
      b.evicted.push_back(evicted_entry);
    }
    b.work.push_back({i, slot, size});
  }
}

// A slot taken from an evicted block is written only once a remove record of that block is in
// the journal: else a writer killed before this put's own record leaves the old key's record
// pointing at new bytes, a visible block that fails its checksum. Called under the commit lock.
void KVStore::Impl::journal_evictions(PutBatch& b) {
  if (b.evictions.empty()) return;
  try {
    // Written, not yet synced: a process kill keeps it (the page cache holds it); the journal's
    // sync at this put's commit makes it durable with the put's records.
    append_records(b.evictions, false);
    last_sequence = b.evictions.back().sequence;
  } catch (const std::exception& e) {
    // The journal still maps the evicted blocks to their slots, whose bytes are intact (nothing
    // was written over them): they are put back, so no later put reuses those slots as free
    // before a removal is written. The other slots go back to the free list; the batch fails.
    std::lock_guard lock(mutex);
    for (const PutWork& w : b.work) {
      pending.erase(b.keys[w.index]);
      b.results[w.index] = result(KVStatus::io_error, e.what());
      const auto back = std::find_if(b.evictions.begin(), b.evictions.end(),
                                     [&](const Record& r) { return r.slot == w.slot; });
      if (back == b.evictions.end()) {
        index->release_writing(w.slot);
        continue;
      }
      const SlotEntry& old = b.evicted[static_cast<std::size_t>(back - b.evictions.begin())];
      index->publish(w.slot, old.key, old.length, old.checksum);
    }
    b.work.clear();
  }
}

void KVStore::Impl::write_blocks(PutBatch& b, void* after_event) {
  b.requests.resize(b.work.size());
  for (std::size_t w = 0; w < b.work.size(); ++w) {
    b.requests[w].slab = slab_of(b.work[w].slot);
    b.requests[w].offset = offset_of(b.work[w].slot);
    b.requests[w].pieces = b.sources[b.work[w].index];
  }
  io->write(b.requests, after_event);
}

// Each touched slab's fdatasync at once (each a flush of the device's cache; together they can
// share one): this thread and the transfer core's worker pool take them in turn.
void KVStore::Impl::sync_slabs(PutBatch& b) {
  std::set<int> touched;
  for (const BlockRequest& r : b.requests)
    if (r.outcome == BlockOutcome::ok) touched.insert(r.slab);
  if (touched.empty()) return;
  auto round = std::make_shared<SyncRound>();
  round->slabs.assign(touched.begin(), touched.end());
  round->errors.resize(round->slabs.size());
  BlockIo* block_io = io.get();
  if (round->slabs.size() > 1)
    detail::transfer_workers().post([round, block_io] { run_syncs(*round, *block_io); },
                                    static_cast<unsigned>(round->slabs.size() - 1));
  run_syncs(*round, *block_io);
  {
    std::unique_lock lock(round->mutex);
    round->finished.wait(lock, [&] { return round->done == round->slabs.size(); });
  }
  for (std::size_t k = 0; k < round->slabs.size(); ++k) {
    if (round->errors[k].empty()) continue;
    for (BlockRequest& r : b.requests)
      if (r.slab == round->slabs[k] && r.outcome == BlockOutcome::ok) {
        r.outcome = BlockOutcome::io_error;
        r.message = round->errors[k];
      }
  }
}

std::string KVStore::Impl::commit_records(PutBatch& b) {
  std::vector<Record> records;
  for (std::size_t w = 0; w < b.work.size(); ++w)
    if (b.requests[w].outcome == BlockOutcome::ok)
      records.push_back({RecordKind::put, last_sequence + records.size() + 1,
                         b.keys[b.work[w].index], b.work[w].slot, b.work[w].size,
                         b.requests[w].checksum});
  if (records.empty()) return {};
  try {
    append_records(records);
    last_sequence = records.back().sequence;
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void KVStore::Impl::publish(PutBatch& b, const std::string& journal_error) {
  std::lock_guard lock(mutex);
  for (std::size_t w = 0; w < b.work.size(); ++w) {
    const std::size_t i = b.work[w].index;
    const BlockRequest& r = b.requests[w];
    pending.erase(b.keys[i]);
    if (r.outcome == BlockOutcome::ok && journal_error.empty()) {
      index->publish(b.work[w].slot, b.keys[i], static_cast<std::uint32_t>(b.work[w].size),
                     r.checksum);
      ++counters.puts;
      b.results[i] = result(KVStatus::ok);
    } else {
      index->release_writing(b.work[w].slot);
      b.results[i] = r.outcome == BlockOutcome::ok ? result(KVStatus::io_error, journal_error)
                                                   : result(status_of(r.outcome), r.message);
    }
    b.results[i].route = r.route;
    b.results[i].route_reason = r.route_reason;
  }
}

void KVStore::Impl::checkpoint_if_due() {
  if (records_since_checkpoint < options.checkpoint_every) return;
  try {
    checkpoint_locked();
  } catch (...) {
    // The journal keeps every commit; the next checkpoint tries again.
  }
}

}  // namespace ferry
