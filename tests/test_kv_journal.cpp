// The KV store's journal and namespace under misuse and damage (issue 29's journal findings):
// a writer used in a fork()ed child, a duplicate key in a failing batch, a creation that runs
// out of space, a reader idle across checkpoints, a flipped bit in the middle of the journal,
// and a reader's checksum failure beside a writer that evicts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <system_error>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <set>
#include <thread>

#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kBlock = 4096;

int wait_child(pid_t child) {
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::filesystem::path namespace_dir(const std::filesystem::path& root) {
  return root / KVStore::directory_name(kv_namespace());
}

// Whether `call` throws an exception whose message mentions a fork()ed child.
template <class Call>
bool refused_as_fork(Call&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return std::strstr(e.what(), "fork()ed child") != nullptr;
  }
  return false;
}

// Finding 11: every call of a writer store in a fork()ed child is refused (none returns ok and
// is lost), and the child's destructor leaves the parent's files alone.
TEST(KvJournalFaults, WriterUsedInForkedChildIsRefusedAtEveryEntryPoint) {
  TempDir dir;
  KVStore store = KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock);
  ASSERT_TRUE(put_one(store, 7, kv_bytes(7, kBlock)).ok());
  store.put_async({8}, {{KVPiece{nullptr, 0}}}).wait();  // starts the worker threads
  const auto journal = namespace_dir(dir.path()) / "journal";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(30);
    const auto bytes = kv_bytes(1, kBlock);
    std::vector<std::byte> out(kBlock);
    KVKey key = 1;
    int failures = 0;
    failures += !refused_as_fork([&] { put_one(store, key, bytes); });
    failures += !refused_as_fork([&] { get_one(store, 7, out); });
    failures += !refused_as_fork([&] {
      store.put_async({key}, {{KVPiece{const_cast<std::byte*>(bytes.data()), kBlock}}});
    });
    failures += !refused_as_fork([&] { store.get_async({7}, {{KVPiece{out.data(), kBlock}}}); });
    failures += !refused_as_fork([&] { store.remove(std::span(&key, 1)); });
    failures += !refused_as_fork([&] { store.lookup(std::span(&key, 1)); });
    failures += !refused_as_fork([&] { store.contains(std::span(&key, 1)); });
    failures += !refused_as_fork([&] { store.stored_length(7); });
    failures += !refused_as_fork([&] { store.checkpoint(); });
    failures += !refused_as_fork([&] { store.keys(); });
    failures += !refused_as_fork([&] { store.stats(); });
    { KVStore gone = std::move(store); }  // no checkpoint, no join of the parent's threads
    std::_Exit(failures);
  }
  EXPECT_EQ(wait_child(child), 0) << "calls in the child that were not refused as a fork";
  EXPECT_FALSE(std::filesystem::exists(namespace_dir(dir.path()) / "checkpoint"))
      << "the child's destructor checkpointed the parent's store";
  ASSERT_TRUE(put_one(store, 2, kv_bytes(2, kBlock)).ok());
  { KVStore closed = std::move(store); }
  KVStore reopened = KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock);
  EXPECT_EQ(reopened.contains(std::vector<KVKey>{1, 2, 7}), (std::vector<bool>{false, true, true}));
}

// A reader needs nothing of its parent's but its files: it keeps working in a child, including
// its asynchronous forms, whose threads the parent started.
TEST(KvJournalFaults, ReaderWorksInForkedChild) {
  TempDir dir;
  KVStore writer = KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock);
  ASSERT_TRUE(put_one(writer, 7, kv_bytes(7, kBlock)).ok());
  KVStoreOptions options;
  options.read_only = true;
  KVStore reader = KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock, options);
  std::vector<std::byte> out(kBlock);
  ASSERT_TRUE(reader.get_async({7}, {{KVPiece{out.data(), kBlock}}}).results().at(0).ok());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(30);  // a hang (threads of the parent) ends the child
    std::vector<std::byte> mine(kBlock);
    const auto results = reader.get_async({7}, {{KVPiece{mine.data(), kBlock}}}).results();
    const bool ok = results.at(0).ok() && mine == kv_bytes(7, kBlock);
    { KVStore gone = std::move(reader); }
    std::_Exit(ok ? 0 : 1);
  }
  EXPECT_EQ(wait_child(child), 0);
}

// Runs `body` in a child process whose files may not grow past `limit` bytes (RLIMIT_FSIZE: a
// write or preallocation beyond it fails with EFBIG, as on a full disk); its exit code.
template <class Body>
int with_file_size_limit(std::uint64_t limit, Body&& body) {
  const pid_t child = ::fork();
  if (child != 0) return wait_child(child);
  ::alarm(60);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim {limit, limit};
  if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) std::_Exit(100);
  int code = 101;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
  }
  std::_Exit(code);
}

// Finding 17: put([k, k]) whose first copy fails (the journal cannot grow): the duplicate
// reports the same failure, never "already present" for a key that is not stored.
TEST(KvJournalFaults, DuplicateKeyInFailingBatchGetsTheFirstCopysOutcome) {
  TempDir dir;
  KVStoreOptions options;
  options.slab_count = 1;
  options.checkpoint_on_close = false;
  std::uint64_t journal_size = 0;
  {
    // One slot, at slab offset 0: every put evicts the last, and the journal grows past 4 KiB,
    // so a limit at its size lets the slot's write through and stops the journal's append.
    KVStore store = KVStore::open(dir.path(), kv_namespace(), kBlock, kBlock, options);
    for (KVKey k = 100; k < 180; ++k) ASSERT_TRUE(put_one(store, k, kv_bytes(k, kBlock)).ok());
    journal_size = std::filesystem::file_size(namespace_dir(dir.path()) / "journal");
    ASSERT_GT(journal_size, kBlock);
  }
  const int code = with_file_size_limit(journal_size, [&] {
    KVStore store = KVStore::open(dir.path(), kv_namespace(), kBlock, kBlock, options);
    const auto bytes = kv_bytes(42, kBlock);
    KVPiece piece{const_cast<std::byte*>(bytes.data()), kBlock};
    const std::vector<KVBlock> blocks{KVBlock(&piece, 1), KVBlock(&piece, 1)};
    const std::vector<KVKey> keys{42, 42};
    const auto results = store.put(keys, blocks);
    if (results[0].status != KVStatus::io_error) return 1;
    if (results[1].status != KVStatus::io_error || results[1].message != results[0].message)
      return 2;
    return store.lookup(std::span(keys).first(1)) == 0 ? 0 : 3;
  });
  EXPECT_EQ(code, 0);
  // And where the first copy is stored, the second is "already present".
  KVStore store = KVStore::open(dir.path(), kv_namespace(), kBlock, kBlock, options);
  const auto bytes = kv_bytes(43, kBlock);
  KVPiece piece{const_cast<std::byte*>(bytes.data()), kBlock};
  const std::vector<KVBlock> blocks{KVBlock(&piece, 1), KVBlock(&piece, 1)};
  const auto results = store.put(std::vector<KVKey>{43, 43}, blocks);
  EXPECT_EQ(results[0].status, KVStatus::ok);
  EXPECT_EQ(results[1].status, KVStatus::already_present);
}

// Finding 21: a creation that runs out of space leaves nothing behind; a later open with
// another capacity creates the store.
TEST(KvJournalFaults, CreationOutOfSpaceLeavesNothingBehind) {
  TempDir dir;
  const int code = with_file_size_limit(1 << 20, [&] {
    try {
      KVStore::open(dir.path(), kv_namespace(), 64 << 20, kBlock);
      return 1;  // it cannot fit
    } catch (const std::system_error& e) {
      if (std::strstr(e.what(), "preallocate") == nullptr) return 2;
    }
    KVStore store = KVStore::open(dir.path(), kv_namespace(), 256 << 10, kBlock);
    return put_one(store, 1, kv_bytes(1, kBlock)).ok() ? 0 : 3;
  });
  ASSERT_EQ(code, 0);
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.insert(entry.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{KVStore::directory_name(kv_namespace())});
  KVStore store = KVStore::open(dir.path(), kv_namespace(), 256 << 10, kBlock);
  EXPECT_EQ(store.lookup(std::vector<KVKey>{1}), 1u);
}

// An older ferry created in place: a manifest and slabs without journal or checkpoint are an
// unfinished creation, which a writer clears (nothing was ever committed there).
TEST(KvJournalFaults, UnfinishedCreationOfAnOlderFerryIsCleared) {
  TempDir dir;
  { KVStore store = KVStore::open(dir.path(), kv_namespace(), 64 * kBlock, kBlock); }
  const auto ns = namespace_dir(dir.path());
  std::filesystem::remove(ns / "journal");
  std::filesystem::remove(ns / "checkpoint");
  KVStore store = KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock);
  EXPECT_EQ(store.stats().capacity_blocks, 16u);
  EXPECT_TRUE(put_one(store, 1, kv_bytes(1, kBlock)).ok());
}

// A store with a commit keeps its manifest: another capacity is still refused.
TEST(KvJournalFaults, StoreWithCommitsKeepsItsCapacity) {
  TempDir dir;
  {
    KVStore store = KVStore::open(dir.path(), kv_namespace(), 64 * kBlock, kBlock);
    ASSERT_TRUE(put_one(store, 1, kv_bytes(1, kBlock)).ok());
  }
  EXPECT_THROW(KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock),
               std::invalid_argument);
}

KVStoreOptions reader_options() {
  KVStoreOptions options;
  options.read_only = true;
  return options;
}

// Finding 13: a reader idle across several checkpoints (each a new journal, whose inode number
// the file system may reuse) sees exactly the writer's blocks at its next call.
TEST(KvJournalFaults, ReaderIdleAcrossCheckpointsFollowsTheWriter) {
  TempDir dir;
  KVStoreOptions options;
  options.checkpoint_every = 1;  // a checkpoint (and a new journal) after every record
  KVStore writer = KVStore::open(dir.path(), kv_namespace(), 1000 * kBlock, kBlock, options);
  KVStore reader =
      KVStore::open(dir.path(), kv_namespace(), 1000 * kBlock, kBlock, reader_options());
  std::set<KVKey> live;
  KVKey key = 0;
  int stale = 0;
  for (int step = 0; step < 40; ++step) {
    for (int call = 0; call < 3; ++call) {  // three writer calls between reader calls
      ++key;
      if (key % 5 == 0) {
        const KVKey oldest = *live.begin();
        ASSERT_TRUE(writer.remove(std::span(&oldest, 1))[0].ok());
        live.erase(oldest);
      } else {
        ASSERT_TRUE(put_one(writer, key, kv_bytes(key, kBlock)).ok());
        live.insert(key);
      }
    }
    const auto seen = reader.keys();
    stale += std::set<KVKey>(seen.begin(), seen.end()) != live;
  }
  EXPECT_EQ(stale, 0) << "reader views that missed commits or listed removed blocks";
}

// A journal of `n` put records (keys 1..n), as after a crash (no checkpoint).
std::filesystem::path journal_of_puts(const std::filesystem::path& root, KVKey n) {
  KVStoreOptions options;
  options.checkpoint_on_close = false;
  KVStore store = KVStore::open(root, kv_namespace(), 64 * kBlock, kBlock, options);
  for (KVKey k = 1; k <= n; ++k) EXPECT_TRUE(put_one(store, k, kv_bytes(k, kBlock)).ok());
  return namespace_dir(root) / "journal";
}

void flip_bit(const std::filesystem::path& path, std::uint64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  file.read(&c, 1);
  c ^= 1;
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(&c, 1);
}

constexpr std::uint64_t kFourthRecord = 32 + 56 * 3;  // the journal's header is 32 bytes

// Finding 12: a flipped bit in a middle record loses that record only: readers and the next
// writer keep the later ones, the writer does not cut them, and stats say where the damage is.
TEST(KvJournalFaults, FlippedBitInMiddleRecordKeepsTheLaterRecords) {
  TempDir dir;
  const auto journal = journal_of_puts(dir.path(), 10);
  const auto size = std::filesystem::file_size(journal);
  flip_bit(journal, kFourthRecord + 17);  // record 4's key
  std::vector<bool> expected(10, true);
  expected[3] = false;
  std::vector<KVKey> keys(10);
  for (KVKey k = 1; k <= 10; ++k) keys[k - 1] = k;
  {
    KVStore reader =
        KVStore::open(dir.path(), kv_namespace(), 64 * kBlock, kBlock, reader_options());
    EXPECT_EQ(reader.contains(keys), expected);
    const KVStats stats = reader.stats();
    EXPECT_EQ(stats.journal_corrupt_records, 1u);
    EXPECT_EQ(stats.journal_corrupt_offset, kFourthRecord);
    EXPECT_EQ(stats.journal_tail_dropped, 0u);
  }
  {
    KVStoreOptions options;
    options.checkpoint_on_close = false;
    KVStore writer = KVStore::open(dir.path(), kv_namespace(), 64 * kBlock, kBlock, options);
    EXPECT_EQ(std::filesystem::file_size(journal), size) << "the writer cut committed records";
    EXPECT_EQ(writer.contains(keys), expected);
    EXPECT_EQ(writer.stats().journal_corrupt_records, 1u);
    ASSERT_TRUE(put_one(writer, 11, kv_bytes(11, kBlock)).ok());
  }
  KVStore reopened = KVStore::open(dir.path(), kv_namespace(), 64 * kBlock, kBlock);
  keys.push_back(11);
  expected.push_back(true);
  EXPECT_EQ(reopened.contains(keys), expected);
  std::vector<std::byte> out(kBlock);
  for (KVKey k : {KVKey{5}, KVKey{10}, KVKey{11}}) {
    ASSERT_TRUE(get_one(reopened, k, out).ok());
    EXPECT_EQ(out, kv_bytes(k, kBlock));
  }
}

// A record cut short at the end is still a torn tail: ignored, counted, cut by the writer.
TEST(KvJournalFaults, TornTailIsNotCorruption) {
  TempDir dir;
  const auto journal = journal_of_puts(dir.path(), 5);
  std::filesystem::resize_file(journal, std::filesystem::file_size(journal) - 20);
  KVStore writer = KVStore::open(dir.path(), kv_namespace(), 64 * kBlock, kBlock);
  EXPECT_EQ(writer.lookup(std::vector<KVKey>{1, 2, 3, 4, 5}), 4u);
  EXPECT_EQ(writer.stats().journal_corrupt_records, 0u);
  EXPECT_EQ(writer.stats().journal_tail_dropped, 56u - 20u);
}

// `ferry kv verify` reports a damaged journal and exits non-zero.
TEST(KvJournalFaults, VerifyReportsAFlippedBitInTheJournal) {
  TempDir dir;
  const auto journal = journal_of_puts(dir.path(), 10);
  const std::string command = std::string(FERRY_CLI) + " kv verify " + dir.path().string();
  EXPECT_EQ(std::system((command + " > /dev/null").c_str()), 0);
  flip_bit(journal, kFourthRecord + 17);
  const std::string out_path = (dir.path() / "verify.txt").string();
  const int status = std::system((command + " > " + out_path + " 2>&1").c_str());
  EXPECT_NE(status, 0);
  std::ifstream in(out_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("fail their checksum in the middle (the first at offset 200)"),
            std::string::npos)
      << text;
}

// Finding 14: a reader reading every block beside a writer that evicts on every put never takes
// a block the writer replaced for a corrupt one (a miss without a message, as verify counts).
TEST(KvJournalFaults, ReaderBesideEvictingWriterReportsNoFalseCorruption) {
  TempDir dir;
  constexpr std::uint64_t kSlots = 32;
  KVStore writer = KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock);
  std::atomic<bool> stop{false};
  std::atomic<KVKey> written{0};
  std::thread writing([&] {
    KVKey k = 1;
    while (!stop) {  // 32 slots: every put evicts
      std::vector<std::vector<std::byte>> bytes;
      std::vector<KVPiece> pieces;
      std::vector<KVKey> keys;
      for (int j = 0; j < 8; ++j, ++k) {
        keys.push_back(k);
        bytes.push_back(kv_bytes(k, kBlock));
      }
      for (auto& b : bytes) pieces.push_back({b.data(), kBlock});
      std::vector<KVBlock> blocks;
      for (auto& p : pieces) blocks.emplace_back(&p, 1);
      writer.put(keys, blocks);
      written = k;
    }
  });
  KVStore reader =
      KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock, reader_options());
  std::uint64_t hits = 0, false_alarms = 0, wrong = 0;
  std::string example;
  std::vector<std::byte> out(kBlock);
  while (written < 1500) {
    for (KVKey k : reader.keys()) {
      const KVResult r = get_one(reader, k, out);
      if (r.ok()) {
        ++hits;
        wrong += out != kv_bytes(k, kBlock);
      } else if (!r.message.empty()) {
        ++false_alarms;
        example = r.message;
      }
    }
  }
  stop = true;
  writing.join();
  EXPECT_EQ(false_alarms, 0u) << example;
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(hits, 0u);
}

}  // namespace
}  // namespace ferry::test
