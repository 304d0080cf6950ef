#include "stream/slot_filler.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "ferry/error.hpp"

namespace ferry {

namespace {
constexpr std::uint64_t kTensorAlignment = 256;  // cuMemAlloc's, and what kernels assume
constexpr std::uint64_t kArenaAlignment = 4096;
// A gap between two tensors of a group in one file up to this is read through (a hole) rather
// than starting a second read: the load planner's rule.
constexpr std::uint64_t kMaxHole = 1ull << 20;

std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
}  // namespace

SlotLayout slot_layout(const StreamGroup& group) {
  SlotLayout layout;
  for (const auto& t : group.tensors) {
    layout.bytes = align_up(layout.bytes, kTensorAlignment);
    layout.offsets.push_back(layout.bytes);
    layout.bytes += t.size;
  }
  return layout;
}

namespace detail {
namespace {

shim::cu::Stream cu_stream(void* stream) { return static_cast<shim::cu::Stream>(stream); }

// One group's file extents: its tensors in file order, neighbours in one file merged into one
// extent (reading through gaps up to kMaxHole), spans merged where the slot is contiguous too.
std::vector<Extent> group_extents(const StreamGroup& group, const SlotLayout& layout,
                                  const FileSet& files, const Device& device, std::size_t index) {
  std::vector<std::size_t> order(group.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = group.tensors[a];
    const auto& y = group.tensors[b];
    return std::pair(x.file, x.file_offset) < std::pair(y.file, y.file_offset);
  });
  std::vector<Extent> out;
  std::uint64_t end = 0;  // file end of the last extent
  for (std::size_t i : order) {
    const auto& t = group.tensors[i];
    FERRY_EXPECT(t.file < files.size(), std::invalid_argument, "weight stream: group ", index,
                 " tensor ", i, " names file ", t.file, " of a set of ", files.size());
    const std::uint64_t file_size = files.size_at_open(t.file);
    FERRY_EXPECT(t.file_offset <= file_size && t.size <= file_size - t.file_offset,
                 std::invalid_argument, "weight stream: group ", index, " tensor ", i, ": bytes ",
                 t.file_offset, "+", t.size, " lie past the end of ", files.path(t.file).string(),
                 " (", file_size, " bytes)");
    if (t.size == 0) continue;
    const std::uint64_t at = layout.offsets[i];
    const bool joins = !out.empty() && out.back().file == t.file && t.file_offset >= end &&
                       t.file_offset - end <= kMaxHole;
    if (!joins) {
      out.push_back({t.file, t.file_offset, {}});
    } else if (t.file_offset > end) {
      out.back().spans.push_back({Device::cpu(), nullptr, t.file_offset - end});  // a hole
    }
    auto& spans = out.back().spans;
    // Span data holds the offset in the slot until a fill adds the slot's address.
    const bool contiguous =
        t.file_offset == end && !spans.empty() && spans.back().data &&
        reinterpret_cast<std::uintptr_t>(spans.back().data) + spans.back().size == at;
    if (contiguous) {
      spans.back().size += t.size;
    } else {
      // Offset 0 must still be told from a hole: offsets are stored plus one.
      spans.push_back({device, reinterpret_cast<void*>(at + 1), t.size});
    }
    end = t.file_offset + t.size;
  }
  return out;
}

}  // namespace

SlotFiller::SlotFiller(std::vector<StreamGroup> groups, StreamOptions options)
    : _options(std::move(options)) {
  FERRY_EXPECT(!groups.empty(), std::invalid_argument, "weight stream: no groups given");
  std::uint64_t arena_bytes = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    _layouts.push_back(slot_layout(groups[g]));
    FERRY_EXPECT(_layouts.back().bytes > 0, std::invalid_argument, "weight stream: group ", g,
                 " holds no bytes");
    _arena_offsets.push_back(arena_bytes);
    arena_bytes = align_up(arena_bytes + _layouts.back().bytes, kArenaAlignment);
  }
  const bool gpu = _options.device.is_cuda();
  if (gpu) {
    make_current();
    _copy_stream = std::make_unique<Stream>();
  }
  if (_options.source == StreamSource::Files) {
    FERRY_EXPECT(_options.files != nullptr, std::invalid_argument,
                 "weight stream: the Files source needs a file set");
    for (std::size_t g = 0; g < groups.size(); ++g)
      _extents.push_back(
          group_extents(groups[g], _layouts[g], *_options.files, _options.device, g));
    _arena_offsets.clear();
    return;
  }
  _arena = HostBuffer(arena_bytes, gpu ? &device_context(_options.device.index) : nullptr);
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t t = 0; t < groups[g].tensors.size(); ++t)
      if (const void* bytes = groups[g].tensors[t].host)
        std::memcpy(host_address(g, t), bytes, groups[g].tensors[t].size);
}

SlotFiller::~SlotFiller() = default;

void* SlotFiller::host_address(std::size_t group, std::size_t tensor) const {
  FERRY_EXPECT(_options.source == StreamSource::Host, std::invalid_argument,
               "weight stream: only the Host source has host addresses");
  FERRY_EXPECT(group < _layouts.size(), std::invalid_argument, "weight stream: group ", group,
               " of ", _layouts.size());
  const auto& offsets = _layouts[group].offsets;
  FERRY_EXPECT(tensor < offsets.size(), std::invalid_argument, "weight stream: group ", group,
               " has no tensor ", tensor);
  return _arena.data() + _arena_offsets[group] + offsets[tensor];
}

void SlotFiller::make_current() const {
  if (_options.device.is_cuda()) device_context(_options.device.index).make_current();
}

bool SlotFiller::capturing(void* compute_stream) const {
  if (!_options.device.is_cuda()) return false;
  int status = 0;
  FERRY_CU(cuStreamIsCapturing, cu_stream(compute_stream), &status);
  return status != 0;
}

void SlotFiller::refuse_capture(bool captured) const {
  FERRY_EXPECT(!captured, std::invalid_argument,
               "weight stream: a stream reading checkpoint files cannot be captured in a CUDA "
               "graph (its reads run on the host); use the host (pinned memory) source");
}

void SlotFiller::init_slot(Slot& slot, std::uintptr_t memory, std::uint64_t bytes,
                           std::vector<std::shared_ptr<void>>& owned) {
  if (memory == 0) {
    auto block =
        _options.device.is_cuda()
            ? allocate_device_memory(std::make_shared<PrimaryContext>(_options.device.index), bytes)
            : allocate_host_memory(bytes);
    memory = reinterpret_cast<std::uintptr_t>(block.get());
    owned.push_back(std::move(block));
  }
  FERRY_EXPECT(memory % kTensorAlignment == 0, std::invalid_argument,
               "weight stream: slot memory 0x", std::hex, memory, " is not 256-byte aligned");
  slot.memory = memory;
  slot.bytes = bytes;
  if (_options.device.is_cuda()) {
    make_current();
    slot.fork = std::make_unique<Event>();
    slot.ready = std::make_unique<Event>();
  }
}

void SlotFiller::fill(Slot& slot, std::size_t group, void* compute_stream) {
  const SlotLayout& layout = _layouts.at(group);
  FERRY_ASSERT(layout.bytes <= slot.bytes);
  const bool gpu = _options.device.is_cuda();
  make_current();
  const bool captured = capturing(compute_stream);
  if (_options.source == StreamSource::Files) {
    refuse_capture(captured);
    std::vector<Extent> extents = _extents[group];
    for (auto& e : extents)
      for (auto& s : e.spans)
        if (s.data)
          s.data =
              reinterpret_cast<void*>(slot.memory + reinterpret_cast<std::uintptr_t>(s.data) - 1);
    // The previous fill's workers are done with the fork event before it is recorded again.
    slot.ticket.wait();
    TransferOptions transfer = _options.transfer;
    transfer.stop_at_first_error = true;
    if (gpu) {
      FERRY_CU(cuEventRecord, slot.fork->get(), cu_stream(compute_stream));
      transfer.after_event = slot.fork->get();
    }
    slot.ticket = submit(_options.files, Direction::FileToMemory, std::move(extents), transfer);
  } else if (gpu) {
    FERRY_CU(cuEventRecord, slot.fork->get(), cu_stream(compute_stream));
    FERRY_CU(cuStreamWaitEvent, _copy_stream->get(), slot.fork->get(), 0);
    FERRY_CU(cuMemcpyHtoDAsync, slot.memory, _arena.data() + _arena_offsets[group], layout.bytes,
             _copy_stream->get());
    FERRY_CU(cuEventRecord, slot.ready->get(), _copy_stream->get());
  } else {
    std::memcpy(reinterpret_cast<void*>(slot.memory), _arena.data() + _arena_offsets[group],
                layout.bytes);
  }
  slot.group = static_cast<long>(group);
  slot.ready_pending = true;
  slot.in_capture = captured;
  ++_stats.fills;
  _stats.bytes += layout.bytes;
}

void SlotFiller::await(Slot& slot, void* compute_stream) {
  if (_options.source == StreamSource::Files) {
    if (_options.device.is_cuda()) {
      make_current();
      refuse_capture(capturing(compute_stream));
      slot.ticket.order_before(compute_stream);
    } else {
      slot.ticket.wait();
    }
    try {
      slot.ticket.rethrow_if_failed();
    } catch (...) {
      slot.group = -1;  // the next use reads it again
      throw;
    }
    slot.ready_pending = false;
    return;
  }
  if (!_options.device.is_cuda()) {
    slot.ready_pending = false;
    return;
  }
  make_current();
  const bool captured = capturing(compute_stream);
  if (slot.in_capture != captured) {
    // A fill from before the capture (finished: the capturing caller synchronised first) or
    // one recorded in a capture that has ended (its graph orders it): no event to wait on.
    ++_stats.skipped_waits;
    if (!captured) slot.ready_pending = false;
    return;
  }
  FERRY_CU(cuStreamWaitEvent, cu_stream(compute_stream), slot.ready->get(), 0);
  slot.ready_pending = false;
}

void SlotFiller::join(Slot& slot, void* compute_stream) {
  if (!slot.ready_pending || !slot.in_capture || !capturing(compute_stream)) return;
  make_current();
  FERRY_CU(cuStreamWaitEvent, cu_stream(compute_stream), slot.ready->get(), 0);
  slot.ready_pending = false;
}

void SlotFiller::synchronize(Slot& slot) noexcept {
  slot.ticket.wait();
  if (slot.ready && !slot.in_capture) shim::CudaDriver::get().cuEventSynchronize(slot.ready->get());
}

}  // namespace detail
}  // namespace ferry
