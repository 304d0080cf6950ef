// The KV store's in-memory index: one 32-byte entry per slot (key, length, checksum, LRU links,
// pin count, state) and an open-addressing table of slot numbers keyed by the block key
// (4 bytes a bucket, at most half full): about 40 bytes per block. Not thread-safe: the store
// holds its mutex around every call.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace ferry::detail::kv {

inline constexpr std::uint32_t kNoSlot = 0xffffffffu;

enum class SlotState : std::uint8_t {
  free,     // on the free list
  writing,  // taken by a put whose record is not committed yet: invisible
  live,     // committed and in the key table
  zombie,   // removed or evicted while pinned by reads: freed when the last pin goes
};

struct SlotEntry {
  std::uint64_t key = 0;
  std::uint64_t checksum = 0;
  std::uint32_t length = 0;  // bytes of the block (<= block size, < 4 GiB)
  std::uint32_t prev = kNoSlot, next = kNoSlot;  // LRU list: head is the most recent use
  std::uint16_t pins = 0;
  SlotState state = SlotState::free;
};

class KvIndex {
 public:
  explicit KvIndex(std::uint32_t slot_count);

  std::uint32_t slot_count() const { return static_cast<std::uint32_t>(_slots.size()); }
  std::uint64_t size() const { return _live; }
  const SlotEntry& slot(std::uint32_t s) const { return _slots[s]; }

  // The live slot holding `key`, or kNoSlot.
  std::uint32_t find(std::uint64_t key) const;
  // Moves a live slot to the front of the LRU list.
  void touch(std::uint32_t s);

  // A free slot, else the least recently used unpinned live one (its key returned in
  // `evicted`), now in state `writing`; kNoSlot when every slot is busy.
  std::uint32_t take_slot(std::optional<std::uint64_t>& evicted);
  // take_slot takes (and evicts) only slots in [first, end): a fleet writer's own share.
  void limit_takes(std::uint32_t first, std::uint32_t end) {
    _take_first = first;
    _take_end = end;
  }
  // The same, also giving the evicted block's entry (key, length, checksum) to a caller that may
  // have to put it back with publish() (its bytes untouched).
  std::uint32_t take_slot(std::optional<std::uint64_t>& evicted, SlotEntry& evicted_entry);
  // Gives a `writing` slot back (its put failed).
  void release_writing(std::uint32_t s);

  // Makes `s` live for `key` (replay may name a slot that holds another key, or a key held in
  // another slot: both are dropped first).
  void publish(std::uint32_t s, std::uint64_t key, std::uint32_t length, std::uint64_t checksum);
  // Makes free slot `s` live for `key`, which must not be present: the bulk load of a
  // checkpoint (one probe, no eviction logic). Returns false, changing nothing, where the slot
  // is not free or the key is present.
  bool insert_new(std::uint32_t s, std::uint64_t key, std::uint32_t length, std::uint64_t checksum);
  // Drops `key`; returns false when absent. A pinned slot turns zombie until unpinned.
  // (Only a writer pins: a reader's slots can change under it anyway, from the writer.)
  bool erase(std::uint64_t key);

  void pin(std::uint32_t s) { ++_slots[s].pins; }
  void unpin(std::uint32_t s);

  // Live slots from the least recent use to the most recent.
  std::vector<std::uint32_t> lru_order() const;
  std::uint64_t memory_bytes() const;

 private:
  std::size_t bucket_of(std::uint64_t key) const;
  void table_insert(std::uint64_t key, std::uint32_t s);
  void table_erase(std::uint64_t key);
  void lru_unlink(std::uint32_t s);
  void lru_push_front(std::uint32_t s);
  void drop_slot(std::uint32_t s);  // a live slot leaves the table and the LRU list
  void push_free(std::uint32_t s);

  std::vector<SlotEntry> _slots;
  std::vector<std::uint32_t> _table;  // slot numbers; kNoSlot = empty bucket
  std::size_t _mask = 0;
  std::vector<std::uint32_t> _free;
  std::uint32_t _head = kNoSlot, _tail = kNoSlot;
  std::uint64_t _live = 0;
  std::uint32_t _take_first = 0, _take_end = kNoSlot;
};

}  // namespace ferry::detail::kv
