// Every C entry point that takes a growable struct (options in, statistics out), called with
// every struct_size from 0 to past this library's struct: sizes smaller than the struct_size field
// itself, 0 and larger than known are refused; the others work, reading and writing nothing past
// struct_size (the host's struct may end there) and taking no field in part. Under ASan the
// host's struct is an allocation of exactly struct_size bytes, so one byte read or written past
// it fails the test; elsewhere the bytes past it are garbage (read) or a canary (written).
// Also: batch calls of the expert cache that are refused change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "test_support.hpp"

namespace {

using ferry::test::TempDir;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kExactAllocations = true;
#else
constexpr bool kExactAllocations = false;
#endif
constexpr unsigned char kGarbage = 0xAB;

// A host's struct of `size` bytes whose first bytes are `full`'s, then garbage the library must
// not read (or, under ASan, the end of the allocation).
template <class Struct>
class HostStruct {
 public:
  HostStruct(const Struct& full, std::size_t size) {
    constexpr std::size_t header = sizeof(full.struct_size);
    const std::size_t held = std::min(std::max(size, header), sizeof(Struct));
    const std::size_t capacity = kExactAllocations ? held : sizeof(Struct) + 64;
    _bytes.reset(new unsigned char[capacity]);
    _capacity = capacity;
    std::memset(_bytes.get(), kGarbage, capacity);
    std::memcpy(_bytes.get(), &full, held);
    // struct_size as the host set it (the field is always there: ferry must read it).
    const auto value = static_cast<decltype(full.struct_size)>(size);
    std::memcpy(_bytes.get(), &value, header);
    _held = held;
  }
  Struct* get() { return reinterpret_cast<Struct*>(_bytes.get()); }
  // Whether the bytes past the host's struct still hold the garbage they started with.
  bool untouched_past_end() const {
    for (std::size_t i = _held; i < _capacity; ++i)
      if (_bytes[i] != kGarbage) return false;
    return true;
  }

 private:
  std::unique_ptr<unsigned char[]> _bytes;
  std::size_t _capacity = 0, _held = 0;
};

// The status a call must give for `size`, where the struct works from `works_from` bytes on.
template <class Struct>
ferry_status expected(std::size_t size, std::size_t works_from) {
  const bool holds = size >= sizeof(Struct::struct_size) && size <= sizeof(Struct);
  return holds && size >= works_from ? FERRY_STATUS_OK : FERRY_STATUS_INVALID_ARGUMENT;
}

// Calls `call` with a host struct of every size from 0 to past this library's struct.
template <class Struct>
void every_size(const char* entry_point, const Struct& full, std::size_t works_from,
                const std::function<ferry_status(Struct*)>& call) {
  for (std::size_t size = 0; size <= sizeof(Struct) + 9; ++size) {
    SCOPED_TRACE(std::string(entry_point) + " with struct_size " + std::to_string(size));
    HostStruct<Struct> host(full, size);
    const ferry_status status = call(host.get());
    ASSERT_EQ(status, expected<Struct>(size, works_from)) << ferry_last_error();
    if (size < sizeof(Struct::struct_size) || size > sizeof(Struct)) {
      EXPECT_NE(std::string(ferry_last_error()).find("struct_size"), std::string::npos)
          << ferry_last_error();
    }
    EXPECT_TRUE(host.untouched_past_end());
  }
}

std::size_t end_of(std::size_t offset, std::size_t size) { return offset + size; }
#define END_OF(Struct, field) end_of(offsetof(Struct, field), sizeof(Struct::field))

class CApiSized : public ::testing::Test {
 protected:
  void SetUp() override {
    ferry::test::write_random_checkpoint(path(),
                                         {{"model.layers.0.w", ferry::DType::F32, {64}},
                                          {"model.layers.1.w", ferry::DType::F32, {64}}},
                                         5);
    ASSERT_EQ(ferry_checkpoint_open(path().c_str(), &checkpoint), FERRY_STATUS_OK)
        << ferry_last_error();
  }
  void TearDown() override { ferry_checkpoint_free(checkpoint); }
  std::string path() const { return (dir / "m.safetensors").string(); }

  TempDir dir;
  ferry_checkpoint* checkpoint = nullptr;
  ferry_stream_tensor tensors[3] = {{64, nullptr, 0, 0}, {64, nullptr, 0, 0}, {64, nullptr, 0, 0}};
  size_t counts[3] = {1, 1, 1};
};

TEST_F(CApiSized, LoadOptionsOfEverySize) {
  ferry_load_options full;
  ferry_load_options_init(&full);
  full.io_mode = FERRY_IO_MODE_BUFFERED;
  every_size<ferry_load_options>(
      "ferry_checkpoint_load", full, sizeof(full.struct_size), [&](ferry_load_options* o) {
        ferry_loaded* loaded = nullptr;
        const ferry_status s = ferry_checkpoint_load(checkpoint, o, &loaded);
        ferry_loaded_free(loaded);
        return s;
      });
}

TEST_F(CApiSized, LoadStatsOfEverySize) {
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, nullptr, &loaded), FERRY_STATUS_OK);
  ferry_load_stats full{};
  every_size<ferry_load_stats>("ferry_loaded_stats", full, 0, [&](ferry_load_stats* out) {
    const ferry_status s = ferry_loaded_stats(loaded, out);
    if (s == FERRY_STATUS_OK && out->struct_size >= END_OF(ferry_load_stats, tensor_bytes)) {
      EXPECT_EQ(out->tensor_bytes, 512u);
    }
    return s;
  });
  ferry_loaded_free(loaded);
}

TEST_F(CApiSized, TransferOptionsOfEverySize) {
  ferry_file_set* set = nullptr;
  ASSERT_EQ(ferry_file_set_create(0, &set), FERRY_STATUS_OK);
  ASSERT_EQ(ferry_file_set_add(set, path().c_str(), 0, nullptr), FERRY_STATUS_OK);
  std::vector<unsigned char> into(64);
  const ferry_transfer read = {0, 8, into.size(), "cpu", into.data()};
  ferry_transfer_options full;
  ferry_transfer_options_init(&full);
  full.io_mode = FERRY_IO_MODE_BUFFERED;
  every_size<ferry_transfer_options>(
      "ferry_transfer_submit", full, 0, [&](ferry_transfer_options* o) {
        ferry_ticket* ticket = nullptr;
        const ferry_status s =
            ferry_transfer_submit(set, FERRY_DIRECTION_FILE_TO_MEMORY, &read, 1, o, &ticket);
        if (s == FERRY_STATUS_OK) {
          EXPECT_EQ(ferry_ticket_wait(ticket, -1, nullptr), FERRY_STATUS_OK);
        }
        ferry_ticket_free(ticket);
        return s;
      });
  ferry_file_set_free(set);
}

TEST_F(CApiSized, KVOptionsAndStatsOfEverySize) {
  const std::string root = (dir / "kv").string();
  ferry_kv_options full;
  ferry_kv_options_init(&full);
  full.model = "sized";
  full.capacity_bytes = 4 * 4096;
  full.block_bytes = 4096;
  // A struct without the capacity or the block size cannot open a store: refused, not guessed.
  every_size<ferry_kv_options>("ferry_kv_open", full, END_OF(ferry_kv_options, block_bytes),
                               [&](ferry_kv_options* o) {
                                 ferry_kv_store* store = nullptr;
                                 const ferry_status s = ferry_kv_open(root.c_str(), o, &store);
                                 ferry_kv_free(store);
                                 return s;
                               });
  ferry_kv_store* store = nullptr;
  ASSERT_EQ(ferry_kv_open(root.c_str(), &full, &store), FERRY_STATUS_OK) << ferry_last_error();
  ferry_kv_stats stats{};
  every_size<ferry_kv_stats>("ferry_kv_stats_get", stats, 0, [&](ferry_kv_stats* out) {
    const ferry_status s = ferry_kv_stats_get(store, out);
    if (s == FERRY_STATUS_OK && out->struct_size >= END_OF(ferry_kv_stats, block_bytes)) {
      EXPECT_EQ(out->block_bytes, 4096u);
    }
    return s;
  });
  ferry_kv_free(store);
}

TEST_F(CApiSized, StreamOptionsAndStatsOfEverySize) {
  ferry_stream_options full;
  ferry_stream_options_init(&full);
  every_size<ferry_stream_options>(
      "ferry_weight_stream_create", full, 0, [&](ferry_stream_options* o) {
        ferry_weight_stream* w = nullptr;
        const ferry_status s = ferry_weight_stream_create(tensors, counts, 3, 1, o, &w);
        ferry_weight_stream_free(w);
        return s;
      });
  every_size<ferry_stream_options>(
      "ferry_expert_cache_create", full, 0, [&](ferry_stream_options* o) {
        ferry_expert_cache* c = nullptr;
        const ferry_status s =
            ferry_expert_cache_create(tensors, counts, 3, 2, FERRY_EVICTION_LRU, o, &c);
        ferry_expert_cache_free(c);
        return s;
      });
  ferry_weight_stream* w = nullptr;
  ASSERT_EQ(ferry_weight_stream_create(tensors, counts, 3, 1, nullptr, &w), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_stream_stats stats{};
  every_size<ferry_stream_stats>("ferry_weight_stream_stats", stats, 0,
                                 [&](ferry_stream_stats* out) {
                                   return ferry_weight_stream_stats(w, out);
                                 });
  ferry_weight_stream_free(w);
  ferry_expert_cache* c = nullptr;
  ASSERT_EQ(ferry_expert_cache_create(tensors, counts, 3, 2, FERRY_EVICTION_LRU, nullptr, &c),
            FERRY_STATUS_OK);
  every_size<ferry_stream_stats>(
      "ferry_expert_cache_stats", stats, 0,
      [&](ferry_stream_stats* out) { return ferry_expert_cache_stats(c, out); });
  ferry_expert_cache_free(c);
}

TEST_F(CApiSized, FanoutOptionsAndStatsOfEverySize) {
  const char* devices[] = {"cpu", "cpu"};
  ferry_fanout_options full;
  ferry_fanout_options_init(&full);
  full.devices = devices;
  full.device_count = 2;
  // Without the device list nothing can be loaded: refused ("no device").
  every_size<ferry_fanout_options>(
      "ferry_checkpoint_load_fanout", full, END_OF(ferry_fanout_options, device_count),
      [&](ferry_fanout_options* o) {
        ferry_fanout* f = nullptr;
        const ferry_status s = ferry_checkpoint_load_fanout(checkpoint, o, &f);
        ferry_fanout_free(f);
        return s;
      });
  // The load options it points to, of every size.
  ferry_load_options load_full;
  ferry_load_options_init(&load_full);
  every_size<ferry_load_options>("ferry_checkpoint_load_fanout's load", load_full,
                                 sizeof(load_full.struct_size), [&](ferry_load_options* o) {
                                   ferry_fanout_options with = full;
                                   with.load = o;
                                   ferry_fanout* f = nullptr;
                                   const ferry_status s =
                                       ferry_checkpoint_load_fanout(checkpoint, &with, &f);
                                   ferry_fanout_free(f);
                                   return s;
                                 });
  ferry_fanout* fanout = nullptr;
  ASSERT_EQ(ferry_checkpoint_load_fanout(checkpoint, &full, &fanout), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_fanout_stats stats{};
  every_size<ferry_fanout_stats>("ferry_fanout_stats_get", stats, 0, [&](ferry_fanout_stats* out) {
    const ferry_status s = ferry_fanout_stats_get(fanout, out);
    if (s == FERRY_STATUS_OK && out->struct_size >= END_OF(ferry_fanout_stats, seconds)) {
      EXPECT_GE(out->seconds, 0.0);
    }
    return s;
  });
  ferry_fanout_free(fanout);
}

// A refused batch changes nothing: expert 0 stays acquired when {0, 2} is refused for 2.
TEST_F(CApiSized, RefusedExpertCacheBatchesChangeNothing) {
  ferry_expert_cache* c = nullptr;
  ASSERT_EQ(ferry_expert_cache_create(tensors, counts, 3, 2, FERRY_EVICTION_LRU, nullptr, &c),
            FERRY_STATUS_OK);
  const size_t both[2] = {0, 1}, unacquired[2] = {0, 2}, twice[2] = {1, 1}, far[1] = {7};
  size_t slots[2];
  ASSERT_EQ(ferry_expert_cache_acquire(c, both, 2, nullptr, 0, nullptr, slots), FERRY_STATUS_OK);
  EXPECT_EQ(ferry_expert_cache_release(c, unacquired, 2), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("expert 2"), std::string::npos);
  EXPECT_EQ(ferry_expert_cache_release(c, twice, 2), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("expert 1"), std::string::npos);
  // Both still held once each: released once each, then no more.
  EXPECT_EQ(ferry_expert_cache_release(c, both, 2), FERRY_STATUS_OK) << ferry_last_error();
  EXPECT_EQ(ferry_expert_cache_release(c, both, 1), FERRY_STATUS_INVALID_ARGUMENT);
  // A bad speculative expert: refused before expert 2 is pinned.
  const size_t two[1] = {2};
  EXPECT_EQ(ferry_expert_cache_acquire(c, two, 1, far, 1, nullptr, slots),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("expert 7"), std::string::npos);
  // Nothing pinned now: two experts take both slots (a leaked pin would leave one).
  EXPECT_EQ(ferry_expert_cache_acquire(c, both, 2, nullptr, 0, nullptr, slots), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_expert_cache_free(c);
}

}  // namespace
