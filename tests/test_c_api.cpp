// The C ABI, used the way a C host would: handles, statuses, last-error strings.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "ferry/tensor_digest.hpp"
#include "gguf_bytes.hpp"
#include "test_latch.hpp"
#include "test_support.hpp"

namespace {

using ferry::test::TempDir;

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    written = ferry::test::write_random_checkpoint(dir / "m.safetensors",
                                                   {{"b", ferry::DType::BF16, {3, 5}},
                                                    {"a", ferry::DType::F32, {7}},
                                                    {"c", ferry::DType::U8, {4099}}},
                                                   31);
    ASSERT_EQ(ferry_checkpoint_open((dir / "m.safetensors").string().c_str(), &checkpoint),
              FERRY_STATUS_OK)
        << ferry_last_error();
  }
  void TearDown() override { ferry_checkpoint_free(checkpoint); }

  TempDir dir;
  std::map<std::string, std::vector<std::byte>> written;
  ferry_checkpoint* checkpoint = nullptr;
};

TEST_F(CApi, ListsTensors) {
  ASSERT_EQ(ferry_checkpoint_tensor_count(checkpoint), 3u);
  ferry_tensor_info info{};
  ASSERT_EQ(ferry_checkpoint_tensor_info(checkpoint, 0, &info), FERRY_STATUS_OK);
  EXPECT_STREQ(info.name, "b");  // written first
  EXPECT_STREQ(info.dtype, "BF16");
  ASSERT_EQ(info.rank, 2u);
  EXPECT_EQ(info.shape[0], 3u);
  EXPECT_EQ(info.shape[1], 5u);
  EXPECT_EQ(info.bytes, 30u);
  EXPECT_EQ(std::string(info.file), (dir / "m.safetensors").string());
  EXPECT_EQ(ferry_checkpoint_tensor_info(checkpoint, 3, &info), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("out of range"), std::string::npos);
}

// What a host built against an older ferry.h holds: the struct up to `fields_end`, then its own
// memory. The sized init writes the defaults into that prefix and nothing beyond it.
template <class Options>
Options init_as_older_host(std::size_t fields_end, void (*init_sized)(Options*, size_t)) {
  constexpr unsigned char kCanary = 0xA5;
  std::vector<unsigned char> memory(sizeof(Options) + 64, kCanary);
  init_sized(reinterpret_cast<Options*>(memory.data()), fields_end);
  for (std::size_t i = fields_end; i < memory.size(); ++i)
    EXPECT_EQ(memory[i], kCanary) << "byte " << i << " past a " << fields_end << "-byte struct";
  Options out;
  std::memset(&out, 0, sizeof out);
  std::memcpy(&out, memory.data(), fields_end);
  EXPECT_EQ(out.struct_size, fields_end);
  return out;
}

TEST_F(CApi, SizedInitWritesNoFurtherThanTheHostsStruct) {
  const ferry_load_options old_load = init_as_older_host(
      offsetof(ferry_load_options, page_cache_pin_bytes), ferry_load_options_init_sized);
  EXPECT_STREQ(old_load.device, "cpu");
  EXPECT_EQ(old_load.io_mode, FERRY_IO_MODE_AUTO);
  // The library reads only what that host's struct holds: the load works.
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &old_load, &loaded), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_loaded_free(loaded);
  init_as_older_host(offsetof(ferry_transfer_options, durable), ferry_transfer_options_init_sized);
  init_as_older_host(sizeof(size_t) + sizeof(void*), ferry_kv_options_init_sized);
  init_as_older_host(sizeof(size_t) + sizeof(void*), ferry_stream_options_init_sized);
  init_as_older_host(offsetof(ferry_fanout_options, device_count), ferry_fanout_options_init_sized);
  // The whole struct: the same as the plain init.
  ferry_load_options whole, plain;
  std::memset(&whole, 0, sizeof whole);  // padding alike, whatever the inits leave in it
  std::memset(&plain, 0, sizeof plain);
  ferry_load_options_init_sized(&whole, sizeof whole);
  ferry_load_options_init(&plain);
  EXPECT_EQ(std::memcmp(&whole, &plain, sizeof whole), 0);
  // Too small to hold struct_size, or no struct: nothing is written.
  unsigned char tiny[2] = {7, 7};
  ferry_load_options_init_sized(reinterpret_cast<ferry_load_options*>(tiny), sizeof tiny);
  EXPECT_EQ(tiny[0], 7);
  ferry_load_options_init_sized(nullptr, sizeof whole);
}

TEST_F(CApi, LoadsAllAndReportsStats) {
  ferry_load_options options;
  ferry_load_options_init(&options);
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_checkpoint_free(checkpoint);  // the loaded result keeps what it needs
  checkpoint = nullptr;
  for (const auto& [name, bytes] : written) {
    void* data = nullptr;
    uint64_t size = 0;
    ASSERT_EQ(ferry_loaded_tensor_data(loaded, name.c_str(), &data, &size), FERRY_STATUS_OK);
    ASSERT_EQ(size, bytes.size());
    EXPECT_EQ(std::memcmp(data, bytes.data(), size), 0);
    uint64_t digest = 0;
    ASSERT_EQ(ferry_loaded_tensor_digest(loaded, name.c_str(), &digest), FERRY_STATUS_OK);
    EXPECT_EQ(digest, ferry::bytes_digest(bytes));
  }
  ferry_load_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(ferry_loaded_stats(loaded, &stats), FERRY_STATUS_OK);
  EXPECT_EQ(stats.tensor_bytes, 30u + 28 + 4099);
  EXPECT_EQ(stats.file_count, 1u);
  ferry_file_stats file{};
  ASSERT_EQ(ferry_loaded_file_stats(loaded, 0, &file), FERRY_STATUS_OK);
  EXPECT_TRUE(std::string(file.io_path) == "odirect" || std::string(file.io_path) == "buffered");
  EXPECT_GT(std::strlen(file.reason), 0u);
  EXPECT_EQ(ferry_loaded_file_stats(loaded, 1, &file), FERRY_STATUS_INVALID_ARGUMENT);
  ferry_loaded_free(loaded);
}

TEST_F(CApi, LoadsASubset) {
  const char* names[] = {"c"};
  ferry_load_options options;
  ferry_load_options_init(&options);
  options.names = names;
  options.name_count = 1;
  options.io_mode = FERRY_IO_MODE_BUFFERED;
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK);
  void* data = nullptr;
  EXPECT_EQ(ferry_loaded_tensor_data(loaded, "c", &data, nullptr), FERRY_STATUS_OK);
  EXPECT_EQ(ferry_loaded_tensor_data(loaded, "a", &data, nullptr), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("\"a\""), std::string::npos);
  ferry_loaded_free(loaded);
}

TEST_F(CApi, ErrorsAreStatusesWithMessages) {
  ferry_checkpoint* other = nullptr;
  EXPECT_EQ(ferry_checkpoint_open((dir / "missing.safetensors").string().c_str(), &other),
            FERRY_STATUS_NOT_FOUND);
  EXPECT_NE(std::string(ferry_last_error()).find("missing.safetensors"), std::string::npos);
  EXPECT_EQ(other, nullptr);

  ferry::test::write_file(dir / "bad.safetensors", ferry::test::raw_safetensors("{not json", ""));
  EXPECT_EQ(ferry_checkpoint_open((dir / "bad.safetensors").string().c_str(), &other),
            FERRY_STATUS_FORMAT_ERROR);
  EXPECT_NE(std::string(ferry_last_error()).find("bad.safetensors"), std::string::npos);

  EXPECT_EQ(ferry_checkpoint_open(nullptr, &other), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_checkpoint_load(nullptr, nullptr, nullptr), FERRY_STATUS_INVALID_ARGUMENT);

  ferry_load_options options;
  ferry_load_options_init(&options);
  options.device = "tpu:0";
  ferry_loaded* loaded = nullptr;
  EXPECT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("tpu:0"), std::string::npos);
  options.device = "cpu";
  options.io_mode = 9;
  EXPECT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(loaded, nullptr);

  ferry_checkpoint_free(nullptr);
  ferry_loaded_free(nullptr);
  EXPECT_EQ(ferry_checkpoint_tensor_count(nullptr), 0u);
}

TEST_F(CApi, NullLoadedHandleIsAnErrorForEveryLookup) {
  uint64_t digest = 0;
  void* data = nullptr;
  EXPECT_EQ(ferry_loaded_tensor_digest(nullptr, "a", &digest), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("loaded must not be NULL"), std::string::npos);
  EXPECT_EQ(ferry_loaded_tensor_data(nullptr, "a", &data, nullptr), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("loaded must not be NULL"), std::string::npos);
}

// Through a C string "a\0b" would read as "a": the reader must refuse such a name, not hand
// back another tensor's bytes for it.
TEST_F(CApi, NulInsideATensorNameIsAFormatError) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  ferry::test::write_file(dir / "with-nul.safetensors", ferry::test::raw_safetensors(header, "xy"));
  ferry_checkpoint* other = nullptr;
  EXPECT_EQ(ferry_checkpoint_open((dir / "with-nul.safetensors").string().c_str(), &other),
            FERRY_STATUS_FORMAT_ERROR);
  EXPECT_EQ(other, nullptr);
  const std::string error = ferry_last_error();
  EXPECT_NE(error.find("with-nul.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("NUL"), std::string::npos) << error;
}

TEST_F(CApi, GgufTensorsCarryTheirGgmlTypeAndDims) {
  using namespace ferry::test;
  GgufBytes file;
  file.tensors.push_back(tensor_info("q", {64, 2}, 8, 0));  // Q8_0: 2 rows of 2 blocks of 34 bytes
  file.data = std::string(2 * 2 * 34, '\x5a');
  write_file(dir / "m.gguf", file.build());
  ferry_checkpoint* gguf = nullptr;
  ASSERT_EQ(ferry_checkpoint_open((dir / "m.gguf").string().c_str(), &gguf), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_tensor_info info{};
  ASSERT_EQ(ferry_checkpoint_tensor_info(gguf, 0, &info), FERRY_STATUS_OK);
  EXPECT_STREQ(info.ggml_type, "Q8_0");
  ASSERT_EQ(info.ggml_rank, 2u);
  EXPECT_EQ(info.ggml_dims[0], 64u);
  EXPECT_STREQ(info.dtype, "U8");
  EXPECT_EQ(info.bytes, 136u);
  ferry_tensor_info plain{};
  ASSERT_EQ(ferry_checkpoint_tensor_info(checkpoint, 0, &plain), FERRY_STATUS_OK);
  EXPECT_EQ(plain.ggml_type, nullptr);
  EXPECT_EQ(plain.ggml_rank, 0u);
  ferry_checkpoint_free(gguf);
}

TEST(CApiVersion, MatchesTheProjectAndThePythonPackage) {
  // pyproject.toml states the version again for pip: the two must agree.
  std::ifstream pyproject(std::string(FERRY_SOURCE_DIR) + "/pyproject.toml");
  std::string text((std::istreambuf_iterator<char>(pyproject)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(std::string("version = \"") + ferry_version() + "\""), std::string::npos);
}

TEST_F(CApi, CudaWithoutGpuIsACudaError) {
  if (ferry::cuda_available()) GTEST_SKIP() << "a GPU is present";
  ferry_load_options options;
  ferry_load_options_init(&options);
  options.device = "cuda:0";
  ferry_loaded* loaded = nullptr;
  EXPECT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_CUDA_ERROR);
  EXPECT_NE(std::string(ferry_last_error()).find("CUDA"), std::string::npos);
}

TEST_F(CApi, APreparedLoadLandsTheSameBytes) {
  ferry_load_options options;
  ferry_load_options_init(&options);
  options.reader_threads = 2;
  options.chunk_bytes = 1 << 20;
  ferry_load_preparation* preparation = nullptr;
  ASSERT_EQ(ferry_load_prepare(&options, &preparation), FERRY_STATUS_OK) << ferry_last_error();
  std::uint64_t staging = 0;
  ASSERT_EQ(ferry_load_preparation_wait(preparation, &staging), FERRY_STATUS_OK)
      << ferry_last_error();
  EXPECT_GT(staging, 2u * (1u << 20));  // two readers' slots of a 1 MiB read at least
  EXPECT_EQ(ferry_load_preparation_wait(preparation, nullptr), FERRY_STATUS_OK);  // again: same
  ferry_load_preparation_free(preparation);
  ferry_load_preparation_free(nullptr);
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK);
  for (const auto& [name, bytes] : written) {
    void* data = nullptr;
    std::uint64_t size = 0;
    ASSERT_EQ(ferry_loaded_tensor_data(loaded, name.c_str(), &data, &size), FERRY_STATUS_OK);
    ASSERT_EQ(size, bytes.size());
    EXPECT_EQ(std::memcmp(data, bytes.data(), size), 0) << name;
  }
  ferry_loaded_free(loaded);

  EXPECT_EQ(ferry_load_prepare(&options, nullptr), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_load_preparation_wait(nullptr, nullptr), FERRY_STATUS_INVALID_ARGUMENT);
  options.staging_bytes = 4096;  // not one slot of a 1 MiB read
  EXPECT_EQ(ferry_load_prepare(&options, &preparation), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("cannot hold"), std::string::npos)
      << ferry_last_error();
  if (!ferry::cuda_available()) {  // the failure comes from the preparing thread, on wait
    ferry_load_options_init(&options);
    options.device = "cuda:0";
    ASSERT_EQ(ferry_load_prepare(&options, &preparation), FERRY_STATUS_OK);
    EXPECT_EQ(ferry_load_preparation_wait(preparation, nullptr), FERRY_STATUS_CUDA_ERROR);
    EXPECT_NE(std::string(ferry_last_error()).find("warm-up for cuda:0"), std::string::npos);
    ferry_load_preparation_free(preparation);
  }
}

TEST_F(CApi, EngineSettingsGoThroughTheOneMapping) {
  ferry_load_options options;
  ferry_load_options_init(&options);
  options.backend = "posix";
  options.slots_per_thread = 1;
  options.reader_threads = 2;
  options.chunk_bytes = 8192;
  options.io_mode = FERRY_IO_MODE_BUFFERED;
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_load_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(ferry_loaded_stats(loaded, &stats), FERRY_STATUS_OK);
  EXPECT_EQ(stats.slots_per_thread, 1u);
  EXPECT_LE(stats.reader_threads, 2u);
  EXPECT_LE(stats.chunk_bytes, 8192u);  // a small load reads in smaller chunks
  EXPECT_NE(std::string(stats.settings_source).find("caller"), std::string::npos)
      << stats.settings_source;
  ferry_loaded_free(loaded);

  // Page-cache DMA reaches the engine: host memory is not registered with the GPU driver, and
  // the file's reason says so.
  options.page_cache_pin_bytes = 1ull << 30;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK)
      << ferry_last_error();
  ASSERT_EQ(ferry_loaded_stats(loaded, &stats), FERRY_STATUS_OK);
  EXPECT_EQ(stats.bytes_from_registered_page_cache, 0u);
  ferry_file_stats file{};
  ASSERT_EQ(ferry_loaded_file_stats(loaded, 0, &file), FERRY_STATUS_OK);
  EXPECT_NE(std::string(file.reason).find("page-cache DMA not used"), std::string::npos)
      << file.reason;
  ferry_loaded_free(loaded);
  options.page_cache_pin_bytes = 0;

  // The device memory cache serves GPU loads; a host load takes host memory as before, and
  // releasing a cache no load used is a no-op.
  options.cache_device_memory = 1;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_loaded_free(loaded);
  options.cache_device_memory = 0;
  std::uint64_t still_held = 1;
  ASSERT_EQ(ferry_release_cached_device_memory(&still_held), FERRY_STATUS_OK);
  EXPECT_EQ(still_held, 0u);
  EXPECT_EQ(ferry_release_cached_device_memory(nullptr), FERRY_STATUS_OK);

  options.reader_threads = 100000;
  EXPECT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("at most 256"), std::string::npos);
  options.reader_threads = 0;
  options.backend = "gds";
  EXPECT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("gds"), std::string::npos);
}

// A host built against an older ferry.h passes a smaller struct: ferry reads and writes only what
// lies inside it. A size of 0 or one larger than this library knows is refused.
TEST_F(CApi, GrowableStructsHonourTheirSize) {
  ferry_load_options options;
  ferry_load_options_init(&options);
  EXPECT_EQ(options.struct_size, sizeof options);
  options.backend = "not read: outside the old struct";
  options.struct_size = offsetof(ferry_load_options, backend);
  ferry_loaded* loaded = nullptr;
  ASSERT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_OK)
      << ferry_last_error();

  struct {
    ferry_load_stats stats;
    unsigned char canary[sizeof(ferry_load_stats)];
  } out;
  std::memset(&out, 0xAB, sizeof out);
  out.stats.struct_size = offsetof(ferry_load_stats, slots_per_thread);
  ASSERT_EQ(ferry_loaded_stats(loaded, &out.stats), FERRY_STATUS_OK);
  EXPECT_EQ(out.stats.tensor_bytes, 30u + 28 + 4099);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&out.stats);
  for (std::size_t i = offsetof(ferry_load_stats, slots_per_thread); i < sizeof out; ++i)
    ASSERT_EQ(bytes[i], 0xAB) << "byte " << i << " lies outside struct_size";
  out.stats.struct_size = 0;
  EXPECT_EQ(ferry_loaded_stats(loaded, &out.stats), FERRY_STATUS_INVALID_ARGUMENT);
  out.stats.struct_size = sizeof(ferry_load_stats) + 8;
  EXPECT_EQ(ferry_loaded_stats(loaded, &out.stats), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("newer ferry.h"), std::string::npos);
  ferry_loaded_free(loaded);

  options.struct_size = 0;
  EXPECT_EQ(ferry_checkpoint_load(checkpoint, &options, &loaded), FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("struct_size"), std::string::npos);
}

}  // namespace

namespace {

// The transfer core through the C ABI: a batch written, read back (one bad transfer among good
// ones), statuses, and an older caller's smaller options struct.
TEST(CApiTransfer, RoundTripWithPerTransferStatus) {
  TempDir dir;
  ferry_file_set* set = nullptr;
  ASSERT_EQ(ferry_file_set_create(0, &set), FERRY_STATUS_OK) << ferry_last_error();
  uint32_t file = 99;
  ASSERT_EQ(ferry_file_set_add(set, (dir / "kv.bin").string().c_str(), 1, &file), FERRY_STATUS_OK)
      << ferry_last_error();
  EXPECT_EQ(file, 0u);
  auto a = ferry::test::random_bytes(10000, 1), b = ferry::test::random_bytes(333, 2);
  ferry_transfer out[] = {{0, 5, a.size(), "cpu", a.data()},
                          {0, 20000, b.size(), nullptr, b.data()}};
  ferry_transfer_options options;
  ferry_transfer_options_init(&options);
  options.durable = 1;
  ferry_ticket* put = nullptr;
  ASSERT_EQ(ferry_transfer_submit(set, FERRY_DIRECTION_MEMORY_TO_FILE, out, 2, &options, &put),
            FERRY_STATUS_OK)
      << ferry_last_error();
  int ready = 0;
  ASSERT_EQ(ferry_ticket_wait(put, -1, &ready), FERRY_STATUS_OK);
  EXPECT_EQ(ready, 1);
  ferry_ticket_free(put);

  std::vector<std::byte> a2(a.size()), b2(b.size()), past(100);
  ferry_transfer in[] = {{0, 5, a2.size(), "cpu", a2.data()},
                         {0, 20300, past.size(), "cpu", past.data()},
                         {0, 20000, b2.size(), "cpu", b2.data()}};
  options.struct_size = offsetof(ferry_transfer_options, chunk_bytes);  // an older caller
  ferry_ticket* get = nullptr;
  ASSERT_EQ(ferry_transfer_submit(set, FERRY_DIRECTION_FILE_TO_MEMORY, in, 3, &options, &get),
            FERRY_STATUS_OK)
      << ferry_last_error();
  ferry_file_set_free(set);  // the ticket keeps what it needs
  ASSERT_EQ(ferry_ticket_wait(get, -1, nullptr), FERRY_STATUS_OK);
  EXPECT_EQ(ferry_ticket_ready(get), 1);
  ferry_transfer_state state = FERRY_TRANSFER_PENDING;
  uint64_t bytes = 0;
  const char* error = nullptr;
  ASSERT_EQ(ferry_ticket_status(get, 0, &state, &bytes, &error), FERRY_STATUS_OK);
  EXPECT_EQ(state, FERRY_TRANSFER_DONE);
  EXPECT_EQ(bytes, a.size());
  EXPECT_STREQ(error, "");
  ASSERT_EQ(ferry_ticket_status(get, 1, &state, nullptr, &error), FERRY_STATUS_OK);
  EXPECT_EQ(state, FERRY_TRANSFER_FAILED);
  EXPECT_NE(std::string(error).find("kv.bin"), std::string::npos) << error;
  ASSERT_EQ(ferry_ticket_status(get, 2, &state, nullptr, nullptr), FERRY_STATUS_OK);
  EXPECT_EQ(state, FERRY_TRANSFER_DONE);
  EXPECT_EQ(ferry_ticket_status(get, 3, &state, nullptr, nullptr), FERRY_STATUS_INVALID_ARGUMENT);
  ferry_ticket_free(get);
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
}

TEST(CApiTransfer, BadArgumentsAreStatusesNotCrashes) {
  ferry_ticket* t = nullptr;
  EXPECT_EQ(ferry_transfer_submit(nullptr, FERRY_DIRECTION_FILE_TO_MEMORY, nullptr, 0, nullptr, &t),
            FERRY_STATUS_INVALID_ARGUMENT);
  ferry_file_set* set = nullptr;
  ASSERT_EQ(ferry_file_set_create(0, &set), FERRY_STATUS_OK);
  EXPECT_EQ(ferry_file_set_add(set, "/no/such/file", 0, nullptr), FERRY_STATUS_NOT_FOUND);
  ferry_transfer bad = {7, 0, 10, "cpu", &t};
  EXPECT_EQ(ferry_transfer_submit(set, FERRY_DIRECTION_FILE_TO_MEMORY, &bad, 1, nullptr, &t),
            FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("file index"), std::string::npos);
  EXPECT_EQ(ferry_ticket_ready(nullptr), 1);
  ferry_ticket_free(nullptr);
  ferry_file_set_free(set);
}

// The KV store's C ABI against its own callbacks and a free beside work in flight.
struct CKvStore {
  TempDir dir;
  ferry_kv_store* store = nullptr;
  std::vector<char> block = std::vector<char>(4096, 'k');
  ferry_kv_piece piece{block.data(), block.size(), "cpu"};
  ferry_kv_block one{&piece, 1};
  CKvStore() { EXPECT_EQ(open(), FERRY_STATUS_OK) << ferry_last_error(); }
  ferry_status open() {
    ferry_kv_options o;
    ferry_kv_options_init(&o);
    o.model = "m";
    o.capacity_bytes = 16 * 4096;
    o.block_bytes = 4096;
    return ferry_kv_open(dir.path().string().c_str(), &o, &store);
  }
};

// ferry_kv_free from a completion callback of the store (before: std::terminate, "Resource
// deadlock avoided"): the put stands, and the store opens again once its last batch ended.
TEST(CApiKv, FreeInsideACompletionCallback) {
  CKvStore s;
  struct Seen {
    ferry_kv_store* store;
    int32_t status = -1;
  } seen{s.store};
  const auto free_it = [](void* user, const ferry_kv_result* r, size_t n) {
    auto* seen = static_cast<Seen*>(user);
    if (n == 1) seen->status = r[0].status;
    ferry_kv_free(seen->store);
  };
  const uint64_t key = 1;
  ferry_kv_ticket* t = nullptr;
  ASSERT_EQ(ferry_kv_put_async(s.store, &key, &s.one, 1, nullptr, free_it, &seen, &t),
            FERRY_STATUS_OK);
  int ready = 0;
  ASSERT_EQ(ferry_kv_ticket_wait(t, -1, &ready), FERRY_STATUS_OK);
  ferry_kv_ticket_free(t);
  EXPECT_EQ(seen.status, FERRY_KV_OK);
  ferry_status opened;
  while ((opened = s.open()) == FERRY_STATUS_IO_ERROR &&
         std::string(ferry_last_error()).find("another process") != std::string::npos)
    std::this_thread::yield();  // the writer lock goes when the freed store's batch has ended
  ASSERT_EQ(opened, FERRY_STATUS_OK) << ferry_last_error();
  size_t hits = 0;
  ASSERT_EQ(ferry_kv_lookup(s.store, &key, 1, &hits), FERRY_STATUS_OK);
  EXPECT_EQ(hits, 1u);
  ferry_kv_free(s.store);
}

// ferry_kv_ticket_wait and ferry_kv_ticket_result on the ticket whose callback is running
// (before: the wait never returned). Another batch posted and awaited from the callback, too.
TEST(CApiKv, TicketWaitAndResultInsideTheTicketsOwnCallback) {
  CKvStore s;
  struct Inside {
    CKvStore* s;
    std::atomic<ferry_kv_ticket*> ticket{nullptr};
    int ready = 0;
    ferry_status wait_status = FERRY_STATUS_INTERNAL_ERROR, result_status = wait_status;
    ferry_kv_result result{-1, -1};
    ferry_status inner_status = FERRY_STATUS_INTERNAL_ERROR;
    int32_t inner_result = -1;
  } inside{&s};
  const auto callback = [](void* user, const ferry_kv_result*, size_t) {
    auto* in = static_cast<Inside*>(user);
    ferry_kv_ticket* own = nullptr;
    while ((own = in->ticket.load()) == nullptr) std::this_thread::yield();  // set by the poster
    in->wait_status = ferry_kv_ticket_wait(own, -1, &in->ready);
    in->result_status = ferry_kv_ticket_result(own, 0, &in->result, nullptr);
    const uint64_t key = 2;
    ferry_kv_ticket* inner = nullptr;
    in->inner_status =
        ferry_kv_put_async(in->s->store, &key, &in->s->one, 1, nullptr, nullptr, nullptr, &inner);
    if (in->inner_status != FERRY_STATUS_OK) return;
    int ready = 0;
    in->inner_status = ferry_kv_ticket_wait(inner, -1, &ready);
    ferry_kv_ticket_result(inner, 0, nullptr, nullptr);
    ferry_kv_result r{-1, -1};
    if (ferry_kv_ticket_result(inner, 0, &r, nullptr) == FERRY_STATUS_OK)
      in->inner_result = r.status;
    ferry_kv_ticket_free(inner);
  };
  const uint64_t key = 1;
  ferry_kv_ticket* t = nullptr;
  ASSERT_EQ(ferry_kv_put_async(s.store, &key, &s.one, 1, nullptr, callback, &inside, &t),
            FERRY_STATUS_OK);
  inside.ticket = t;
  int ready = 0;
  ASSERT_EQ(ferry_kv_ticket_wait(t, -1, &ready), FERRY_STATUS_OK);
  EXPECT_EQ(inside.wait_status, FERRY_STATUS_OK);
  EXPECT_EQ(inside.ready, 1);
  EXPECT_EQ(inside.result_status, FERRY_STATUS_OK);
  EXPECT_EQ(inside.result.status, FERRY_KV_OK);
  EXPECT_EQ(inside.inner_status, FERRY_STATUS_OK);
  EXPECT_EQ(inside.inner_result, FERRY_KV_OK);
  ferry_kv_ticket_free(t);
  ferry_kv_free(s.store);
}

// ferry_kv_free on one thread while a batch's callback runs on another: the free returns only
// after the batch (callback included) ended; nothing is used after it is freed (ASan).
TEST(CApiKv, FreeWaitsForABatchInFlight) {
  CKvStore s;
  struct Held {
    ferry::test::Latch inside{1}, release{1};
  } held;
  const auto callback = [](void* user, const ferry_kv_result*, size_t) {
    auto* h = static_cast<Held*>(user);
    h->inside.count_down();
    h->release.wait();
  };
  const uint64_t key = 1;
  ferry_kv_ticket* t = nullptr;
  ASSERT_EQ(ferry_kv_put_async(s.store, &key, &s.one, 1, nullptr, callback, &held, &t),
            FERRY_STATUS_OK);
  held.inside.wait();
  std::thread freer([&] { ferry_kv_free(s.store); });
  held.release.count_down();
  freer.join();
  int ready = 0;
  EXPECT_EQ(ferry_kv_ticket_wait(t, 0, &ready), FERRY_STATUS_OK);
  EXPECT_EQ(ready, 1);
  ferry_kv_ticket_free(t);
  ASSERT_EQ(s.open(), FERRY_STATUS_OK) << ferry_last_error();
  size_t hits = 0;
  ASSERT_EQ(ferry_kv_lookup(s.store, &key, 1, &hits), FERRY_STATUS_OK);
  EXPECT_EQ(hits, 1u);
  ferry_kv_free(s.store);
}

}  // namespace

namespace {

// fleet_writers: two writers of one namespace, each its share, each seeing the other's blocks
// and counting it as writing; a third is refused with the reason.
TEST(CApiKv, AFleetOfWritersSharesOneNamespace) {
  TempDir dir;
  ferry_kv_options o;
  ferry_kv_options_init(&o);
  o.model = "fleet";
  o.capacity_bytes = 16 * 4096;
  o.block_bytes = 4096;
  o.fleet_writers = 2;
  const std::string root = (dir / "kv").string();
  ferry_kv_store *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(ferry_kv_open(root.c_str(), &o, &a), FERRY_STATUS_OK) << ferry_last_error();
  ASSERT_EQ(ferry_kv_open(root.c_str(), &o, &b), FERRY_STATUS_OK) << ferry_last_error();
  EXPECT_NE(ferry_kv_open(root.c_str(), &o, &c), FERRY_STATUS_OK);
  EXPECT_NE(std::string(ferry_last_error()).find("writer shares of this fleet are taken"),
            std::string::npos)
      << ferry_last_error();
  std::vector<char> bytes(4096, 'f'), out(4096, 0);
  const ferry_kv_piece in_piece[1] = {{bytes.data(), 4096, "cpu"}};
  const ferry_kv_piece out_piece[1] = {{out.data(), 4096, "cpu"}};
  const ferry_kv_block in_block = {in_piece, 1}, out_block = {out_piece, 1};
  const uint64_t key_a = 1, key_b = 2;
  ferry_kv_result r{};
  ASSERT_EQ(ferry_kv_put(a, &key_a, &in_block, 1, nullptr, &r), FERRY_STATUS_OK);
  ASSERT_EQ(r.status, FERRY_KV_OK);
  ASSERT_EQ(ferry_kv_put(b, &key_b, &in_block, 1, nullptr, &r), FERRY_STATUS_OK);
  ASSERT_EQ(ferry_kv_get(b, &key_a, &out_block, 1, &r), FERRY_STATUS_OK);
  EXPECT_EQ(r.status, FERRY_KV_OK);
  EXPECT_EQ(out, bytes);
  ferry_kv_stats stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(ferry_kv_stats_get(b, &stats), FERRY_STATUS_OK);
  EXPECT_EQ(stats.writers_active, 2u);
  ferry_kv_free(a);
  ferry_kv_free(b);
}

// Piece lengths whose sum wraps around 2^64 to the block size (a host's arithmetic slip, a
// "negative" length): BAD_SIZE for that key, for put and get alike, and nothing is touched.
TEST(CApiKv, PieceLengthsThatWrapAroundAreABadSize) {
  TempDir dir;
  ferry_kv_options o;
  ferry_kv_options_init(&o);
  o.model = "wrap";
  o.capacity_bytes = 16 * 4096;
  o.block_bytes = 4096;
  ferry_kv_store* store = nullptr;
  ASSERT_EQ(ferry_kv_open((dir / "kv").string().c_str(), &o, &store), FERRY_STATUS_OK)
      << ferry_last_error();
  std::vector<char> a(8192, 'a'), b(8192, 'b');
  const uint64_t stored = 7, other = 8;
  const ferry_kv_piece whole[1] = {{a.data(), 4096, "cpu"}};
  const ferry_kv_block whole_block = {whole, 1};
  ferry_kv_result r{};
  ASSERT_EQ(ferry_kv_put(store, &stored, &whole_block, 1, nullptr, &r), FERRY_STATUS_OK);
  ASSERT_EQ(r.status, FERRY_KV_OK);
  const ferry_kv_piece two[2] = {{a.data(), UINT64_MAX, "cpu"}, {b.data(), 4097, "cpu"}};
  const ferry_kv_piece three[3] = {
      {a.data(), UINT64_MAX, "cpu"}, {b.data(), UINT64_MAX, "cpu"}, {b.data(), 4098, "cpu"}};
  for (const ferry_kv_block wrapped : {ferry_kv_block{two, 2}, ferry_kv_block{three, 3}}) {
    r = {};
    EXPECT_EQ(ferry_kv_put(store, &other, &wrapped, 1, nullptr, &r), FERRY_STATUS_OK);
    EXPECT_EQ(r.status, FERRY_KV_BAD_SIZE) << ferry_last_error();
    r = {};
    EXPECT_EQ(ferry_kv_get(store, &stored, &wrapped, 1, &r), FERRY_STATUS_OK);
    EXPECT_EQ(r.status, FERRY_KV_BAD_SIZE) << ferry_last_error();
  }
  size_t hits = 9;
  ASSERT_EQ(ferry_kv_lookup(store, &other, 1, &hits), FERRY_STATUS_OK);
  EXPECT_EQ(hits, 0u);
  EXPECT_EQ(b, std::vector<char>(8192, 'b'));  // nothing written into the "destination"
  ferry_kv_free(store);
}

}  // namespace
