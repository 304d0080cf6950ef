// Crash consistency: a writer child is killed with SIGKILL at a random point; after reopening,
// every visible key is bit-exact (none fails its checksum), and every put the child saw
// acknowledged (and not evicted since) is present. CI runs FERRY_KV_CRASH_TRIALS (default 50)
// trials; tools/kv_crash_trials.sh runs 1,000 or more.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "kv_test_support.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kBlock = 8192;
constexpr std::uint64_t kSlots = 64;

KVStoreOptions crash_options() {
  KVStoreOptions options;
  options.checkpoint_every = 13;  // checkpoints (and journal swaps) happen often
  options.checkpoint_on_close = false;
  options.slab_count = 3;
  return options;
}

std::size_t block_size(KVKey key) { return 1 + key * 2654435761u % kBlock; }

// How the child feeds its puts: fresh buffers per batch; one buffer of two pieces per block,
// refilled with the next batch's bytes right after each put returns (a source the caller reuses
// at once, as an engine's KV pages are); the same through put_async, refilled after wait().
enum class Feed { fresh, refilled, refilled_async };

// The child: batches of 1..8 new keys, forever; each acknowledged key goes down the pipe.
[[noreturn]] void writer(const std::filesystem::path& root, int pipe_out, std::uint64_t seed,
                         Feed feed) {
  try {
    auto store = KVStore::open(root, kv_namespace(), kSlots * kBlock, kBlock, crash_options());
    std::mt19937_64 random(seed);
    std::vector<std::vector<std::byte>> reused(8, std::vector<std::byte>(kBlock));
    for (KVKey next = seed * 1000000;;) {
      const std::size_t n = 1 + random() % 8;
      std::vector<KVKey> keys;
      std::vector<std::vector<std::byte>> fresh;
      KVBlockList blocks;
      for (std::size_t i = 0; i < n; ++i) {
        keys.push_back(next++);
        const std::vector<std::byte> bytes = kv_bytes(keys.back(), block_size(keys.back()));
        if (feed == Feed::fresh) {
          fresh.push_back(bytes);
          blocks.push_back({{fresh.back().data(), bytes.size()}});
        } else {  // two pieces of one reused buffer, overwritten with this batch's bytes
          std::memcpy(reused[i].data(), bytes.data(), bytes.size());
          const std::size_t half = bytes.size() / 2;
          blocks.push_back(
              {{reused[i].data(), half}, {reused[i].data() + half, bytes.size() - half}});
        }
      }
      std::vector<KVResult> results;
      if (feed == Feed::refilled_async) {
        KVTicket ticket = store.put_async(keys, blocks);
        ticket.wait();
        results = ticket.results();
      } else {
        std::vector<KVBlock> views(blocks.begin(), blocks.end());
        results = store.put(keys, views);
      }
      for (std::size_t i = 0; i < n; ++i) {
        if (!results[i].ok()) std::_Exit(3);
        if (::write(pipe_out, &keys[i], sizeof keys[i]) != sizeof keys[i]) std::_Exit(4);
      }
      // The source is refilled at once (garbage here; the next batch's bytes next round).
      if (feed != Feed::fresh)
        for (auto& r : reused) std::memset(r.data(), static_cast<int>(random() & 0xff), r.size());
    }
  } catch (...) {
    std::_Exit(2);
  }
}

// Adds to `acknowledged_total` and `checked_total`, so the caller can tell that trials did work.
void run_trial(std::uint64_t trial, Feed feed, std::uint64_t& acknowledged_total,
               std::uint64_t& checked_total) {
  TempDir dir;
  std::mt19937_64 random(trial * 7 + 1);
  // Some trials start from a store that already has blocks and a checkpoint.
  for (int round = 0; round < 2; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const std::uint64_t seed = trial * 10 + round + 1;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(fds[0]);
      writer(dir.path(), fds[1], seed, feed);
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 120000));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer child failed by itself, exit "
                                     << WEXITSTATUS(status);
    std::vector<KVKey> acknowledged;
    KVKey key;
    while (::read(fds[0], &key, sizeof key) == sizeof key) acknowledged.push_back(key);
    ::close(fds[0]);
    acknowledged_total += acknowledged.size();
    if (!std::filesystem::exists(dir.path() / KVStore::directory_name(kv_namespace())))
      continue;  // killed before it created anything
    KVStore store = [&] {
      // The store may not exist yet if the child died before its manifest was renamed in.
      return KVStore::open(dir.path(), kv_namespace(), kSlots * kBlock, kBlock, crash_options());
    }();
    for (KVKey k : store.keys()) {
      std::vector<std::byte> out(store.stored_length(k));
      ASSERT_EQ(out.size(), block_size(k)) << "trial " << trial << " key " << k;
      const KVResult r = get_one(store, k, out);
      ++checked_total;
      // Every visible block is whole: a slot is reused only after its old key's removal is in
      // the journal, a block's record only after its bytes were written.
      ASSERT_TRUE(r.ok()) << "trial " << trial << " key " << k << ": " << r.message;
      ASSERT_EQ(out, kv_bytes(k, out.size())) << "trial " << trial << " key " << k;
    }
    // LRU with no reads: the newest kSlots puts of this round are kept; each acknowledged one
    // must be there (earlier ones may have been evicted by later, unacknowledged puts).
    const std::size_t keep = acknowledged.size() > kSlots - 8 ? kSlots - 8 : acknowledged.size();
    for (std::size_t i = acknowledged.size() - keep; i < acknowledged.size(); ++i)
      ASSERT_EQ(store.stored_length(acknowledged[i]), block_size(acknowledged[i]))
          << "trial " << trial << ": acknowledged key " << acknowledged[i] << " lost";
  }
}

void run_trials(Feed feed, std::uint64_t default_trials) {
  const char* env = std::getenv("FERRY_KV_CRASH_TRIALS");
  const std::uint64_t trials = env ? std::strtoull(env, nullptr, 10) : default_trials;
  const char* first_env = std::getenv("FERRY_KV_CRASH_FIRST");
  const std::uint64_t first = first_env ? std::strtoull(first_env, nullptr, 10) : 0;
  std::uint64_t acknowledged = 0, checked = 0;
  for (std::uint64_t t = first; t < first + trials; ++t) {
    ASSERT_NO_FATAL_FAILURE(run_trial(t, feed, acknowledged, checked));
  }
  std::printf("%llu trials: %llu puts acknowledged, %llu blocks checked after the kills\n",
              static_cast<unsigned long long>(trials), static_cast<unsigned long long>(acknowledged),
              static_cast<unsigned long long>(checked));
  EXPECT_GT(acknowledged, 0u);  // the kills did not all land before the first commit
  EXPECT_GT(checked, 0u);
}

TEST(KvCrash, KilledWriterLeavesEveryVisibleBlockBitExact) { run_trials(Feed::fresh, 50); }

TEST(KvCrash, RefilledSourceAfterEachPutReturns) { run_trials(Feed::refilled, 25); }

TEST(KvCrash, RefilledSourceAfterEachAsyncPut) { run_trials(Feed::refilled_async, 25); }

}  // namespace
}  // namespace ferry::test
