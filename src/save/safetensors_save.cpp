#include "ferry/safetensors_save.hpp"

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "save/output_file.hpp"
#include "save/span_writer.hpp"

namespace ferry {
namespace {

struct Prepared {
  std::vector<const SaveTensor*> ordered;  // safetensors' order
  EncodedSafetensorsHeader header;
};

Prepared prepare(std::span<const SaveTensor> tensors,
                 const std::optional<SafetensorsMetadata>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back(t.spec);
  Prepared out;
  std::vector<TensorSpec> ordered_specs;
  ordered_specs.reserve(specs.size());
  for (std::size_t i : safetensors_write_order(specs)) {
    out.ordered.push_back(&tensors[i]);
    ordered_specs.push_back(std::move(specs[i]));
  }
  out.header = encode_safetensors_header(ordered_specs, metadata);
  for (std::size_t i = 0; i < out.ordered.size(); ++i) {
    const SaveTensor& t = *out.ordered[i];
    FERRY_EXPECT(t.size == out.header.layout[i].size, std::invalid_argument, "tensor \"",
                 t.spec.name, "\": ", t.size, " bytes given, but ", dtype_name(t.spec.dtype),
                 " of this shape takes ", out.header.layout[i].size);
    FERRY_EXPECT(t.data != nullptr || t.size == 0, std::invalid_argument, "tensor \"", t.spec.name,
                 "\" has no data");
  }
  return out;
}

}  // namespace

SaveStats save_safetensors(const std::filesystem::path& path, std::span<const SaveTensor> tensors,
                           const std::optional<SafetensorsMetadata>& metadata,
                           const SaveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Prepared prepared;
  try {
    prepared = prepare(tensors, metadata);
  } catch (const std::invalid_argument& e) {
    detail::fail<std::invalid_argument>(path.string(), ": ", e.what());
  }
  std::vector<detail::MemorySpan> spans;
  spans.reserve(prepared.ordered.size() + 1);
  spans.push_back({reinterpret_cast<const std::byte*>(prepared.header.bytes.data()),
                   prepared.header.bytes.size(), -1});
  for (const SaveTensor* t : prepared.ordered)
    spans.push_back({static_cast<const std::byte*>(t->data), t->size,
                     t->device.is_cuda() ? t->device.index : -1});

  detail::OutputFile file(path);
  const auto written = detail::write_spans(
      file, spans,
      {options.direct, options.staging_bytes, options.piece_bytes, options.writer_threads});
  file.commit(prepared.header.file_size);

  SaveStats stats;
  stats.file_bytes = prepared.header.file_size;
  stats.io_path = written.direct ? "direct" : "buffered";
  stats.io_reason = written.io_reason;
  stats.staging_bytes = written.staging_bytes;
  stats.pinned = written.pinned;
  stats.fill_seconds = written.fill_seconds;
  stats.wait_seconds = written.wait_seconds;
  stats.write_seconds = written.write_seconds;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

void serialize_safetensors(std::span<const SaveTensor> tensors,
                           const std::optional<SafetensorsMetadata>& metadata,
                           const std::function<std::byte*(std::uint64_t)>& allocate) {
  const Prepared prepared = prepare(tensors, metadata);
  std::byte* out = allocate(prepared.header.file_size);
  std::memcpy(out, prepared.header.bytes.data(), prepared.header.bytes.size());
  std::map<int, std::unique_ptr<detail::PrimaryContext>> contexts;
  for (std::size_t i = 0; i < prepared.ordered.size(); ++i) {
    const SaveTensor& t = *prepared.ordered[i];
    std::byte* to = out + prepared.header.layout[i].offset;
    if (t.size == 0) continue;
    if (!t.device.is_cuda()) {
      std::memcpy(to, t.data, t.size);
      continue;
    }
    auto& context = contexts[t.device.index];
    if (!context) context = std::make_unique<detail::PrimaryContext>(t.device.index);
    context->make_current();
    FERRY_CU(cuMemcpyDtoH, to, reinterpret_cast<shim::cu::DevicePtr>(t.data), t.size);
  }
}

}  // namespace ferry
