// The KV store's journal and checkpoint readers against one hand-made defect per class, the
// in-memory index against a plain map, and each build of the block checksum against xxHash's.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <unordered_map>

#include "ferry/error.hpp"
#include "kv/checksum.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

using namespace ferry::detail::kv;

const Limits kLimits{16, 4096};

std::vector<std::byte> journal_of(std::uint64_t epoch, const std::vector<Record>& records) {
  auto bytes = encode_journal_header(epoch);
  for (const Record& r : records) {
    bytes.resize(bytes.size() + kRecordSize);
    encode_record(r, bytes.data() + bytes.size() - kRecordSize);
  }
  return bytes;
}

Record put_record(std::uint64_t seq, std::uint64_t key, std::uint32_t slot) {
  return {RecordKind::put, seq, key, slot, 4096, 0x1234};
}

// Asserts `f` throws FormatError whose message contains `name` and `what`.
template <class F>
void expect_format_error(F&& f, const std::string& name, const std::string& what) {
  try {
    f();
    FAIL() << "no error; expected one about " << what;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// Every build of XXH3 this CPU runs (AVX2 where it has it) gives the library's digest, one-shot
// and streamed in uneven parts at odd addresses, over the sizes where XXH3 changes its code path
// (0-16, 17-128, 129-240 bytes, one stripe, one block of stripes) and larger.
TEST(KvChecksum, EveryBuildGivesTheLibrarysDigest) {
  const auto kernels = checksum_kernels();
  const ChecksumKernel& library = *kernels.back();
  EXPECT_EQ(checksum_kernel_name(library), "default");
  EXPECT_EQ(&checksum_kernel(), kernels.front());
  std::mt19937_64 random(13);
  std::vector<std::byte> bytes((3u << 20) + 64);
  for (auto& b : bytes) b = static_cast<std::byte>(random());
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (std::size_t n : {1023u, 1024u, 1025u, 4095u, 65536u, 262145u, 1u << 20, 3u << 20})
    sizes.push_back(n);
  for (const ChecksumKernel* kernel : kernels) {
    SCOPED_TRACE(std::string(checksum_kernel_name(*kernel)));
    for (std::size_t size : sizes) {
      const std::byte* data = bytes.data() + size % 61;  // unaligned too
      const std::uint64_t expected = checksum(data, size, library);
      ASSERT_EQ(checksum(data, size, *kernel), expected) << size << " bytes";
      StreamingHash streamed(*kernel);
      for (std::size_t at = 0; at < size;) {
        const std::size_t part = std::min<std::size_t>(size - at, 1 + random() % 70000);
        streamed.update(data + at, part);
        at += part;
      }
      ASSERT_EQ(streamed.bytes(), size);
      ASSERT_EQ(streamed.digest(), expected) << size << " bytes streamed";
    }
  }
}

TEST(KvJournal, GoodJournalScansWhole) {
  const auto bytes = journal_of(3, {put_record(1, 10, 0), put_record(2, 11, 1)});
  EXPECT_EQ(decode_journal_header(bytes, "j"), 3u);
  const auto scan = scan_records(bytes, kJournalHeaderSize, 0, kLimits, "j");
  ASSERT_EQ(scan.records.size(), 2u);
  EXPECT_EQ(scan.records[1].key, 11u);
  EXPECT_EQ(scan.torn_bytes, 0u);
}

TEST(KvJournal, TornTailIsIgnored) {
  auto bytes = journal_of(0, {put_record(1, 10, 0), put_record(2, 11, 1)});
  bytes.resize(bytes.size() - 20);
  const auto scan = scan_records(bytes, kJournalHeaderSize, 0, kLimits, "j");
  EXPECT_EQ(scan.records.size(), 1u);
  EXPECT_EQ(scan.valid_end, kJournalHeaderSize + kRecordSize);
  EXPECT_EQ(scan.torn_bytes, kRecordSize - 20);
}

TEST(KvJournal, BadLastRecordIsATornTail) {
  auto bytes = journal_of(0, {put_record(1, 10, 0), put_record(2, 11, 1), put_record(3, 12, 2)});
  bytes[kJournalHeaderSize + 2 * kRecordSize + 17] ^= std::byte{1};  // the third record's key
  const auto scan = scan_records(bytes, kJournalHeaderSize, 0, kLimits, "j");
  EXPECT_EQ(scan.records.size(), 2u);
  EXPECT_EQ(scan.torn_bytes, kRecordSize);
  EXPECT_EQ(scan.corrupt_records, 0u);
}

// A record failing its checksum with a valid later one is damage in the middle, not a torn
// tail: skipped and counted, the later records kept.
TEST(KvJournal, BadMiddleRecordIsSkippedAndTheLaterOnesKept) {
  auto bytes = journal_of(0, {put_record(1, 10, 0), put_record(2, 11, 1), put_record(3, 12, 2),
                              put_record(4, 13, 3), put_record(5, 14, 4)});
  bytes[kJournalHeaderSize + kRecordSize + 17] ^= std::byte{1};      // the second record's key
  bytes[kJournalHeaderSize + 2 * kRecordSize + 3] ^= std::byte{0x40};  // the third's magic
  const auto scan = scan_records(bytes, kJournalHeaderSize, 0, kLimits, "j");
  ASSERT_EQ(scan.records.size(), 3u);
  EXPECT_EQ(scan.records[0].key, 10u);
  EXPECT_EQ(scan.records[1].key, 13u);
  EXPECT_EQ(scan.records[2].key, 14u);
  EXPECT_EQ(scan.corrupt_records, 2u);
  EXPECT_EQ(scan.first_corrupt_offset, kJournalHeaderSize + kRecordSize);
  EXPECT_EQ(scan.valid_end, bytes.size());
  EXPECT_EQ(scan.torn_bytes, 0u);
}

// Only a later record with a higher sequence counts: an older one after garbage is a tail.
TEST(KvJournal, OlderRecordAfterABadOneIsStillATornTail) {
  auto bytes = journal_of(0, {put_record(5, 10, 0), put_record(6, 11, 1), put_record(2, 12, 2)});
  bytes[kJournalHeaderSize + kRecordSize + 17] ^= std::byte{1};
  const auto scan = scan_records(bytes, kJournalHeaderSize, 0, kLimits, "j");
  EXPECT_EQ(scan.records.size(), 1u);
  EXPECT_EQ(scan.corrupt_records, 0u);
  EXPECT_EQ(scan.torn_bytes, 2 * kRecordSize);
}

TEST(KvJournal, HeaderDefectsAreErrorsNamingTheFile) {
  auto good = journal_of(0, {});
  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  expect_format_error([&] { decode_journal_header(bad_magic, "/s/journal"); }, "/s/journal",
                      "bad magic");
  auto bad_version = encode_journal_header(0);
  bad_version[8] = std::byte{9};
  expect_format_error([&] { decode_journal_header(bad_version, "/s/journal"); }, "/s/journal",
                      "version 9");
  expect_format_error([&] { decode_journal_header(std::span(good).first(10), "/s/journal"); },
                      "/s/journal", "cut short");
  auto bad_sum = good;
  bad_sum[16] = std::byte{1};  // the epoch, without fixing the checksum
  expect_format_error([&] { decode_journal_header(bad_sum, "/s/journal"); }, "/s/journal",
                      "checksum");
}

TEST(KvJournal, ImpossibleRecordsAreErrorsNamingFileAndOffset) {
  expect_format_error(
      [&] {
        scan_records(journal_of(0, {put_record(1, 10, 16)}), kJournalHeaderSize, 0, kLimits,
                     "/s/journal");
      },
      "/s/journal", "slot 16 of 16");
  expect_format_error(
      [&] {
        scan_records(journal_of(0, {put_record(1, 10, 0), put_record(1, 11, 1)}),
                     kJournalHeaderSize, 0, kLimits, "/s/journal");
      },
      "/s/journal", "offset 88 has sequence 1, not above 1 (duplicate");
  expect_format_error(
      [&] {
        scan_records(journal_of(0, {put_record(5, 10, 0)}), kJournalHeaderSize, 7, kLimits,
                     "/s/journal");
      },
      "/s/journal", "not above 7");
  Record too_long = put_record(1, 10, 0);
  too_long.length = 4097;
  expect_format_error(
      [&] { scan_records(journal_of(0, {too_long}), kJournalHeaderSize, 0, kLimits, "/s/j"); },
      "/s/j", "length 4097");
  Record empty = put_record(1, 10, 0);
  empty.length = 0;
  expect_format_error(
      [&] { scan_records(journal_of(0, {empty}), kJournalHeaderSize, 0, kLimits, "/s/j"); }, "/s/j",
      "length 0");
  Record unknown = put_record(1, 10, 0);
  unknown.kind = static_cast<RecordKind>(7);
  expect_format_error(
      [&] { scan_records(journal_of(0, {unknown}), kJournalHeaderSize, 0, kLimits, "/s/j"); },
      "/s/j", "unknown kind 7");
}

IndexSnapshot sample_checkpoint() {
  IndexSnapshot c;
  c.epoch = 2;
  c.last_sequence = 40;
  c.entries = {put_record(0, 10, 3), put_record(0, 11, 5)};
  return c;
}

TEST(KvCheckpoint, RoundTrips) {
  const auto bytes = encode_checkpoint(sample_checkpoint(), kLimits);
  const IndexSnapshot c = decode_checkpoint(bytes, kLimits, "c");
  EXPECT_EQ(c.epoch, 2u);
  EXPECT_EQ(c.last_sequence, 40u);
  ASSERT_EQ(c.entries.size(), 2u);
  EXPECT_EQ(c.entries[1].slot, 5u);
  EXPECT_EQ(c.entries[1].checksum, 0x1234u);
}

TEST(KvCheckpoint, EachDefectIsAnErrorNamingTheFile) {
  const auto good = encode_checkpoint(sample_checkpoint(), kLimits);
  const std::string name = "/s/checkpoint";
  auto decode = [&](const std::vector<std::byte>& bytes) {
    return [&bytes, &name] { decode_checkpoint(bytes, kLimits, name); };
  };
  auto bad_magic = good;
  bad_magic[3] = std::byte{0};
  expect_format_error(decode(bad_magic), name, "bad magic");
  auto bad_version = good;
  bad_version[8] = std::byte{2};
  expect_format_error(decode(bad_version), name, "version 2");
  auto torn = good;
  torn.resize(torn.size() - 1);
  expect_format_error(decode(torn), name, "header says");
  auto short_file = std::vector<std::byte>(good.begin(), good.begin() + 20);
  expect_format_error(decode(short_file), name, "cut short");
  auto bad_entry = good;
  bad_entry[kCheckpointHeaderSize + 2] ^= std::byte{1};
  expect_format_error(decode(bad_entry), name, "entries checksum");
  auto bad_header = good;
  bad_header[24] ^= std::byte{1};
  expect_format_error(decode(bad_header), name, "header checksum");
  expect_format_error(
      [&] {
        decode_checkpoint(good, Limits{32, 4096}, name);
      },
      name, "but the store has 32");
  IndexSnapshot repeated_slot = sample_checkpoint();
  repeated_slot.entries[1].slot = 3;
  const auto rs = encode_checkpoint(repeated_slot, kLimits);
  expect_format_error(decode(rs), name, "repeats slot 3");
  IndexSnapshot repeated_key = sample_checkpoint();
  repeated_key.entries[1].key = 10;
  const auto rk = encode_checkpoint(repeated_key, kLimits);
  expect_format_error(decode(rk), name, "repeats key 10");
  IndexSnapshot out_of_range = sample_checkpoint();
  out_of_range.entries[0].slot = 99;
  const auto oor = encode_checkpoint(out_of_range, kLimits);
  expect_format_error(decode(oor), name, "slot 99 of 16");
}

// Through the store: corrupt files on disk give errors naming them, or clean recoveries.
class KvStoreFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    options.checkpoint_on_close = false;
    options.slab_count = 1;
    auto store = open();
    for (KVKey k = 1; k <= 4; ++k) ASSERT_TRUE(put_one(store, k, kv_bytes(k, 4096)).ok());
    directory = store.stats().directory;
  }
  KVStore open() { return KVStore::open(dir.path(), kv_namespace(), 16 * 4096, 4096, options); }
  std::vector<std::byte> read(const std::string& name) {
    std::ifstream in(directory / name, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    auto bytes = std::as_bytes(std::span(text));
    return {bytes.begin(), bytes.end()};
  }
  void write(const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream out(directory / name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  template <class Exception = FormatError>
  void expect_open_error(const std::string& file, const std::string& what) {
    try {
      open();
      FAIL() << "opened despite a bad " << file;
    } catch (const Exception& e) {
      EXPECT_NE(std::string(e.what()).find((directory / file).string()), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  TempDir dir;
  KVStoreOptions options;
  std::filesystem::path directory;
};

TEST_F(KvStoreFiles, TornJournalTailIsCutAndLaterCommitsSurvive) {
  auto journal = read("journal");
  journal.resize(journal.size() - 30);  // the fourth record torn
  write("journal", journal);
  {
    auto store = open();
    EXPECT_EQ(store.keys(), (std::vector<KVKey>{1, 2, 3}));
    EXPECT_EQ(store.stats().journal_tail_dropped, kRecordSize - 30);
    ASSERT_TRUE(put_one(store, 9, kv_bytes(9, 4096)).ok());  // appended after the cut
  }
  auto store = open();
  EXPECT_EQ(store.keys(), (std::vector<KVKey>{1, 2, 3, 9}));
  EXPECT_EQ(store.stats().journal_tail_dropped, 0u);
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(get_one(store, 9, out).ok());
  EXPECT_EQ(out, kv_bytes(9, 4096));
}

TEST_F(KvStoreFiles, BadJournalMagicNamesTheFile) {
  auto journal = read("journal");
  journal[1] = std::byte{'?'};
  write("journal", journal);
  expect_open_error("journal", "bad magic");
}

TEST_F(KvStoreFiles, JournalNewerThanCheckpointIsAnError) {
  write("journal", journal_of(5, {}));
  expect_open_error("journal", "newer than the checkpoint");
}

TEST_F(KvStoreFiles, StaleJournalAfterACheckpointIsReplaced) {
  const auto old_journal = read("journal");  // epoch 0, four records
  open().checkpoint();                       // checkpoint epoch 1 holds them
  write("journal", old_journal);             // as if the crash hit between the renames
  auto store = open();
  EXPECT_EQ(store.keys(), (std::vector<KVKey>{1, 2, 3, 4}));
  EXPECT_EQ(store.stats().journal_records, 0u);
}

TEST_F(KvStoreFiles, CorruptCheckpointNamesTheFile) {
  open().checkpoint();
  auto checkpoint = read("checkpoint");
  checkpoint[kCheckpointHeaderSize + 5] ^= std::byte{0x40};
  write("checkpoint", checkpoint);
  expect_open_error("checkpoint", "entries checksum");
}

// Reopen fills the index straight from the checkpoint's entries: a repeated slot or key there is
// still an error naming the file (checksums intact: written by a buggy writer, not torn).
TEST_F(KvStoreFiles, CheckpointRepeatingASlotOrAKeyNamesTheFile) {
  open().checkpoint();
  const Limits limits{16, 4096};
  const IndexSnapshot good = decode_checkpoint(read("checkpoint"), limits, "c");
  ASSERT_EQ(good.entries.size(), 4u);
  IndexSnapshot repeated_slot = good;
  repeated_slot.entries[2].slot = repeated_slot.entries[0].slot;
  write("checkpoint", encode_checkpoint(repeated_slot, limits));
  expect_open_error("checkpoint", "repeats slot " + std::to_string(good.entries[0].slot));
  IndexSnapshot repeated_key = good;
  repeated_key.entries[3].key = repeated_key.entries[1].key;
  write("checkpoint", encode_checkpoint(repeated_key, limits));
  expect_open_error("checkpoint", "repeats key " + std::to_string(good.entries[1].key));
  write("checkpoint", encode_checkpoint(good, limits));
  EXPECT_EQ(open().keys(), (std::vector<KVKey>{1, 2, 3, 4}));  // LRU order comes back
}

TEST_F(KvStoreFiles, ManifestThatIsNotJsonNamesTheFile) {
  const std::string text = "{ not json";
  write("manifest.json",
        std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                               reinterpret_cast<const std::byte*>(text.data()) + text.size()));
  expect_open_error("manifest.json", "not JSON");
}

TEST(KvIndex, PinnedSlotsAreNeverEvicted) {
  KvIndex index(3);
  std::optional<std::uint64_t> evicted;
  for (std::uint64_t key : {10, 11, 12}) {
    const std::uint32_t s = index.take_slot(evicted);
    ASSERT_NE(s, kNoSlot);
    EXPECT_FALSE(evicted);
    index.publish(s, key, 1, 0);
  }
  index.pin(index.find(10));  // the oldest, under read
  std::uint32_t s = index.take_slot(evicted);
  ASSERT_TRUE(evicted);
  EXPECT_EQ(*evicted, 11u);  // the next oldest instead
  index.release_writing(s);
  index.pin(index.find(12));
  EXPECT_EQ(index.take_slot(evicted), index.find(12) == kNoSlot ? kNoSlot : s);
  index.pin(s);
  // Removing a pinned block frees its slot only when the last pin goes.
  const std::uint32_t ten = index.find(10);
  EXPECT_TRUE(index.erase(10));
  EXPECT_EQ(index.slot(ten).state, SlotState::zombie);
  index.unpin(ten);
  EXPECT_EQ(index.slot(ten).state, SlotState::free);
}

TEST(KvIndex, AgreesWithAPlainMapUnderRandomOperations) {
  constexpr std::uint32_t kSlots = 500;
  KvIndex index(kSlots);
  std::unordered_map<std::uint64_t, std::uint32_t> reference;  // key -> slot
  std::mt19937_64 random(7);
  for (int step = 0; step < 200000; ++step) {
    const std::uint64_t key = random() % 2000 * 0x100000001ull;  // clustered hashes
    if (random() % 3 == 0) {
      EXPECT_EQ(index.erase(key), reference.erase(key) == 1);
    } else if (!reference.count(key)) {
      std::optional<std::uint64_t> evicted;
      const std::uint32_t s = index.take_slot(evicted);
      ASSERT_NE(s, kNoSlot);
      if (evicted) {
        ASSERT_EQ(reference.erase(*evicted), 1u);
      }
      index.publish(s, key, 1, key);
      reference[key] = s;
    }
    ASSERT_EQ(index.size(), reference.size());
  }
  for (std::uint64_t k = 0; k < 2000; ++k) {
    const std::uint64_t key = k * 0x100000001ull;
    const auto it = reference.find(key);
    ASSERT_EQ(index.find(key), it == reference.end() ? kNoSlot : it->second);
  }
  EXPECT_LE(index.memory_bytes() / kSlots, 64u);
}

}  // namespace
}  // namespace ferry::test
