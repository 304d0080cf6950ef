// KVStore's durable state: applying records, loading the checkpoint and replaying the journal
// at open, appending a batch's records, writing a checkpoint, and a reader's refresh.
#include <algorithm>
#include <cerrno>
#include <mutex>

#include "ferry/error.hpp"
#include "kv/kv_store_impl.hpp"
#include "platform/file_ops.hpp"
#include "kv/kv_format_error.hpp"  // last: redefines FERRY_FORMAT_EXPECT

namespace ferry {

void KVStore::Impl::apply(const Record& r) {
  if (r.kind == RecordKind::put)
    index->publish(r.slot, r.key, static_cast<std::uint32_t>(r.length), r.checksum);
  else
    index->erase(r.key);
  last_sequence = r.sequence;
}

// The checkpoint's entries straight into a fresh index, oldest use first (so the LRU order
// comes back as it was): one probe per entry and no allocation, which keeps the reopen of 10
// million blocks short.
void KVStore::Impl::load_checkpoint(std::span<const std::byte> bytes, std::uint64_t count,
                                    KvIndex& into) {
  const std::string name = checkpoint_path.string();
  for (std::uint64_t i = 0; i < count; ++i) {
    const Record r = decode_checkpoint_entry(bytes, i, limits, name);
    if (!into.insert_new(r.slot, r.key, static_cast<std::uint32_t>(r.length), r.checksum)) {
      const bool slot_taken = into.slot(r.slot).state != SlotState::free;
      detail::fail<KVFormatError>(name, ": checkpoint entry at offset ", checkpoint_entry_offset(i),
                                slot_taken ? " repeats slot " : " repeats key ",
                                slot_taken ? r.slot : r.key);
    }
  }
}

void KVStore::Impl::load_state(bool writable) {
  if (fleet > 0) {
    // One index over every share: this writer's own first (its checkpoint straight in), then
    // each other share as a follower.
    index = std::make_unique<KvIndex>(static_cast<std::uint32_t>(slot_count));
    if (writable) {
      index->limit_takes(share_first(share), share_first(share + 1));
      load_own_state(true);
    }
    for (Follower& f : followers) reload(f);
    return;
  }
  load_own_state(writable);
}

void KVStore::Impl::load_own_state(bool writable) {
  const std::string journal_name = journal_path.string();
  // A reader may race with the writer's checkpoint (a new checkpoint, then a new journal):
  // a journal newer than the checkpoint read means the checkpoint changed in between.
  for (int attempt = 0;; ++attempt) {
    const auto checkpoint = read_if_exists(checkpoint_path);
    CheckpointHeader base;
    if (checkpoint) base = decode_checkpoint_header(*checkpoint, limits, checkpoint_path.string());
    detail::FileDescriptor fd = detail::open_existing(journal_path, false);
    if (!fd && errno != ENOENT) FERRY_SYSCALL_FAIL(journal_name, ": cannot open");
    if (fd) require_regular(fd, journal_path);
    std::vector<std::byte> bytes;
    detail::FileIdentity st;
    if (fd) {
      const auto now = detail::identity_of_open(fd.get());
      if (!now) FERRY_SYSCALL_FAIL(journal_name);
      st = *now;
      bytes.resize(static_cast<std::size_t>(st.size));
      bytes.resize(detail::read_up_to(fd, bytes.data(), bytes.size(), 0, journal_path));
    }
    std::optional<std::uint64_t> journal_epoch;
    if (fd) journal_epoch = decode_journal_header(bytes, journal_name);
    if (journal_epoch && *journal_epoch > base.epoch) {
      FERRY_FORMAT_EXPECT(!writable && attempt < 20, journal_name, ": journal epoch ",
                          *journal_epoch, " is newer than the checkpoint's (", base.epoch,
                          "): the checkpoint is missing or old");
      continue;
    }
    if (fleet == 0) index = std::make_unique<KvIndex>(static_cast<std::uint32_t>(slot_count));
    if (checkpoint) load_checkpoint(*checkpoint, base.count, *index);
    epoch = base.epoch;
    last_sequence = base.last_sequence;
    records_since_checkpoint = 0;
    following = false;
    std::uint64_t valid_end = kJournalHeaderSize;
    if (journal_epoch && *journal_epoch == base.epoch) {
      JournalScan scan =
          scan_records(bytes, kJournalHeaderSize, base.last_sequence, limits, journal_name);
      for (const Record& r : scan.records) apply(r);
      records_since_checkpoint = scan.records.size();
      valid_end = scan.valid_end;
      counters.journal_tail_dropped = scan.torn_bytes;
      counters.journal_corrupt_records = scan.corrupt_records;
      counters.journal_corrupt_offset = scan.first_corrupt_offset;
      following = true;
      journal_offset = valid_end;
    }
    fd = {};  // closed before a rename over it (Windows refuses to replace an open file)
    if (writable) {
      if (!journal_epoch || *journal_epoch != base.epoch) {
        // No journal, or one older than the checkpoint (a crash between the two renames):
        // start the checkpoint's own.
        write_atomically(journal_path, encode_journal_header(epoch));
        valid_end = kJournalHeaderSize;
      }
      journal = AppendFile(journal_path, valid_end);  // cuts a torn tail
    }
    return;
  }
}

void KVStore::Impl::append_records(const std::vector<Record>& records, bool sync) {
  std::vector<std::byte> bytes(records.size() * kRecordSize);
  for (std::size_t i = 0; i < records.size(); ++i)
    encode_record(records[i], bytes.data() + i * kRecordSize);
  journal.append(bytes, sync);
  records_since_checkpoint += records.size();
}

void KVStore::Impl::checkpoint_locked() {
  IndexSnapshot snapshot;
  {
    std::lock_guard lock(mutex);
    snapshot.epoch = epoch + 1;
    snapshot.last_sequence = last_sequence;
    for (std::uint32_t s : index->lru_order()) {
      if (!own_slot(s)) continue;  // a fleet: another writer's block, in its own checkpoint
      const SlotEntry& e = index->slot(s);
      snapshot.entries.push_back({RecordKind::put, 0, e.key, s, e.length, e.checksum});
    }
  }
  // Checkpoint first, then the new journal: a crash in between leaves a journal older than
  // the checkpoint, which open recognises by its epoch and replaces.
  write_atomically(checkpoint_path, encode_checkpoint(snapshot, limits));
  // The old journal closed before the new one is renamed over it: Windows refuses to replace an
  // open file. Should that rename fail, appends go on to the old journal, as before.
  const std::uint64_t old_size = journal.size();
  journal = AppendFile();
  try {
    write_atomically(journal_path, encode_journal_header(snapshot.epoch));
  } catch (...) {
    journal = AppendFile(journal_path, old_size);
    throw;
  }
  journal = AppendFile(journal_path, kJournalHeaderSize);
  epoch = snapshot.epoch;
  records_since_checkpoint = 0;
  std::lock_guard lock(mutex);
  ++counters.checkpoints;
}

void KVStore::Impl::refresh() {
  std::lock_guard commit_lock(commit);
  detail::FileDescriptor fd = detail::open_existing(journal_path, false);
  if (!fd) {
    if (errno == ENOENT) return;  // between the writer's creation steps
    FERRY_SYSCALL_FAIL(journal_path.string(), ": cannot open");
  }
  require_regular(fd, journal_path);
  const auto st = detail::identity_of_open(fd.get());
  if (!st) FERRY_SYSCALL_FAIL(journal_path.string());
  // Which journal this is: its epoch, which only grows (a file system reuses inode numbers, so
  // a reader idle across checkpoints could take a new journal of the same inode for its own).
  std::byte header[kJournalHeaderSize];
  const std::size_t got_header =
      detail::read_up_to(fd, header, sizeof header, 0, journal_path);
  const std::uint64_t journal_epoch =
      decode_journal_header(std::span(header, got_header), journal_path.string());
  if (!following || journal_epoch != epoch) {  // the writer checkpointed: start from its snapshot
    std::lock_guard lock(mutex);
    load_state(false);
    return;
  }
  const std::uint64_t size = st->size;
  if (size <= journal_offset) return;
  std::vector<std::byte> bytes(size);
  const std::size_t got = detail::read_up_to(fd, bytes.data() + journal_offset,
                                             size - journal_offset, journal_offset, journal_path);
  bytes.resize(journal_offset + got);
  // A tail that does not decode may be an append in progress: stop there, take it next time.
  JournalScan scan =
      scan_records(bytes, journal_offset, last_sequence, limits, journal_path.string());
  std::lock_guard lock(mutex);
  for (const Record& r : scan.records) apply(r);
  if (scan.corrupt_records > 0 && counters.journal_corrupt_records == 0)
    counters.journal_corrupt_offset = scan.first_corrupt_offset;
  counters.journal_corrupt_records += scan.corrupt_records;
  journal_offset = scan.valid_end;
}

}  // namespace ferry
