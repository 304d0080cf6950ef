// Saving GPU tensors: the streamed device -> pinned -> file path gives the same bytes as the
// host path. Skipped where no CUDA device is usable.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <memory>

#include "cuda/cuda_resources.hpp"
#include "ferry/device.hpp"
#include "ferry/safetensors_save.hpp"
#include "shim/cuda_driver.hpp"
#include "test_support.hpp"

namespace ferry {
namespace {

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(GpuSave, DeviceTensorsStreamToTheSameBytesAsHostTensors) {
  if (!cuda_available()) GTEST_SKIP() << "no usable GPU: " << shim::CudaDriver::get().why_unusable;
  auto context = std::make_shared<detail::PrimaryContext>(0);
  context->make_current();
  detail::Stream stream;
  const std::vector<TensorSpec> specs = {
      {"a", DType::BF16, {4096, 513}}, {"b", DType::F32, {}},
      {"c", DType::U8, {0}},           {"d", DType::F8_E4M3, {70001}},
      {"e", DType::I64, {3, 5}},       {"f", DType::U8, {(9u << 20) + 3}}};
  std::vector<std::vector<std::byte>> host;
  std::vector<std::shared_ptr<void>> device;
  std::vector<SaveTensor> on_host, on_gpu, mixed;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto size = *tensor_byte_size(specs[i].dtype, specs[i].shape);
    host.push_back(test::random_bytes(size, 100 + i));
    device.push_back(detail::allocate_device_memory(context, size));
    if (size)
      FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(device.back().get()),
               host.back().data(), size, stream.get());
    on_host.push_back({specs[i], host.back().data(), size, Device::cpu()});
    on_gpu.push_back({specs[i], device.back().get(), size, Device::cuda(0)});
    mixed.push_back(i % 2 ? on_gpu.back() : on_host.back());
  }
  stream.synchronize();
  const SafetensorsMetadata metadata{{"format", "pt"}};
  std::string expected;
  serialize_safetensors(on_host, metadata, [&](std::uint64_t n) {
    expected.resize(n);
    return reinterpret_cast<std::byte*>(expected.data());
  });
  std::string from_gpu;
  serialize_safetensors(on_gpu, metadata, [&](std::uint64_t n) {
    from_gpu.resize(n);
    return reinterpret_cast<std::byte*>(from_gpu.data());
  });
  EXPECT_EQ(from_gpu, expected);

  test::TempDir dir;
  for (const auto* tensors : {&on_gpu, &mixed})
    for (const SaveOptions options : {SaveOptions{}, SaveOptions{true, 8192, 4096, 3},
                                      SaveOptions{false, 1u << 20, 256u << 10, 2}}) {
      const auto path = dir / "g.safetensors";
      const auto stats = save_safetensors(path, *tensors, metadata, options);
      ASSERT_EQ(read_all(path), expected) << "piece " << options.piece_bytes;
      EXPECT_TRUE(stats.pinned);
      EXPECT_LE(stats.staging_bytes,
                std::max<std::uint64_t>(options.staging_bytes, 2 * options.piece_bytes));
    }
}

}  // namespace
}  // namespace ferry
