// A fleet of writer processes on one namespace (KVStoreOptions::fleet_writers): each writer its
// own share of the slots, journal and checkpoint; everyone folds in the others' commits. Three
// writers and two readers as processes, one writer SIGKILLed at a random point: every visible
// block whole, every acknowledged put present, the killed writer's share taken over again.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kBlock = 4096;
constexpr unsigned kWriters = 3;
constexpr std::uint64_t kSlots = 3 * 128;  // 128 a share

KVStoreOptions fleet_options(unsigned writers = kWriters) {
  KVStoreOptions options;
  options.fleet_writers = writers;
  options.checkpoint_every = 40;  // shares checkpoint (new journals) under the others' folds
  return options;
}

KVStoreOptions reader_options() {
  KVStoreOptions options;
  options.read_only = true;
  return options;
}

KVStore open_fleet(const std::filesystem::path& root, unsigned writers = kWriters) {
  return KVStore::open(root, kv_namespace(), kSlots * kBlock, kBlock, fleet_options(writers));
}

int wait_child(pid_t child) {
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Writer `w`'s keys: its own, and every tenth one shared by all writers (same key, same bytes).
KVKey writer_key(unsigned w, std::uint64_t k) { return k % 10 == 0 ? 900000 + k : w * 100000 + k; }

TEST(KvFleet, WritersShareANamespaceEachInItsOwnShare) {
  TempDir dir;
  KVStore a = open_fleet(dir.path());
  KVStore b = open_fleet(dir.path());
  KVStore c = open_fleet(dir.path());
  EXPECT_THROW(open_fleet(dir.path()), std::runtime_error) << "a fourth writer of three shares";
  EXPECT_THROW(KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock),
               std::invalid_argument)
      << "a single writer on a fleet's namespace";
  ASSERT_TRUE(put_one(a, 1, kv_bytes(1, kBlock)).ok());
  ASSERT_TRUE(put_one(b, 2, kv_bytes(2, kBlock)).ok());
  EXPECT_EQ(put_one(c, 1, kv_bytes(1, kBlock)).status, KVStatus::already_present);
  std::vector<std::byte> out(kBlock);
  ASSERT_TRUE(get_one(c, 2, out).ok());  // another writer's block
  EXPECT_EQ(out, kv_bytes(2, kBlock));
  EXPECT_EQ(c.remove(std::vector<KVKey>{2})[0].status, KVStatus::unsupported);
  EXPECT_TRUE(b.remove(std::vector<KVKey>{2})[0].ok());
  EXPECT_EQ(a.lookup(std::vector<KVKey>{2}), 0u);
  KVStore reader =
      KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock, reader_options());
  EXPECT_EQ(reader.keys(), std::vector<KVKey>{1});
}

// A writer evicts only its own blocks: its capacity is its share, the others' blocks stay.
TEST(KvFleet, AWriterEvictsOnlyItsOwnBlocks) {
  TempDir dir;
  KVStore a = open_fleet(dir.path(), 2);
  KVStore b = open_fleet(dir.path(), 2);
  for (KVKey k = 1; k <= 100; ++k) ASSERT_TRUE(put_one(a, k, kv_bytes(k, kBlock)).ok());
  for (KVKey k = 1001; k <= 1000 + 3 * kSlots; ++k)
    ASSERT_TRUE(put_one(b, k, kv_bytes(k, kBlock)).ok());
  std::vector<KVKey> mine(100);
  for (KVKey k = 1; k <= 100; ++k) mine[k - 1] = k;
  EXPECT_EQ(b.lookup(mine), 100u);
  EXPECT_EQ(a.stats().blocks, 100u + kSlots / 2);
  std::vector<std::byte> out(kBlock);
  for (KVKey k : {KVKey{1}, KVKey{100}, KVKey{1000 + 3 * kSlots}}) {
    ASSERT_TRUE(get_one(a, k, out).ok()) << k;
    EXPECT_EQ(out, kv_bytes(k, kBlock));
  }
}

// A writer counts the writers whose journals it saw grow (itself included): they share the
// storage, each putting with its share of one writer's writes in flight; blocks stay whole.
TEST(KvFleet, WritersCountTheOthersWritingBesideThem) {
  TempDir dir;
  KVStore a = open_fleet(dir.path());
  KVStore b = open_fleet(dir.path());
  KVStore reader =
      KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock, reader_options());
  const std::vector<KVKey> keys_a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<KVKey> keys_b = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  const auto put_all = [](KVStore& store, const std::vector<KVKey>& keys) {
    for (KVKey k : keys) ASSERT_TRUE(put_one(store, k, kv_bytes(k, kBlock)).ok()) << k;
  };
  put_all(a, keys_a);
  EXPECT_EQ(a.stats().writers_active, 1u);  // b has written nothing
  put_all(b, keys_b);                       // b folds a's journal first: a writes
  EXPECT_EQ(b.stats().writers_active, 2u);
  EXPECT_EQ(a.stats().writers_active, 2u);
  EXPECT_EQ(reader.stats().writers_active, 2u);  // a reader counts the writers only
  KVStore alone = KVStore::open(dir.path() / "single", kv_namespace(), kSlots * kBlock, kBlock);
  EXPECT_EQ(alone.stats().writers_active, 1u);
  std::vector<std::byte> out(kBlock);
  for (KVKey k : {KVKey{1}, KVKey{9}, KVKey{11}, KVKey{19}}) {
    ASSERT_TRUE(get_one(reader, k, out).ok()) << k;
    EXPECT_EQ(out, kv_bytes(k, kBlock)) << k;
  }
}

// A writer counts as writing for 2 s after its journal was written, not after another process
// first noticed: one that wrote while the others were idle, and stopped, is not shared with.
TEST(KvFleet, AWriterThatStoppedBeforeTheOthersLookedIsNotCountedAsWriting) {
  TempDir dir;
  KVStore a = open_fleet(dir.path());
  KVStore b = open_fleet(dir.path());
  ASSERT_EQ(a.stats().writers_active, 1u);  // a has looked at b's share
  ASSERT_TRUE(put_one(b, 7, kv_bytes(7, kBlock)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  EXPECT_EQ(a.stats().writers_active, 1u);  // b wrote, 2.2 s ago
  EXPECT_EQ(a.lookup(std::vector<KVKey>{7}), 1u);
  ASSERT_TRUE(put_one(b, 8, kv_bytes(8, kBlock)).ok());
  EXPECT_EQ(a.stats().writers_active, 2u);  // b writes
}

// Exit codes: 0 fine, 1 wrong bytes, 2 an error, 3 never saw the end.
[[noreturn]] void follow(const std::filesystem::path& root, KVKey last_a, KVKey last_c) {
  try {
    KVStore store = KVStore::open(root, kv_namespace(), kSlots * kBlock, kBlock, reader_options());
    std::vector<std::byte> out(kBlock);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      const bool done = store.lookup(std::vector<KVKey>{last_a}) == 1 &&
                        store.lookup(std::vector<KVKey>{last_c}) == 1;
      for (KVKey k : store.keys()) {
        const KVResult r = get_one(store, k, out);
        if (r.ok() && out != kv_bytes(k, kBlock)) std::_Exit(1);
        if (!r.ok() && (r.status != KVStatus::missing || !r.message.empty())) std::_Exit(2);
      }
      if (done) std::_Exit(0);
    }
    std::_Exit(3);
  } catch (...) {
    std::_Exit(2);
  }
}

// Puts its keys one call at a time, telling the parent each acknowledged key through `fd`.
[[noreturn]] void write_share(const std::filesystem::path& root, unsigned w, std::uint64_t count,
                              int fd) {
  try {
    KVStore store = open_fleet(root);
    for (std::uint64_t k = 1; k <= count; ++k) {
      const KVKey key = writer_key(w, k);
      const KVResult r = put_one(store, key, kv_bytes(key, kBlock));
      if (!r.ok() && r.status != KVStatus::already_present) std::_Exit(2);
      if (::write(fd, &key, sizeof key) != sizeof key) std::_Exit(2);
    }
    std::_Exit(0);
  } catch (...) {
    std::_Exit(2);
  }
}

void fleet_trial(std::mt19937_64& random) {
  TempDir dir;
  { KVStore create = open_fleet(dir.path()); }  // created once, so every writer finds it
  constexpr std::uint64_t kPuts = 100;          // within a share: nothing is evicted
  std::vector<pid_t> readers;
  for (int i = 0; i < 2; ++i) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) follow(dir.path(), writer_key(0, kPuts - 1), writer_key(2, kPuts - 1));
    readers.push_back(child);
  }
  int pipes[kWriters][2];
  std::vector<pid_t> writers;
  for (unsigned w = 0; w < kWriters; ++w) {
    ASSERT_EQ(::pipe(pipes[w]), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) write_share(dir.path(), w, kPuts, pipes[w][1]);
    ::close(pipes[w][1]);
    writers.push_back(child);
  }
  std::this_thread::sleep_for(std::chrono::microseconds(random() % 300000));
  ::kill(writers[1], SIGKILL);
  std::set<KVKey> acknowledged;
  for (unsigned w = 0; w < kWriters; ++w) {
    KVKey key = 0;
    while (::read(pipes[w][0], &key, sizeof key) == sizeof key) acknowledged.insert(key);
    ::close(pipes[w][0]);
  }
  EXPECT_EQ(wait_child(writers[0]), 0);
  EXPECT_EQ(wait_child(writers[2]), 0);
  const int killed = wait_child(writers[1]);
  EXPECT_TRUE(killed == 128 + SIGKILL || killed == 0) << killed;
  for (pid_t r : readers) EXPECT_EQ(wait_child(r), 0) << "a reader (1 wrong bytes, 2 error)";

  // Every acknowledged put is there and whole, the killed writer's too.
  KVStore reader =
      KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock, reader_options());
  std::vector<std::byte> out(kBlock);
  for (KVKey key : acknowledged) {
    const KVResult r = get_one(reader, key, out);
    ASSERT_TRUE(r.ok()) << "acknowledged key " << key << ": " << r.message;
    ASSERT_EQ(out, kv_bytes(key, kBlock)) << key;
  }
  // A new writer takes the killed one's share, its journal and checkpoint.
  KVStore again = open_fleet(dir.path());
  for (std::uint64_t k = 1; k <= kPuts; ++k) {
    const KVKey key = writer_key(1, k);
    const KVResult r = put_one(again, key, kv_bytes(key, kBlock));
    ASSERT_TRUE(r.ok() || r.status == KVStatus::already_present) << r.message;
  }
  EXPECT_EQ(reader.lookup(std::vector<KVKey>{writer_key(1, kPuts - 1)}), 1u);
}

// CI runs one trial; tools/kv_crash_trials.sh runs many (FERRY_KV_FLEET_TRIALS).
TEST(KvFleet, ThreeWriterProcessesOneKilledReadersFollowAll) {
  const char* env = std::getenv("FERRY_KV_FLEET_TRIALS");
  const int trials = env ? std::max(1, std::atoi(env)) : 1;
  std::mt19937_64 random(std::random_device{}());
  for (int t = 0; t < trials && !::testing::Test::HasFailure(); ++t) {
    SCOPED_TRACE("trial " + std::to_string(t));
    fleet_trial(random);
  }
}

}  // namespace
}  // namespace ferry::test
