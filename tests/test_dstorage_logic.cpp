// DirectStorage's GPU-free logic on every system: request splitting (at most 32 MiB each, end
// to end, nothing lost) and matching the D3D12 adapter to the CUDA device by LUID (fakes stand
// in for DXGI's adapters), and that asking for DirectStorage where it cannot run is an error
// naming why, with the staged path taken only when allowed, and said so.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/dstorage/adapter_match.hpp"
#include "backends/dstorage/request_split.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/machine.hpp"
#include "test_support.hpp"
#ifdef _WIN32
#include "shim/cuda_driver.hpp"
#include "backends/dstorage/dstorage_bridge.hpp"
#endif

namespace ferry {
namespace {

using dstorage::AdapterInfo;
using dstorage::Luid;

TEST(DirectStorageRequests, SplitAtMost32MiBEndToEnd) {
  const std::uint64_t mib = 1 << 20;
  for (std::uint64_t size : {std::uint64_t{0}, std::uint64_t{1}, 32 * mib - 1, 32 * mib,
                             32 * mib + 1, 100 * mib + 12345}) {
    const auto requests = dstorage::split_requests(7 * mib + 3, size, 4096);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      EXPECT_LE(requests[i].size, dstorage::kMaxRequestBytes);
      EXPECT_GT(requests[i].size, 0u);
      EXPECT_EQ(requests[i].file_offset, 7 * mib + 3 + total);
      EXPECT_EQ(requests[i].destination_offset, 4096 + total);
      if (i + 1 < requests.size()) {
        EXPECT_EQ(requests[i].size, dstorage::kMaxRequestBytes);
      }
      total += requests[i].size;
    }
    EXPECT_EQ(total, size);
    EXPECT_EQ(requests.size(), (size + 32 * mib - 1) / (32 * mib));
  }
  EXPECT_EQ(dstorage::split_requests(0, 10, 0, 4).size(), 3u);
  EXPECT_THROW(dstorage::split_requests(0, 10, 0, 0), std::invalid_argument);
}

TEST(DirectStorageAdapters, TheCudaDevicesLuidWinsOverTheDefaultAdapter) {
  // A laptop: the integrated GPU is adapter 0 (DXGI's default), the NVIDIA GPU adapter 1.
  const AdapterInfo adapters[] = {{"Intel Iris Xe", {0x1234, 0}, false},
                                  {"NVIDIA RTX 4090 Laptop", {0xabcd, 1}, false},
                                  {"Microsoft Basic Render Driver", {0x9999, 0}, true}};
  const auto choice = dstorage::match_adapter({0xabcd, 1}, adapters);
  ASSERT_TRUE(choice.index.has_value());
  EXPECT_EQ(*choice.index, 1u);
  EXPECT_NE(choice.reason.find("NVIDIA"), std::string::npos) << choice.reason;
}

TEST(DirectStorageAdapters, NoMatchIsAnErrorNamingEveryAdapter) {
  const AdapterInfo adapters[] = {{"Intel Iris Xe", {0x1234, 0}, false},
                                  {"Microsoft Basic Render Driver", {0xabcd, 1}, true}};
  // Same LUID but a software adapter: never the CUDA device.
  const auto choice = dstorage::match_adapter({0xabcd, 1}, adapters);
  EXPECT_FALSE(choice.index.has_value());
  EXPECT_NE(choice.reason.find("00000001:0000abcd"), std::string::npos) << choice.reason;
  EXPECT_NE(choice.reason.find("Intel Iris Xe"), std::string::npos) << choice.reason;
  EXPECT_NE(choice.reason.find("(software)"), std::string::npos) << choice.reason;
  EXPECT_FALSE(dstorage::match_adapter({1, 0}, {}).index.has_value());
}

// Where DirectStorage cannot run (Linux; Windows without dstorage.dll, as under Wine), asking for
// it fails with the reason; allow_compat takes the staged path and the statistics say so.
TEST(DirectStorageBackend, UnavailableIsAnErrorOrAnAnnouncedFallback) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(path, {{"a", DType::U8, {70001}}}, 3);
  auto ckpt = Checkpoint::open_shared(path);
  LoadOptions options;
  set_load_option(options, "backend", "directstorage");
  if (directstorage_facts().available) GTEST_SKIP() << "DirectStorage runs here";
  try {
    load(ckpt, options);
    FAIL() << "a directstorage load ran where DirectStorage cannot";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("DirectStorage"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("allow_compat"), std::string::npos) << e.what();
  }
  set_load_option(options, "allow_compat", "true");
  auto loaded = load(ckpt, options);
  EXPECT_EQ(std::memcmp(loaded.find("a")->data, written.at("a").data(), 70001), 0);
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  const FileLoadStats& file = loaded.stats().files[0];
  EXPECT_NE(file.io_path, IoPath::DirectStorage);
  EXPECT_NE(file.reason.find("DirectStorage not used"), std::string::npos) << file.reason;
}

#ifdef _WIN32
// The bridge into CUDA memory (D3D12 buffer and fence shared with CUDA) is built step by step;
// where a step cannot run, the error names it and the capability missing, and `ferry doctor`
// reports the same words. Under Wine there is no nvcuda.dll: the first step fails.
TEST(DirectStorageBridge, AMissingCapabilityIsNamedWithItsStep) {
  if (shim::CudaDriver::get().usable) GTEST_SKIP() << "a CUDA driver runs here";
  std::string error;
  EXPECT_EQ(detail::directstorage_bridge(0, error), nullptr);
  for (const char* words :
       {"DirectStorage to cuda:0", "step 1 of 11", "cuDeviceGetLuid", "nvcuda.dll"})
    EXPECT_NE(error.find(words), std::string::npos) << words << " missing from: " << error;
  std::string again;
  EXPECT_EQ(detail::directstorage_bridge(0, again), nullptr);  // remembered, not retried
  EXPECT_EQ(again, error);
  EXPECT_EQ(directstorage_facts().cuda0_bridge, error);
}
#endif

}  // namespace
}  // namespace ferry
