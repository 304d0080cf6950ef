// A fleet of writer processes on one namespace (KVStoreOptions::fleet_writers; the design and
// what it needs from the file system: docs/kv_fleet.md). The slots are split into shares; a
// writer takes the first share whose lock (writer.<m>.lock) is free and keeps its own journal
// and checkpoint (journal.<m>, checkpoint.<m>) with the single writer's machinery, writing and
// evicting only its own slots. Every other share is followed as a reader follows a writer:
// before each call, its journal's header (the epoch) and size say whether anything changed;
// new records are applied, a new epoch reloads the share from its checkpoint. A writer killed
// at any point loses only its own unreturned puts: nothing else writes its slots or its files.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <utility>

#include "ferry/error.hpp"
#include "kv/kv_store_impl.hpp"
#include "platform/file_ops.hpp"
// clang-format off: last, after every header that includes ferry/error.hpp
#include "kv/kv_format_error.hpp"  // redefines FERRY_FORMAT_EXPECT
// clang-format on

namespace ferry {

namespace {

// A writer whose journal grew this recently is writing: it shares the namespace's storage.
constexpr std::chrono::seconds kActiveWriter{2};

// A share's record or checkpoint entry must name one of its own slots.
void check_share(const Record& r, std::uint32_t first, std::uint32_t end,
                 const std::string& name) {
  FERRY_FORMAT_EXPECT(r.slot >= first && r.slot < end, name, ": key ", r.key, " names slot ",
                      r.slot, ", outside this writer share's slots ", first, " to ", end - 1);
}

// When a share's journal, found grown, was last written, on this process's steady clock: at its
// modification time (the file system's clock), but not before this process's last look at it (it
// grew since): a writer that stopped long ago does not count as writing, and a clock skewed
// between machines cannot hide one that is.
std::chrono::steady_clock::time_point last_written(std::chrono::steady_clock::time_point looked_at,
                                                   std::int64_t mtime_ns) {
  const auto now = std::chrono::steady_clock::now();
  const auto age =
      std::chrono::nanoseconds(std::max<std::int64_t>(0, detail::file_clock_now_ns() - mtime_ns));
  return std::max(looked_at,
                  now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(age));
}

}  // namespace

std::uint32_t KVStore::Impl::share_first(unsigned m) const {
  const std::uint64_t per = (slot_count + fleet - 1) / fleet;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(per * m, slot_count));
}

void KVStore::Impl::take_share() {
  for (unsigned m = 0; m < fleet; ++m) {
    const fs::path lock_path = dir / ("writer." + std::to_string(m) + ".lock");
    detail::FileDescriptor fd = detail::open_or_create(lock_path, 0600);
    if (!fd) FERRY_SYSCALL_FAIL(lock_path.string(), ": cannot open");
    require_regular(fd, lock_path);
    if (!detail::lock_exclusive(fd.get())) {
      if (errno == EWOULDBLOCK) continue;  // another writer's share
      FERRY_SYSCALL_FAIL(lock_path.string(), ": cannot lock");
    }
    lock_fd = std::move(fd);
    share = m;
    journal_path = dir / ("journal." + std::to_string(m));
    checkpoint_path = dir / ("checkpoint." + std::to_string(m));
    return;
  }
  detail::fail<std::runtime_error>(dir.string(), ": all ", fleet,
                                   " writer shares of this fleet are taken (open read_only to "
                                   "share it)");
}

void KVStore::Impl::set_up_followers() {
  followers.clear();
  for (unsigned m = 0; m < fleet; ++m) {
    if (!options.read_only && m == share) continue;
    Follower f;
    f.journal = dir / ("journal." + std::to_string(m));
    f.checkpoint = dir / ("checkpoint." + std::to_string(m));
    f.first = share_first(m);
    f.end = share_first(m + 1);
    followers.push_back(std::move(f));
  }
}

void KVStore::Impl::catch_up() {
  if (fleet > 0) {
    std::lock_guard commit_lock(commit);
    const auto now = std::chrono::steady_clock::now();
    unsigned active = 1;
    for (Follower& f : followers) {
      fold(f);
      active +=
          f.wrote_at != std::chrono::steady_clock::time_point{} && now - f.wrote_at < kActiveWriter;
    }
    if (!options.read_only) io->share_writes(active);
    std::lock_guard lock(mutex);
    writers_active = options.read_only ? active - 1 : active;
    promote_shadows();  // a copy this writer evicted or removed may have another
  } else if (options.read_only) {
    refresh();
  }
}

void KVStore::Impl::apply_foreign(Follower& f, const Record& r) {
  f.shadows.erase(r.slot);  // the slot's old block is gone, whatever it was
  if (r.kind == RecordKind::remove) {
    if (index->find(r.key) == r.slot) index->erase(r.key);  // its own copy only
    return;
  }
  const std::uint32_t held = index->find(r.key);
  if (held == kNoSlot || held == r.slot) {
    index->publish(r.slot, r.key, static_cast<std::uint32_t>(r.length), r.checksum);
    return;
  }
  // Another share's copy of the key is in the index: this one waits, and the slot's old
  // block (the writer evicted it for this one) leaves the index.
  if (index->slot(r.slot).state == SlotState::live) index->erase(index->slot(r.slot).key);
  f.shadows[r.slot] = r;
}

void KVStore::Impl::promote_shadows() {
  for (Follower& f : followers)
    for (auto it = f.shadows.begin(); it != f.shadows.end();) {
      const Record& r = it->second;
      if (index->find(r.key) == kNoSlot && index->slot(r.slot).state == SlotState::free) {
        index->publish(r.slot, r.key, static_cast<std::uint32_t>(r.length), r.checksum);
        it = f.shadows.erase(it);
      } else {
        ++it;
      }
    }
}

void KVStore::Impl::reload(Follower& f) {
  const std::string journal_name = f.journal.string(), checkpoint_name = f.checkpoint.string();
  for (int attempt = 0;; ++attempt) {
    const auto checkpoint = read_if_exists(f.checkpoint);
    CheckpointHeader base;
    if (checkpoint) base = decode_checkpoint_header(*checkpoint, limits, checkpoint_name);
    const auto journal = read_if_exists(f.journal);
    std::optional<std::uint64_t> journal_epoch;
    if (journal) journal_epoch = decode_journal_header(*journal, journal_name);
    if (journal_epoch && *journal_epoch > base.epoch) {  // it checkpointed between the reads
      FERRY_FORMAT_EXPECT(attempt < 20, journal_name, ": journal epoch ", *journal_epoch,
                          " is newer than the checkpoint's (", base.epoch,
                          "): the checkpoint is missing or old");
      continue;
    }
    const bool follow = journal_epoch && *journal_epoch == base.epoch;
    JournalScan scan;
    if (follow)
      scan = scan_records(*journal, kJournalHeaderSize, base.last_sequence, limits, journal_name);
    std::lock_guard lock(mutex);
    for (std::uint32_t s = f.first; s < f.end; ++s)  // the share's old view goes
      if (index->slot(s).state == SlotState::live) index->erase(index->slot(s).key);
    f.shadows.clear();
    for (std::uint64_t i = 0; i < base.count; ++i) {
      const Record r = decode_checkpoint_entry(*checkpoint, i, limits, checkpoint_name);
      check_share(r, f.first, f.end, checkpoint_name);
      apply_foreign(f, r);
    }
    for (const Record& r : scan.records) {
      check_share(r, f.first, f.end, journal_name);
      apply_foreign(f, r);
    }
    promote_shadows();
    f.epoch = base.epoch;
    f.following = follow;
    f.offset = follow ? scan.valid_end : 0;
    f.last_sequence = scan.records.empty() ? base.last_sequence : scan.records.back().sequence;
    return;
  }
}

void KVStore::Impl::fold(Follower& f) {
  const std::string name = f.journal.string();
  detail::FileDescriptor fd = detail::open_existing(f.journal, false);
  if (!fd) {
    if (errno == ENOENT) return;  // a share no writer has taken yet
    FERRY_SYSCALL_FAIL(name, ": cannot open");
  }
  require_regular(fd, f.journal);
  const auto st = detail::identity_of_open(fd.get());
  if (!st) FERRY_SYSCALL_FAIL(name);
  std::byte header[kJournalHeaderSize];
  const std::size_t got = detail::read_up_to(fd, header, sizeof header, 0, f.journal);
  const std::uint64_t epoch_now = decode_journal_header(std::span(header, got), name);
  const auto looked_at = std::exchange(f.looked_at, std::chrono::steady_clock::now());
  if (!f.following || epoch_now != f.epoch) {
    // A share seen for the first time counts as writing only where its journal holds records:
    // a writer that has just opened it has written nothing.
    const bool written = f.following || st->size > kJournalHeaderSize;
    fd = {};
    reload(f);
    if (written) f.wrote_at = last_written(looked_at, st->mtime_ns);
    return;
  }
  if (st->size <= f.offset) return;  // nothing new: the cheap case
  std::vector<std::byte> bytes(st->size);
  const std::size_t read =
      detail::read_up_to(fd, bytes.data() + f.offset, st->size - f.offset, f.offset, f.journal);
  bytes.resize(f.offset + read);
  const JournalScan scan = scan_records(bytes, f.offset, f.last_sequence, limits, name);
  std::lock_guard lock(mutex);
  for (const Record& r : scan.records) {
    check_share(r, f.first, f.end, name);
    apply_foreign(f, r);
  }
  promote_shadows();
  f.offset = scan.valid_end;
  if (!scan.records.empty()) {
    f.last_sequence = scan.records.back().sequence;
    f.wrote_at = last_written(looked_at, st->mtime_ns);
  }
}

}  // namespace ferry
