#include "kv/kv_index.hpp"

#include <bit>

#include "ferry/error.hpp"

namespace ferry::detail::kv {

KvIndex::KvIndex(std::uint32_t slot_count) : _slots(slot_count) {
  const std::size_t buckets = std::bit_ceil<std::size_t>(std::size_t{slot_count} * 2 + 2);
  _table.assign(buckets, kNoSlot);
  _mask = buckets - 1;
  _free.reserve(slot_count);
  for (std::uint32_t s = slot_count; s-- > 0;) _free.push_back(s);  // slot 0 taken first
}

std::size_t KvIndex::bucket_of(std::uint64_t key) const {
  // Keys are usually hashes already; the multiply spreads ones that are not (0, 1, 2...).
  return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & _mask;
}

std::uint32_t KvIndex::find(std::uint64_t key) const {
  for (std::size_t b = bucket_of(key);; b = (b + 1) & _mask) {
    const std::uint32_t s = _table[b];
    if (s == kNoSlot) return kNoSlot;
    if (_slots[s].key == key) return s;
  }
}

void KvIndex::table_insert(std::uint64_t key, std::uint32_t s) {
  std::size_t b = bucket_of(key);
  while (_table[b] != kNoSlot) b = (b + 1) & _mask;
  _table[b] = s;
}

void KvIndex::table_erase(std::uint64_t key) {
  std::size_t b = bucket_of(key);
  while (_slots[_table[b]].key != key) b = (b + 1) & _mask;
  // Backward-shift deletion: move later members of the probe run into the hole, so lookups
  // never need tombstones.
  std::size_t hole = b;
  for (std::size_t next = (hole + 1) & _mask; _table[next] != kNoSlot; next = (next + 1) & _mask) {
    const std::size_t home = bucket_of(_slots[_table[next]].key);
    const bool movable = ((next - home) & _mask) >= ((next - hole) & _mask);
    if (movable) {
      _table[hole] = _table[next];
      hole = next;
    }
  }
  _table[hole] = kNoSlot;
}

void KvIndex::lru_unlink(std::uint32_t s) {
  SlotEntry& e = _slots[s];
  (e.prev == kNoSlot ? _head : _slots[e.prev].next) = e.next;
  (e.next == kNoSlot ? _tail : _slots[e.next].prev) = e.prev;
  e.prev = e.next = kNoSlot;
}

void KvIndex::lru_push_front(std::uint32_t s) {
  SlotEntry& e = _slots[s];
  e.prev = kNoSlot;
  e.next = _head;
  if (_head != kNoSlot) _slots[_head].prev = s;
  _head = s;
  if (_tail == kNoSlot) _tail = s;
}

void KvIndex::touch(std::uint32_t s) {
  if (_head == s) return;
  lru_unlink(s);
  lru_push_front(s);
}

void KvIndex::drop_slot(std::uint32_t s) {
  FERRY_ASSERT(_slots[s].state == SlotState::live);
  table_erase(_slots[s].key);
  lru_unlink(s);
  --_live;
}

std::uint32_t KvIndex::take_slot(std::optional<std::uint64_t>& evicted) {
  SlotEntry ignored;
  return take_slot(evicted, ignored);
}

std::uint32_t KvIndex::take_slot(std::optional<std::uint64_t>& evicted, SlotEntry& evicted_entry) {
  evicted.reset();
  // The free list may hold stale entries (replay publishes into free slots without searching
  // the list): skip any slot no longer free.
  while (!_free.empty()) {
    const std::uint32_t s = _free.back();
    _free.pop_back();
    if (_slots[s].state != SlotState::free) continue;
    if (s < _take_first || s >= _take_end) continue;  // another writer's (it stays free)
    _slots[s].state = SlotState::writing;
    return s;
  }
  for (std::uint32_t s = _tail; s != kNoSlot; s = _slots[s].prev) {
    if (_slots[s].pins != 0 || s < _take_first || s >= _take_end) continue;
    evicted = _slots[s].key;
    evicted_entry = _slots[s];
    drop_slot(s);
    _slots[s].state = SlotState::writing;
    return s;
  }
  return kNoSlot;
}

void KvIndex::release_writing(std::uint32_t s) {
  FERRY_ASSERT(_slots[s].state == SlotState::writing);
  _slots[s] = SlotEntry{};
  push_free(s);
}

void KvIndex::publish(std::uint32_t s, std::uint64_t key, std::uint32_t length,
                      std::uint64_t checksum) {
  if (const std::uint32_t old = find(key); old != kNoSlot && old != s) erase(key);
  SlotEntry& e = _slots[s];
  if (e.state == SlotState::live) {
    drop_slot(s);
  }
  FERRY_ASSERT(e.state != SlotState::zombie);
  e.key = key;
  e.length = length;
  e.checksum = checksum;
  e.state = SlotState::live;
  table_insert(key, s);
  lru_push_front(s);
  ++_live;
}

bool KvIndex::insert_new(std::uint32_t s, std::uint64_t key, std::uint32_t length,
                         std::uint64_t checksum) {
  if (_slots[s].state != SlotState::free) return false;
  std::size_t b = bucket_of(key);
  for (; _table[b] != kNoSlot; b = (b + 1) & _mask)
    if (_slots[_table[b]].key == key) return false;
  SlotEntry& e = _slots[s];
  e.key = key;
  e.length = length;
  e.checksum = checksum;
  e.state = SlotState::live;
  _table[b] = s;
  lru_push_front(s);
  ++_live;
  return true;
}

bool KvIndex::erase(std::uint64_t key) {
  const std::uint32_t s = find(key);
  if (s == kNoSlot) return false;
  drop_slot(s);
  if (_slots[s].pins != 0) {
    _slots[s].state = SlotState::zombie;
  } else {
    _slots[s] = SlotEntry{};
    push_free(s);
  }
  return true;
}

void KvIndex::push_free(std::uint32_t s) {
  _free.push_back(s);
  if (_free.size() > 2 * _slots.size() + 16) {  // stale entries piled up: rebuild
    _free.clear();
    for (std::uint32_t i = slot_count(); i-- > 0;)
      if (_slots[i].state == SlotState::free) _free.push_back(i);
  }
}

void KvIndex::unpin(std::uint32_t s) {
  SlotEntry& e = _slots[s];
  FERRY_ASSERT(e.pins > 0);
  if (--e.pins == 0 && e.state == SlotState::zombie) {
    e = SlotEntry{};
    push_free(s);
  }
}

std::vector<std::uint32_t> KvIndex::lru_order() const {
  std::vector<std::uint32_t> out;
  out.reserve(_live);
  for (std::uint32_t s = _tail; s != kNoSlot; s = _slots[s].prev) out.push_back(s);
  return out;
}

std::uint64_t KvIndex::memory_bytes() const {
  return _slots.capacity() * sizeof(SlotEntry) + _table.capacity() * sizeof(std::uint32_t) +
         _free.capacity() * sizeof(std::uint32_t);
}

}  // namespace ferry::detail::kv
