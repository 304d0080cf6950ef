#include "kv/kv_format.hpp"

#include <xxhash.h>

#include <cstring>
#include <algorithm>

#include "ferry/error.hpp"
#include "kv/kv_format_error.hpp"  // last: redefines FERRY_FORMAT_EXPECT

namespace ferry::detail::kv {
namespace {

constexpr char kJournalMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'K', 'V', 'J'};
constexpr char kCheckpointMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'K', 'V', 'C'};
constexpr std::uint32_t kRecordMagic = 0x3152564b;  // "KVR1"

// Little-endian stores and loads (memcpy: the bytes are unaligned).
template <class T>
void put_le(std::byte* out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    out[i] = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff);
}
template <class T>
T get_le(const std::byte* in) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    value |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return static_cast<T>(value);
}

std::uint64_t hash(const std::byte* data, std::size_t size) { return XXH3_64bits(data, size); }

void check_entry(const Record& r, const Limits& limits, const std::string& name,
                 const char* what, std::uint64_t offset) {
  FERRY_FORMAT_EXPECT(r.slot < limits.slot_count, name, ": ", what, " at offset ", offset,
                      " names slot ", r.slot, " of ", limits.slot_count);
  if (r.kind == RecordKind::put)
    FERRY_FORMAT_EXPECT(r.length > 0 && r.length <= limits.block_bytes, name, ": ", what,
                        " at offset ", offset, " has length ", r.length, " (block size ",
                        limits.block_bytes, ")");
}

// The offset of the first record after `offset`, on the record grid, that decodes with a
// sequence above `previous_sequence`; the journal's size where there is none.
std::uint64_t next_valid_record(std::span<const std::byte> journal, std::uint64_t offset,
                                std::uint64_t previous_sequence) {
  for (std::uint64_t at = offset + kRecordSize; at + kRecordSize <= journal.size();
       at += kRecordSize) {
    const auto record = decode_record(journal.subspan(at));
    if (record && record->sequence > previous_sequence) return at;
  }
  return journal.size();
}

}  // namespace

std::vector<std::byte> encode_journal_header(std::uint64_t epoch) {
  std::vector<std::byte> out(kJournalHeaderSize);
  std::memcpy(out.data(), kJournalMagic, 8);
  put_le<std::uint32_t>(&out[8], kFormatVersion);
  put_le<std::uint32_t>(&out[12], kJournalHeaderSize);
  put_le<std::uint64_t>(&out[16], epoch);
  put_le<std::uint64_t>(&out[24], hash(out.data(), 24));
  return out;
}

std::uint64_t decode_journal_header(std::span<const std::byte> bytes, const std::string& name) {
  FERRY_FORMAT_EXPECT(bytes.size() >= kJournalHeaderSize, name, ": journal header cut short (",
                      bytes.size(), " bytes)");
  FERRY_FORMAT_EXPECT(std::memcmp(bytes.data(), kJournalMagic, 8) == 0, name,
                      ": not a ferry KV journal (bad magic)");
  const auto version = get_le<std::uint32_t>(&bytes[8]);
  FERRY_FORMAT_EXPECT(version == kFormatVersion, name, ": journal version ", version,
                      " (this ferry reads version ", kFormatVersion, ")");
  FERRY_FORMAT_EXPECT(get_le<std::uint32_t>(&bytes[12]) == kJournalHeaderSize, name,
                      ": journal header size ", get_le<std::uint32_t>(&bytes[12]));
  FERRY_FORMAT_EXPECT(get_le<std::uint64_t>(&bytes[24]) == hash(bytes.data(), 24), name,
                      ": journal header checksum mismatch");
  return get_le<std::uint64_t>(&bytes[16]);
}

void encode_record(const Record& r, std::byte* out) {
  put_le<std::uint32_t>(out, kRecordMagic);
  put_le<std::uint16_t>(out + 4, static_cast<std::uint16_t>(r.kind));
  put_le<std::uint16_t>(out + 6, kRecordSize);
  put_le<std::uint64_t>(out + 8, r.sequence);
  put_le<std::uint64_t>(out + 16, r.key);
  put_le<std::uint32_t>(out + 24, r.slot);
  put_le<std::uint32_t>(out + 28, 0);
  put_le<std::uint64_t>(out + 32, r.length);
  put_le<std::uint64_t>(out + 40, r.checksum);
  put_le<std::uint64_t>(out + 48, hash(out, 48));
}

std::optional<Record> decode_record(std::span<const std::byte> bytes) {
  if (bytes.size() < kRecordSize) return std::nullopt;
  const std::byte* in = bytes.data();
  if (get_le<std::uint32_t>(in) != kRecordMagic) return std::nullopt;
  if (get_le<std::uint16_t>(in + 6) != kRecordSize) return std::nullopt;
  if (get_le<std::uint64_t>(in + 48) != hash(in, 48)) return std::nullopt;
  Record r;
  r.kind = static_cast<RecordKind>(get_le<std::uint16_t>(in + 4));
  r.sequence = get_le<std::uint64_t>(in + 8);
  r.key = get_le<std::uint64_t>(in + 16);
  r.slot = get_le<std::uint32_t>(in + 24);
  r.length = get_le<std::uint64_t>(in + 32);
  r.checksum = get_le<std::uint64_t>(in + 40);
  return r;
}

JournalScan scan_records(std::span<const std::byte> journal, std::uint64_t offset,
                         std::uint64_t previous_sequence, const Limits& limits,
                         const std::string& name) {
  JournalScan scan;
  FERRY_ASSERT(offset <= journal.size());
  while (offset < journal.size()) {
    auto record = decode_record(journal.subspan(offset));
    if (!record) {
      // A torn tail (a crash during the last append) has no valid record after it; one that
      // does is damage in the middle: the records after it were committed and stand.
      const std::uint64_t resume = next_valid_record(journal, offset, previous_sequence);
      if (resume == journal.size()) break;
      if (scan.corrupt_records == 0) scan.first_corrupt_offset = offset;
      scan.corrupt_records += (resume - offset) / kRecordSize;
      offset = resume;
      continue;
    }
    FERRY_FORMAT_EXPECT(record->kind == RecordKind::put || record->kind == RecordKind::remove,
                        name, ": journal record at offset ", offset, " has unknown kind ",
                        static_cast<unsigned>(record->kind));
    FERRY_FORMAT_EXPECT(record->sequence > previous_sequence, name,
                        ": journal record at offset ", offset, " has sequence ",
                        record->sequence, ", not above ", previous_sequence,
                        " (duplicate or out of order)");
    check_entry(*record, limits, name, "journal record", offset);
    previous_sequence = record->sequence;
    scan.records.push_back(*record);
    offset += kRecordSize;
  }
  scan.valid_end = offset;
  scan.torn_bytes = journal.size() - offset;
  return scan;
}

std::vector<std::byte> encode_checkpoint(const IndexSnapshot& c, const Limits& limits) {
  std::vector<std::byte> out(kCheckpointHeaderSize + c.entries.size() * kEntrySize + 8);
  std::memcpy(out.data(), kCheckpointMagic, 8);
  put_le<std::uint32_t>(&out[8], kFormatVersion);
  put_le<std::uint32_t>(&out[12], kCheckpointHeaderSize);
  put_le<std::uint64_t>(&out[16], c.epoch);
  put_le<std::uint64_t>(&out[24], c.last_sequence);
  put_le<std::uint64_t>(&out[32], c.entries.size());
  put_le<std::uint64_t>(&out[40], limits.slot_count);
  put_le<std::uint64_t>(&out[48], limits.block_bytes);
  put_le<std::uint64_t>(&out[56], hash(out.data(), 56));
  std::byte* entry = out.data() + kCheckpointHeaderSize;
  for (const Record& r : c.entries) {
    put_le<std::uint64_t>(entry, r.key);
    put_le<std::uint32_t>(entry + 8, r.slot);
    put_le<std::uint32_t>(entry + 12, 0);
    put_le<std::uint64_t>(entry + 16, r.length);
    put_le<std::uint64_t>(entry + 24, r.checksum);
    entry += kEntrySize;
  }
  const std::size_t body = c.entries.size() * kEntrySize;
  put_le<std::uint64_t>(entry, hash(out.data() + kCheckpointHeaderSize, body));
  return out;
}

CheckpointHeader decode_checkpoint_header(std::span<const std::byte> bytes, const Limits& limits,
                                          const std::string& name) {
  FERRY_FORMAT_EXPECT(bytes.size() >= kCheckpointHeaderSize + 8, name,
                      ": checkpoint cut short (", bytes.size(), " bytes)");
  FERRY_FORMAT_EXPECT(std::memcmp(bytes.data(), kCheckpointMagic, 8) == 0, name,
                      ": not a ferry KV checkpoint (bad magic)");
  const auto version = get_le<std::uint32_t>(&bytes[8]);
  FERRY_FORMAT_EXPECT(version == kFormatVersion, name, ": checkpoint version ", version,
                      " (this ferry reads version ", kFormatVersion, ")");
  FERRY_FORMAT_EXPECT(get_le<std::uint32_t>(&bytes[12]) == kCheckpointHeaderSize, name,
                      ": checkpoint header size ", get_le<std::uint32_t>(&bytes[12]));
  FERRY_FORMAT_EXPECT(get_le<std::uint64_t>(&bytes[56]) == hash(bytes.data(), 56), name,
                      ": checkpoint header checksum mismatch");
  CheckpointHeader h;
  h.epoch = get_le<std::uint64_t>(&bytes[16]);
  h.last_sequence = get_le<std::uint64_t>(&bytes[24]);
  h.count = get_le<std::uint64_t>(&bytes[32]);
  const auto slot_count = get_le<std::uint64_t>(&bytes[40]);
  const auto block_bytes = get_le<std::uint64_t>(&bytes[48]);
  FERRY_FORMAT_EXPECT(slot_count == limits.slot_count && block_bytes == limits.block_bytes, name,
                      ": checkpoint of ", slot_count, " slots of ", block_bytes,
                      " bytes, but the store has ", limits.slot_count, " of ",
                      limits.block_bytes);
  FERRY_FORMAT_EXPECT(h.count <= limits.slot_count, name, ": checkpoint lists ", h.count,
                      " blocks in ", limits.slot_count, " slots");
  const std::uint64_t body = h.count * kEntrySize;  // no overflow: count <= slot_count < 2^32
  FERRY_FORMAT_EXPECT(bytes.size() == kCheckpointHeaderSize + body + 8, name, ": checkpoint is ",
                      bytes.size(), " bytes, its header says ", kCheckpointHeaderSize + body + 8);
  const std::byte* entries = bytes.data() + kCheckpointHeaderSize;
  FERRY_FORMAT_EXPECT(get_le<std::uint64_t>(entries + body) == hash(entries, body), name,
                      ": checkpoint entries checksum mismatch");
  return h;
}

Record decode_checkpoint_entry(std::span<const std::byte> bytes, std::uint64_t i,
                               const Limits& limits, const std::string& name) {
  const std::uint64_t offset = checkpoint_entry_offset(i);
  const std::byte* entry = bytes.data() + offset;
  Record r;
  r.key = get_le<std::uint64_t>(entry);
  r.slot = get_le<std::uint32_t>(entry + 8);
  r.length = get_le<std::uint64_t>(entry + 16);
  r.checksum = get_le<std::uint64_t>(entry + 24);
  check_entry(r, limits, name, "checkpoint entry", offset);
  return r;
}

IndexSnapshot decode_checkpoint(std::span<const std::byte> bytes, const Limits& limits,
                                const std::string& name) {
  const CheckpointHeader h = decode_checkpoint_header(bytes, limits, name);
  IndexSnapshot c;
  c.epoch = h.epoch;
  c.last_sequence = h.last_sequence;
  // A bit per slot and one sort of the keys: no node-based set.
  std::vector<bool> slot_used(limits.slot_count);
  std::vector<std::uint64_t> keys;
  keys.reserve(h.count);
  c.entries.reserve(h.count);
  for (std::uint64_t i = 0; i < h.count; ++i) {
    const Record r = decode_checkpoint_entry(bytes, i, limits, name);
    FERRY_FORMAT_EXPECT(!slot_used[r.slot], name, ": checkpoint entry at offset ",
                        checkpoint_entry_offset(i), " repeats slot ", r.slot);
    slot_used[r.slot] = true;
    keys.push_back(r.key);
    c.entries.push_back(r);
  }
  std::sort(keys.begin(), keys.end());
  const auto repeated = std::adjacent_find(keys.begin(), keys.end());
  FERRY_FORMAT_EXPECT(repeated == keys.end(), name, ": checkpoint repeats key ",
                      repeated == keys.end() ? 0 : *repeated);
  return c;
}

}  // namespace ferry::detail::kv
