// The KV store's index files: an append-only journal and a checkpoint (a snapshot of the index).
// All integers little-endian.
//
// journal:     header (32 bytes)  "FERRYKVJ" | u32 version=1 | u32 header_size=32 | u64 epoch
//                                 | u64 xxh3 of the 24 bytes before
//              records (56 bytes) u32 magic "KVR1" | u16 kind (1 put, 2 remove) | u16 size=56
//                                 | u64 sequence | u64 key | u32 slot | u32 zero | u64 length
//                                 | u64 data xxh3 | u64 xxh3 of the 48 bytes before
// checkpoint:  header (64 bytes)  "FERRYKVC" | u32 version=1 | u32 header_size=64 | u64 epoch
//                                 | u64 last sequence | u64 count | u64 slot count
//                                 | u64 block bytes | u64 xxh3 of the 56 bytes before
//              entries (32 bytes, oldest use first) u64 key | u32 slot | u32 zero | u64 length
//                                 | u64 data xxh3
//              trailer            u64 xxh3 of the entries
//
// A journal record carries its own size and checksum: a record that is cut short or fails its
// checksum ends the journal (a torn tail from a crash, ignored) unless a valid record with a
// higher sequence follows it on the record grid: then it is damage in the middle (a flipped
// bit), skipped and counted, and the later records stand. A record whose checksum holds
// but whose content is impossible (slot out of range, sequence not increasing...) is corruption
// of another kind and an error naming the file. The epoch ties a journal to the checkpoint it
// follows: a checkpoint of epoch E+1 is written before the journal of epoch E+1 replaces the old.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ferry::detail::kv {

inline constexpr std::size_t kJournalHeaderSize = 32;
inline constexpr std::size_t kRecordSize = 56;
inline constexpr std::size_t kCheckpointHeaderSize = 64;
inline constexpr std::size_t kEntrySize = 32;
inline constexpr std::uint32_t kFormatVersion = 1;

enum class RecordKind : std::uint16_t { put = 1, remove = 2 };

struct Record {
  RecordKind kind = RecordKind::put;
  std::uint64_t sequence = 0;
  std::uint64_t key = 0;
  std::uint32_t slot = 0;
  std::uint64_t length = 0;
  std::uint64_t checksum = 0;
};

// What a store's geometry allows; records and entries outside it are corrupt.
struct Limits {
  std::uint64_t slot_count = 0;
  std::uint64_t block_bytes = 0;
};

std::vector<std::byte> encode_journal_header(std::uint64_t epoch);
void encode_record(const Record& record, std::byte* out);  // kRecordSize bytes

// The journal's epoch; throws FormatError naming `name` for a bad header.
std::uint64_t decode_journal_header(std::span<const std::byte> bytes, const std::string& name);

// One record at the start of `bytes`, or nullopt where it is cut short or fails its checksum.
std::optional<Record> decode_record(std::span<const std::byte> bytes);

struct JournalScan {
  std::vector<Record> records;
  std::uint64_t valid_end = 0;     // offset just past the last good record
  std::uint64_t torn_bytes = 0;    // bytes after it (a torn tail)
  std::uint64_t corrupt_records = 0;       // records skipped in the middle (failing checksums)
  std::uint64_t first_corrupt_offset = 0;  // where the first of them starts
};

// Records from `offset` on (after the header), each checked against `limits` and required to
// have a sequence above `previous_sequence` and the one before it. Stops at a torn tail, skips
// (and counts) records that fail their checksum where valid ones follow; throws FormatError
// naming `name` and the offset for impossible content.
JournalScan scan_records(std::span<const std::byte> journal, std::uint64_t offset,
                         std::uint64_t previous_sequence, const Limits& limits,
                         const std::string& name);

struct IndexSnapshot {
  std::uint64_t epoch = 0;
  std::uint64_t last_sequence = 0;
  std::vector<Record> entries;  // kind put; sequence unused
};

std::vector<std::byte> encode_checkpoint(const IndexSnapshot& checkpoint, const Limits& limits);

// A checkpoint's header, checked with its size and the checksum of its entries; the entries are
// then read one at a time (decode_checkpoint_entry), with no allocation per entry: a store of
// 10 million blocks reopens by filling its index straight from the file's bytes.
struct CheckpointHeader {
  std::uint64_t epoch = 0;
  std::uint64_t last_sequence = 0;
  std::uint64_t count = 0;
};
CheckpointHeader decode_checkpoint_header(std::span<const std::byte> bytes, const Limits& limits,
                                          const std::string& name);
// Entry `i` (< header.count), checked against `limits`.
Record decode_checkpoint_entry(std::span<const std::byte> bytes, std::uint64_t i,
                               const Limits& limits, const std::string& name);
// Byte offset of entry `i`, for messages.
inline std::uint64_t checkpoint_entry_offset(std::uint64_t i) {
  return kCheckpointHeaderSize + i * kEntrySize;
}
// Throws FormatError naming `name` for any defect: a checkpoint is written whole (temp file,
// fsync, rename), so unlike the journal's tail nothing in it may be torn.
IndexSnapshot decode_checkpoint(std::span<const std::byte> bytes, const Limits& limits,
                             const std::string& name);

}  // namespace ferry::detail::kv
