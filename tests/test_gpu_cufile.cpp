// The cuFile path on a GPU: loads bit-exact with the plain host path for aligned and unaligned
// tensors, and device -> file -> device round trips of random buffers. Skipped without a GPU or
// a cuFile that opens; on machines without nvidia-fs it runs in compatibility mode, which the
// tests allow explicitly and check is what gets reported.
#include <gtest/gtest.h>

#include "cuda/cuda_resources.hpp"
#include "shim/gds_mode.hpp"
#include "ferry/error.hpp"
#include "backends/cufile/gds_file.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tensor_digest.hpp"
#include "shim/cuda_driver.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

using test::TempDir;

class GpuCuFile : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no usable GPU";
    const auto verdict = detail::driver_verdict(detail::probe_cufile());
    if (verdict.mode == detail::CuFileMode::Unavailable) GTEST_SKIP() << verdict.reason;
    gds = verdict.mode == detail::CuFileMode::Gds;
  }
  bool gds = false;
};

TEST_F(GpuCuFile, LoadsAreBitExactWithTheHostPath) {
  TempDir dir;
  std::vector<TensorSpec> specs;
  const std::uint64_t sizes[] = {3, 4096, 1, 70001, 8192, 5 << 20, 12345, 0, (3 << 20) + 7, 4095};
  for (std::size_t i = 0; i < std::size(sizes); ++i)
    specs.push_back({"c" + std::to_string(i), DType::U8, {sizes[i]}});
  auto written = test::write_random_checkpoint(dir / "m.safetensors", specs, 51);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.device = Device::cuda(0);
  options.backend = Backend::Cufile;
  options.allow_compat = true;
  auto loaded = load(ckpt, options);
  ASSERT_EQ(loaded.stats().files.size(), 1u);
  EXPECT_EQ(loaded.stats().files[0].io_path, gds ? IoPath::CufileGds : IoPath::CufileCompat);
  for (const auto& t : loaded.tensors())
    ASSERT_EQ(test::read_device(t.data, t.info->size), test::read_plain(*ckpt, *t.info)) << t.info->name;
}

TEST_F(GpuCuFile, CompatibilityModeMustBeAllowed) {
  if (gds) GTEST_SKIP() << "this machine has true GPUDirect Storage";
  TempDir dir;
  test::write_random_checkpoint(dir / "m.safetensors", {{"x", DType::U8, {100}}}, 52);
  auto ckpt = Checkpoint::open_shared(dir / "m.safetensors");
  LoadOptions options;
  options.device = Device::cuda(0);
  options.backend = Backend::Cufile;
  try {
    load(ckpt, options);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("compatibility mode"), std::string::npos) << e.what();
  }
  options.backend = Backend::Auto;  // auto never takes compatibility mode
  auto loaded = load(ckpt, options);
  EXPECT_TRUE(loaded.stats().files[0].io_path == IoPath::Buffered ||
              loaded.stats().files[0].io_path == IoPath::Direct);
  EXPECT_NE(loaded.stats().files[0].reason.find("cuFile not used"), std::string::npos);
}

TEST_F(GpuCuFile, DeviceToFileToDeviceRoundTripsAreExact) {
  TempDir dir;
  auto context = std::make_shared<detail::PrimaryContext>(0);
  const std::uint64_t size = (7 << 20) + 1234;
  auto source = detail::allocate_device_memory(context, size);
  auto target = detail::allocate_device_memory(context, size);
  auto bytes = test::random_bytes(size, 53);
  context->make_current();
  FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(source.get()), bytes.data(),
           size, nullptr);
  FERRY_CU(cuStreamSynchronize, nullptr);
  auto file = GdsFile::open(dir / "kv.bin", true, 0, true);
  EXPECT_EQ(file.io_path(), gds ? IoPath::CufileGds : IoPath::CufileCompat);
  // Aligned and unaligned file offsets, and pieces that start mid-buffer.
  for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{4096 * 3}, std::uint64_t{777}}) {
    file.write(offset, source.get(), size);
    file.read(offset, target.get(), size);
    ASSERT_EQ(test::read_device(target.get(), size), bytes) << "offset " << offset;
  }
  const std::uint64_t part = 5000;
  file.write(123, static_cast<const std::byte*>(source.get()) + 99, part);
  file.read(123, static_cast<std::byte*>(target.get()) + 1, part);
  auto back = test::read_device(static_cast<std::byte*>(target.get()) + 1, part);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin() + 99));
}

}  // namespace
}  // namespace ferry
