#include "kv/block_hasher.hpp"

#include <algorithm>
#include <optional>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"

namespace ferry::detail::kv {
namespace {

constexpr std::uint64_t kChunkBytes = 4ull << 20;

// The device's context, made current: the members made after it belong to it.
const PrimaryContext& current(int ordinal) {
  const PrimaryContext& context = device_context(ordinal);
  context.make_current();
  return context;
}

}  // namespace

struct BlockHasher::DeviceState {
  explicit DeviceState(int ordinal) : context(current(ordinal)) {
    for (auto& b : buffers) b = HostBuffer(kChunkBytes, &context);
  }
  const PrimaryContext& context;
  std::unique_ptr<Stream> stream = std::make_unique<Stream>();
  Event landed[2];
  HostBuffer buffers[2];
  unsigned next = 0;
};

BlockHasher::BlockHasher() = default;
BlockHasher::~BlockHasher() = default;

BlockHasher::DeviceState& BlockHasher::device(int ordinal) {
  auto& state = _devices[ordinal];
  if (!state) state = std::make_unique<DeviceState>(ordinal);
  state->context.make_current();
  return *state;
}

std::uint64_t BlockHasher::hash(std::span<const BlockSpan> pieces, void* after_event) {
  StreamingHash state;
  // A chunk copied down but not hashed yet.
  struct Pending {
    DeviceState* device;
    unsigned buffer;
    std::uint64_t size;
  };
  std::optional<Pending> pending;
  const auto flush = [&] {
    if (!pending) return;
    pending->device->context.make_current();
    pending->device->landed[pending->buffer].synchronize();
    state.update(pending->device->buffers[pending->buffer].data(), pending->size);
    pending.reset();
  };
  std::map<int, bool> ordered;  // devices whose stream already waits for after_event
  try {
    for (const BlockSpan& piece : pieces) {
      if (!piece.device.is_cuda()) {
        flush();
        state.update(piece.data, piece.size);
        continue;
      }
      for (std::uint64_t at = 0; at < piece.size; at += kChunkBytes) {
        const std::uint64_t n = std::min(kChunkBytes, piece.size - at);
        DeviceState& d = device(piece.device.index);
        if (after_event && !ordered[piece.device.index]) {
          FERRY_CU(cuStreamWaitEvent, d.stream->get(), static_cast<shim::cu::Event>(after_event),
                   0);
          ordered[piece.device.index] = true;
        }
        const unsigned b = d.next;
        d.next ^= 1;
        FERRY_CU(cuMemcpyDtoHAsync, d.buffers[b].data(),
                 reinterpret_cast<shim::cu::DevicePtr>(piece.data) + at, n, d.stream->get());
        d.landed[b].record(*d.stream);
        flush();
        pending = Pending{&d, b, n};
      }
    }
    flush();
  } catch (...) {
    // Copies still queued write into the buffers: let them land before anyone reuses them.
    for (auto& [ordinal, d] : _devices) {
      d->context.make_current();
      shim::CudaDriver::get().cuStreamSynchronize(d->stream->get());
    }
    throw;
  }
  return state.digest();
}

}  // namespace ferry::detail::kv
