// The DirectStorage backend's path into GPU memory, run under Wine against stand-ins for every
// library it loads (tests/fake_gpu: nvcuda.dll, d3d12.dll, dxgi.dll; tests/fake_dstorage:
// dstorage.dll), all beside this test only: the bridge's eleven steps (the adapter chosen by
// LUID, not the default one), then loads whose batches alternate between the shared buffer's
// halves, each ordered by the shared fence before the device-to-device copies, bit-exact; and a
// failed request reported. The stand-in GPU's memory is host memory: this checks ferry's logic
// and the order of its calls, not NVIDIA's or Microsoft's code. Windows only.
#include <gtest/gtest.h>

#include "ferry/loaded_checkpoint.hpp"
#include "ferry/machine.hpp"
#include "test_support.hpp"
#include "backends/dstorage/dstorage_bridge.hpp"

namespace ferry {
namespace {

LoadOptions directstorage_to_gpu() {
  LoadOptions options;
  set_load_option(options, "backend", "directstorage");
  set_load_option(options, "device", "cuda:0");
  return options;
}

TEST(DirectStorageBridgeFake, TheBridgeIsBuiltOnTheCudaDevicesAdapter) {
  std::string error;
  const detail::DirectStorageBridge* bridge = detail::directstorage_bridge(0, error);
  ASSERT_NE(bridge, nullptr) << error;
  EXPECT_NE(bridge->adapter.find("adapter 1 (Stand-in CUDA GPU)"), std::string::npos)
      << bridge->adapter;
  EXPECT_NE(bridge->mapped, 0u);
  EXPECT_NE(directstorage_facts().cuda0_bridge.find("ready: adapter 1"), std::string::npos)
      << directstorage_facts().cuda0_bridge;
}

TEST(DirectStorageBridgeFake, LoadsIntoGpuMemoryBitExactThroughTheSharedBuffer) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  // Four batches and more (each half holds 64 MiB): the halves are reused, pieces straddle them.
  const auto written = test::write_random_checkpoint(path,
                                                     {{"big", DType::U8, {(150u << 20) + 13}},
                                                      {"small", DType::F32, {3, 5}},
                                                      {"mid", DType::BF16, {5u << 20}},
                                                      {"tail", DType::U8, {4097}}},
                                                     17);
  auto loaded = load(Checkpoint::open_shared(path), directstorage_to_gpu());
  for (const auto& [name, bytes] : written) {
    const LoadedTensor* t = loaded.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(test::read_device(t->data, bytes.size()), bytes) << name;
  }
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  const FileLoadStats& file = loaded.stats().files[0];
  EXPECT_EQ(file.io_path, IoPath::DirectStorage);
  EXPECT_NE(file.reason.find("into a D3D12 buffer shared with CUDA"), std::string::npos)
      << file.reason;
  EXPECT_NE(file.reason.find("Stand-in CUDA GPU"), std::string::npos) << file.reason;
}

TEST(DirectStorageBridgeFake, AFailedRequestIntoTheGpuNamesTheFile) {
  test::TempDir dir;
  const auto path = dir / "fail-dstorage.safetensors";
  test::write_random_checkpoint(path, {{"a", DType::U8, {100000}}}, 5);
  try {
    load(Checkpoint::open_shared(path), directstorage_to_gpu());
    FAIL() << "a failed DirectStorage request was not reported";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    for (const char* words :
         {"fail-dstorage.safetensors", "DirectStorage read failed", "HRESULT 0x80070017"})
      EXPECT_NE(what.find(words), std::string::npos) << words << " missing from: " << what;
  }
}

}  // namespace
}  // namespace ferry
