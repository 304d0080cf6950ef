// A KVStore's lifetime under misuse: close() beside calls in flight on other threads (every
// entry point), completion callbacks that close or destroy the store, ask their own ticket, or
// start more batches of the store and wait for them. Calls are held in flight by a latch in the
// store's test hook (kv/call_gate.hpp), never by sleeping.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "ferry/error.hpp"
#include "kv/call_gate.hpp"
#include "kv_test_support.hpp"
#include "test_latch.hpp"

namespace ferry::test {
namespace {

constexpr std::uint64_t kBlock = 4096;

KVStore open_store(const TempDir& dir) {
  return KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock);
}

bool refused_as_closed(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return std::string(e.what()).find("closed KV store") != std::string::npos;
  }
  return false;
}

// Holds the first call named `name` in flight (on its own thread) until released.
class HeldCall {
 public:
  explicit HeldCall(std::string name) : _name(std::move(name)) {
    detail::kv::set_call_hook_for_tests([this](std::string_view call) {
      if (call != _name || _taken.exchange(true)) return;
      _entered.count_down();
      _release.wait();
    });
  }
  ~HeldCall() { detail::kv::set_call_hook_for_tests(nullptr); }
  void wait_entered() { _entered.wait(); }
  void release() { _release.count_down(); }

 private:
  std::string _name;
  std::atomic<bool> _taken{false};
  Latch _entered{1}, _release{1};
};

struct EntryPoint {
  const char* name;
  std::function<void(KVStore&)> call;
};

std::vector<EntryPoint> entry_points() {
  static const std::vector<std::byte> bytes = kv_bytes(7, kBlock);
  const auto put = [](KVStore& s) { ASSERT_TRUE(put_one(s, 2, bytes).ok()); };
  return {
      {"put", put},
      {"get",
       [](KVStore& s) {
         std::vector<std::byte> out(kBlock);
         ASSERT_TRUE(get_one(s, 1, out).ok());
         ASSERT_EQ(out, kv_bytes(1, kBlock));
       }},
      {"put_async",
       [](KVStore& s) {
         KVBlockList list{{KVPiece{const_cast<std::byte*>(bytes.data()), kBlock}}};
         ASSERT_TRUE(s.put_async({2}, list).results().at(0).ok());
       }},
      {"get_async",
       [](KVStore& s) {
         std::vector<std::byte> out(kBlock);
         ASSERT_TRUE(s.get_async({1}, {{KVPiece{out.data(), kBlock}}}).results().at(0).ok());
       }},
      {"remove", [](KVStore& s) { ASSERT_TRUE(s.remove(std::vector<KVKey>{1}).at(0).ok()); }},
      {"lookup", [](KVStore& s) { ASSERT_EQ(s.lookup(std::vector<KVKey>{1}), 1u); }},
      {"contains", [](KVStore& s) { ASSERT_TRUE(s.contains(std::vector<KVKey>{1}).at(0)); }},
      {"stored_length", [](KVStore& s) { ASSERT_EQ(s.stored_length(1), kBlock); }},
      {"stats", [](KVStore& s) { ASSERT_EQ(s.stats().blocks, 1u); }},
      {"keys", [](KVStore& s) { ASSERT_EQ(s.keys().size(), 1u); }},
      {"checkpoint", [](KVStore& s) { s.checkpoint(); }},
      {"refresh", [](KVStore& s) { s.refresh(); }},
  };
}

// close() on one thread while another's call is inside the store: the call ends as if alone,
// close returns after it, and every later call is refused with "closed" (before: a use after
// free, SIGSEGV or "internal error: _slots[s].state == SlotState::writing").
TEST(KvLifetime, CloseWaitsForACallInFlightOnEveryEntryPointThenRefusesCalls) {
  for (const EntryPoint& entry : entry_points()) {
    SCOPED_TRACE(entry.name);
    TempDir dir;
    {
      auto store = open_store(dir);
      ASSERT_TRUE(put_one(store, 1, kv_bytes(1, kBlock)).ok());
      HeldCall held(entry.name);
      std::thread caller([&] { entry.call(store); });
      held.wait_entered();
      std::thread closer([&] { store.close(); });
      // The close has begun once a new call is refused; the held call is still inside.
      while (!refused_as_closed([&] { (void)store.lookup(std::vector<KVKey>{1}); }))
        std::this_thread::yield();
      held.release();
      caller.join();
      closer.join();
      for (const EntryPoint& later : entry_points())
        EXPECT_TRUE(refused_as_closed([&] { later.call(store); })) << later.name;
      store.close();  // again: nothing left to do
    }
    // What the held call did was committed and the writer lock released by close.
    auto again = open_store(dir);
    const bool put = std::string(entry.name).rfind("put", 0) == 0;
    EXPECT_EQ(again.contains(std::vector<KVKey>{2}).at(0), put);
    EXPECT_EQ(again.contains(std::vector<KVKey>{1}).at(0), std::string(entry.name) != "remove");
  }
}

// Destroying the store (not only closing it) while a call is in flight waits for that call too.
TEST(KvLifetime, DestroyingTheStoreWaitsForACallInFlight) {
  TempDir dir;
  std::optional<KVStore> store(open_store(dir));
  HeldCall held("put");
  std::thread caller([&] { EXPECT_TRUE(put_one(*store, 5, kv_bytes(5, kBlock)).ok()); });
  held.wait_entered();
  std::thread destroyer([&] { store.reset(); });
  held.release();
  caller.join();
  destroyer.join();
  EXPECT_EQ(open_store(dir).lookup(std::vector<KVKey>{5}), 1u);
}

// A completion callback that closes its own store: new calls are refused at once, the batch's
// result stands, and a close on the owner's thread then returns with the files released
// (before: "Resource deadlock avoided", abort).
TEST(KvLifetime, ACallbackClosingItsStoreIsRefusedNothingAndReleasesTheFiles) {
  TempDir dir;
  auto store = open_store(dir);
  const auto bytes = kv_bytes(3, kBlock);
  bool refused_inside = false;
  KVTicket t = store.put_async(
      {3}, {{KVPiece{const_cast<std::byte*>(bytes.data()), kBlock}}}, {},
      [&](const std::vector<KVResult>& r) {
        EXPECT_TRUE(r.at(0).ok());
        store.close();
        refused_inside = refused_as_closed([&] { (void)store.lookup(std::vector<KVKey>{3}); });
      });
  t.wait();
  EXPECT_TRUE(refused_inside);
  EXPECT_TRUE(t.results().at(0).ok());
  store.close();  // waits for the callback's close to finish
  EXPECT_EQ(open_store(dir).lookup(std::vector<KVKey>{3}), 1u);
}

// The store destroyed by its own completion callback (the last owner letting go there, as
// Python's last reference or ferry_kv_free): no thread joins itself; the rest is freed by the
// batch's thread, and the store opens again once it is.
TEST(KvLifetime, ACallbackDestroyingItsStoreDefersTheDestruction) {
  TempDir dir;
  auto owned = std::make_unique<KVStore>(open_store(dir));
  ASSERT_TRUE(put_one(*owned, 8, kv_bytes(8, kBlock)).ok());
  const auto bytes = kv_bytes(9, kBlock);
  KVStore* raw = owned.get();
  KVTicket t = raw->put_async({9}, {{KVPiece{const_cast<std::byte*>(bytes.data()), kBlock}}}, {},
                              [owned = std::shared_ptr<KVStore>(std::move(owned))](
                                  const std::vector<KVResult>&) mutable { owned.reset(); });
  t.wait();
  EXPECT_TRUE(t.results().at(0).ok());
  // The writer lock goes with the last batch's end, on its thread: open once it is free.
  std::optional<KVStore> again;
  while (!again) {
    try {
      again.emplace(open_store(dir));
    } catch (const std::system_error& e) {
      ASSERT_EQ(e.code(), std::errc::operation_would_block) << e.what();
      std::this_thread::yield();
    }
  }
  EXPECT_EQ(again->lookup(std::vector<KVKey>{8, 9}), 2u);
}

// Every ticket method from inside the ticket's own callback returns the final results (before:
// results() and wait() waited for the callback itself, forever).
TEST(KvLifetime, TicketMethodsInsideTheirOwnCallbackReturnTheFinalResults) {
  TempDir dir;
  auto store = open_store(dir);
  const auto bytes = kv_bytes(4, kBlock);
  std::vector<std::byte> out(kBlock);
  for (const bool is_put : {true, false}) {
    KVTicket ticket;
    Latch assigned(1);
    bool checked = false;
    const auto callback = [&](const std::vector<KVResult>& r) {
      assigned.wait();
      EXPECT_TRUE(ticket.ready());
      ticket.wait();
      EXPECT_TRUE(ticket.wait_for(0));
      ASSERT_EQ(ticket.results().size(), 1u);
      EXPECT_TRUE(ticket.results()[0].ok()) << ticket.results()[0].message;
      EXPECT_EQ(&ticket.results()[0], &r[0]);  // the very results handed to the callback
      checked = true;
    };
    if (is_put)
      ticket = store.put_async({4}, {{KVPiece{const_cast<std::byte*>(bytes.data()), kBlock}}}, {},
                               callback);
    else
      ticket = store.get_async({4}, {{KVPiece{out.data(), kBlock}}}, callback);
    assigned.count_down();
    ticket.wait();
    EXPECT_TRUE(checked);
  }
  EXPECT_EQ(out, bytes);
}

// Callbacks re-entering the store: sync calls, and new batches waited for from inside the
// callback while every worker thread of the store is busy in a callback (a worker that waits
// runs queued batches meanwhile; before, this would wait for itself).
TEST(KvLifetime, CallbacksStartAndAwaitMoreBatchesWhileEveryWorkerIsInACallback) {
  TempDir dir;
  auto store = open_store(dir);
  ASSERT_TRUE(put_one(store, 100, kv_bytes(100, kBlock)).ok());
  Latch both_inside(2);  // the store runs batches on two threads
  std::vector<std::vector<std::byte>> sources{kv_bytes(1, kBlock), kv_bytes(2, kBlock)};
  std::vector<std::vector<std::byte>> back(2, std::vector<std::byte>(kBlock));
  std::atomic<int> done{0};
  std::vector<KVTicket> outer;
  for (KVKey k : {1, 2}) {
    auto& src = sources[k - 1];
    outer.push_back(store.put_async(
        {k}, {{KVPiece{src.data(), kBlock}}}, {}, [&, k](const std::vector<KVResult>& r) {
          ASSERT_TRUE(r.at(0).ok());
          both_inside.arrive_and_wait();
          // Sync calls from a callback.
          std::vector<std::byte> got(kBlock);
          EXPECT_TRUE(get_one(store, 100, got).ok());
          EXPECT_EQ(store.lookup(std::vector<KVKey>{100}), 1u);
          auto copy = src;
          EXPECT_TRUE(put_one(store, k + 10, copy).ok());
          // A batch posted and awaited from a callback, both workers being in callbacks.
          KVTicket inner = store.get_async({k}, {{KVPiece{back[k - 1].data(), kBlock}}});
          EXPECT_TRUE(inner.results().at(0).ok());
          ++done;
        }));
  }
  for (auto& t : outer) t.wait();
  EXPECT_EQ(done.load(), 2);
  EXPECT_EQ(back, sources);
  EXPECT_EQ(store.lookup(std::vector<KVKey>{11, 12}), 2u);
}

// A FIFO, a directory or a device (a symlink to /dev/zero) in place of any file of a store:
// writers and readers refuse it, naming the file, instead of waiting on a FIFO's open forever
// or reading endless zeros.
TEST(KvLifetime, ANonRegularFileInPlaceOfAnyStoreFileIsRefusedByWritersAndReaders) {
  for (const char* name : {"manifest.json", "journal", "checkpoint", "slab-0.dat", "writer.lock"}) {
    for (const char* kind : {"fifo", "directory", "device"}) {
      for (const bool reader : {false, true}) {
        if (reader && std::string(name) == "writer.lock") continue;  // readers take no lock
        SCOPED_TRACE(std::string(name) + " as a " + kind + (reader ? ", reader" : ", writer"));
        TempDir dir;
        {
          auto store = open_store(dir);
          ASSERT_TRUE(put_one(store, 1, kv_bytes(1, kBlock)).ok());
        }  // closed with a checkpoint: every file exists
        const auto file = dir.path() / KVStore::directory_name(kv_namespace()) / name;
        std::filesystem::remove(file);
        if (std::string(kind) == "fifo")
          ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
        else if (std::string(kind) == "directory")
          std::filesystem::create_directory(file);
        else
          std::filesystem::create_symlink("/dev/zero", file);
        KVStoreOptions options;
        options.read_only = reader;
        try {
          (void)KVStore::open(dir.path(), kv_namespace(), 16 * kBlock, kBlock, options);
          ADD_FAILURE() << "opened";
        } catch (const std::exception& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(file.string()), std::string::npos) << what;
          EXPECT_TRUE(what.find("not a regular file") != std::string::npos ||
                      what.find("Is a directory") != std::string::npos)
              << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::test
