// libFuzzer target for the KV store's index files: the input is tried as a journal and as a
// checkpoint. Each either decodes into records that keep the reader's promises or is refused
// with a FormatError; anything else (another exception, a crash, a sanitizer report) is a bug.
// The first byte picks the store geometry, so small slot counts make valid records likely.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "kv/kv_format.hpp"

namespace kv = ferry::detail::kv;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const kv::Limits limits{1u + data[0] % 64u, 4096u * (1u + data[0] / 64u)};
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  try {
    kv::decode_journal_header(bytes, "journal");
    const auto scan = kv::scan_records(bytes, kv::kJournalHeaderSize, 0, limits, "journal");
    std::uint64_t previous = 0;
    for (const kv::Record& r : scan.records) {
      if (r.sequence <= previous || r.slot >= limits.slot_count) __builtin_trap();
      if (r.kind == kv::RecordKind::put && (r.length == 0 || r.length > limits.block_bytes))
        __builtin_trap();
      previous = r.sequence;
    }
    if (scan.valid_end + scan.torn_bytes != bytes.size()) __builtin_trap();
    if ((scan.valid_end - kv::kJournalHeaderSize) % kv::kRecordSize != 0) __builtin_trap();
  } catch (const ferry::FormatError&) {
  }
  try {
    const kv::IndexSnapshot snapshot = kv::decode_checkpoint(bytes, limits, "checkpoint");
    std::vector<bool> used(limits.slot_count);
    for (const kv::Record& r : snapshot.entries) {
      if (r.slot >= limits.slot_count || used[r.slot]) __builtin_trap();
      if (r.length == 0 || r.length > limits.block_bytes) __builtin_trap();
      used[r.slot] = true;
    }
    // What decodes re-encodes to the same bytes.
    if (kv::encode_checkpoint(snapshot, limits) !=
        std::vector<std::byte>(bytes.begin(), bytes.end()))
      __builtin_trap();
  } catch (const ferry::FormatError&) {
  }
  return 0;
}
