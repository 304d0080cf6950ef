// The DirectStorage backend's host path really running under Wine, against a stand-in runtime
// (tests/fake_dstorage: dstorage.dll beside this test only): requests of at most 32 MiB, 64 MiB
// batches with one submit and one status wait each, the scatter into host memory bit-exact, and
// a failed request reported with the file and the runtime's error record. Windows only.
#include <gtest/gtest.h>

#include <cstring>

#include "ferry/loaded_checkpoint.hpp"
#include "ferry/machine.hpp"
#include "test_support.hpp"
#include "transfer/backend.hpp"

namespace ferry {
namespace {

LoadOptions directstorage_options() {
  LoadOptions options;
  set_load_option(options, "backend", "directstorage");
  return options;
}

TEST(DirectStorageFake, TheRuntimeBesideTheProgramIsFound) {
  const DirectStorageFacts facts = directstorage_facts();
  EXPECT_TRUE(facts.available) << facts.reason;
  EXPECT_NE(facts.reason.find("dstorage.dll loaded"), std::string::npos) << facts.reason;
}

// 70 MiB and more over several tensors: requests split at 32 MiB, three batches, pieces that
// straddle batches, and bytes that text mode would change (CR LF, 0x1A) among the random ones.
TEST(DirectStorageFake, LoadsToHostMemoryBitExactInBatches) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  const auto written = test::write_random_checkpoint(path,
                                                     {{"big", DType::U8, {(70u << 20) + 13}},
                                                      {"small", DType::F32, {3, 5}},
                                                      {"mid", DType::BF16, {5u << 20}},
                                                      {"tail", DType::U8, {4097}}},
                                                     11);
  auto loaded = load(Checkpoint::open_shared(path), directstorage_options());
  for (const auto& [name, bytes] : written) {
    const LoadedTensor* t = loaded.find(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->info->size, bytes.size()) << name;
    EXPECT_EQ(std::memcmp(t->data, bytes.data(), bytes.size()), 0) << name;
  }
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  const FileLoadStats& file = loaded.stats().files[0];
  EXPECT_EQ(file.io_path, IoPath::DirectStorage);
  EXPECT_NE(file.reason.find("host staging"), std::string::npos) << file.reason;
}

TEST(DirectStorageFake, AFailedRequestNamesTheFileAndTheRuntimesError) {
  test::TempDir dir;
  const auto path = dir / "fail-dstorage.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {100000}}}, 5);
  try {
    load(Checkpoint::open_shared(path), directstorage_options());
    FAIL() << "a failed DirectStorage request was not reported";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    for (const char* words : {"fail-dstorage.safetensors", "DirectStorage read failed",
                              "1 failed request(s)", "HRESULT 0x80070017"})
      EXPECT_NE(what.find(words), std::string::npos) << words << " missing from: " << what;
  }
}

// DirectStorage runs here (the stand-in), but into cuda:0 it needs the D3D12 -> CUDA bridge,
// whose first step fails under Wine (no nvcuda.dll): the route refuses with that step unless
// allow_compat lets host staging stand in.
TEST(DirectStorageFake, IntoAGpuTheRouteNamesTheBridgesFailingStep) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {1000}}}, 7);
  auto files = FileSet::create();
  files->add(path);
  TransferOptions options;
  options.backend = Backend::DirectStorage;
  try {
    detail::choose_route(*files, Device::cuda(0), options);
    FAIL() << "DirectStorage into cuda:0 was routed without its bridge";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    for (const char* words : {"step 1 of 11", "nvcuda.dll", "allow_compat"})
      EXPECT_NE(what.find(words), std::string::npos) << words << " missing from: " << what;
  }
  options.allow_compat = true;
  const detail::Route route = detail::choose_route(*files, Device::cuda(0), options);
  EXPECT_EQ(route.backend, &detail::dstorage_backend());
  const std::string reason =
      detail::dstorage_backend().probe(*files, Device::cuda(0), options).reason;
  EXPECT_NE(reason.find("into host staging: DirectStorage to cuda:0 needs a D3D12 buffer"),
            std::string::npos)
      << reason;
}

}  // namespace
}  // namespace ferry
