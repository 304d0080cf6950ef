// Processes sharing a root: two namespaces written at once, and one writer with four readers
// on one namespace under load (readers pick up commits, never see wrong bytes).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kBlock = 16384;

int wait_child(pid_t child) {
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(KvSharing, TwoProcessesWithDifferentNamespacesOnOneRoot) {
  TempDir dir;
  std::vector<pid_t> children;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        auto store = KVStore::open(dir.path(), kv_namespace("m", rank), 64 * kBlock, kBlock);
        for (KVKey k = 0; k < 50; ++k)
          if (!put_one(store, k, kv_bytes(k + 1000 * rank, kBlock)).ok()) std::_Exit(1);
      } catch (...) {
        std::_Exit(2);
      }
      std::_Exit(0);
    }
    children.push_back(child);
  }
  for (pid_t c : children) ASSERT_EQ(wait_child(c), 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto store = KVStore::open(dir.path(), kv_namespace("m", rank), 64 * kBlock, kBlock);
    ASSERT_EQ(store.stats().blocks, 50u);
    std::vector<std::byte> out(kBlock);
    for (KVKey k = 0; k < 50; ++k) {
      ASSERT_TRUE(get_one(store, k, out).ok());
      ASSERT_EQ(out, kv_bytes(k + 1000 * rank, kBlock)) << "rank " << rank << " key " << k;
    }
  }
}

// Readers loop over lookups and gets until they see the writer's last key; every hit must be
// bit-exact. Exit codes: 0 fine, 1 wrong bytes, 2 error, 3 never saw the end.
[[noreturn]] void reader(const std::filesystem::path& root, KVKey last) {
  try {
    KVStoreOptions options;
    options.read_only = true;
    std::optional<KVStore> store;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!store) {  // the writer may not have created it yet
      try {
        store.emplace(KVStore::open(root, kv_namespace(), 128 * kBlock, kBlock, options));
      } catch (const std::exception&) {
        if (std::chrono::steady_clock::now() > deadline) std::_Exit(3);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    std::vector<std::byte> out(kBlock);
    std::uint64_t hits = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      const bool done = store->lookup(std::vector<KVKey>{last}) == 1;
      for (KVKey k : store->keys()) {
        const KVResult r = get_one(*store, k, out);
        if (r.ok()) {
          ++hits;
          if (out != kv_bytes(k, kBlock)) std::_Exit(1);
        } else if (r.status != KVStatus::missing) {
          std::_Exit(2);
        }
      }
      if (done) std::_Exit(hits > 0 ? 0 : 3);
    }
    std::_Exit(3);
  } catch (...) {
    std::_Exit(2);
  }
}

TEST(KvSharing, OneWriterAndFourReadersOnOneNamespace) {
  TempDir dir;
  constexpr KVKey kLast = 1500;
  KVStoreOptions options;
  options.checkpoint_every = 100;  // readers must follow journal swaps too
  std::vector<pid_t> readers;
  for (int i = 0; i < 4; ++i) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) reader(dir.path(), kLast);
    readers.push_back(child);
  }
  {
    // 128 slots for 1,500 blocks: slots are reused under the readers' feet.
    auto store = KVStore::open(dir.path(), kv_namespace(), 128 * kBlock, kBlock, options);
    for (KVKey k = 1; k <= kLast; ++k) ASSERT_TRUE(put_one(store, k, kv_bytes(k, kBlock)).ok());
    EXPECT_GE(store.stats().checkpoints, 10u);
    for (pid_t r : readers) EXPECT_EQ(wait_child(r), 0);
  }
}

}  // namespace
}  // namespace ferry::test
