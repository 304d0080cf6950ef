// A GPU batch's device bounce buffer (transfer_block_io.hpp): the groups cut to fit it, the
// buffer reserved for the batch, each bounced block's run in it, and the gathers into it (a put)
// or scatters out of it (a get), one kernel launch per device where the pieces allow.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/cuda_resources.hpp"
#include "cuda/device_copies.hpp"
#include "cuda/device_kernels.hpp"
#include "ferry/error.hpp"
#include "kv/transfer_block_group.hpp"

namespace ferry::detail::kv {
namespace {

constexpr std::uint64_t kAlign = 4096;
std::uint64_t round_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Whether every piece with bytes lies in GPU `ordinal`'s memory, and there are several.
bool gatherable(const BlockRequest& r, int ordinal) {
  std::size_t n = 0;
  for (const BlockSpan& p : r.pieces) {
    if (p.size == 0) continue;
    if (!p.device.is_cuda() || p.device.index != ordinal) return false;
    ++n;
  }
  return n > 1;
}

// cuFile moves one contiguous device range: anything else goes through the bounce buffer.
bool needs_gather(const BlockRequest& r) {
  return r.pieces.size() != 1 || !r.pieces[0].device.is_cuda();
}

// One stream per device for the bounce copies, made on first use and kept (leaked with the
// process, like the transfer core's: never destroyed after the driver).
const Stream& bounce_stream(int ordinal) {
  static std::mutex mutex;
  static auto* streams = new std::map<int, std::unique_ptr<Stream>>;
  std::lock_guard lock(mutex);
  device_context(ordinal).make_current();
  auto& s = (*streams)[ordinal];
  if (!s) s = std::make_unique<Stream>();
  return *s;
}

// A stream per device and flight for a staged get's block-by-block scatters (kept, as above):
// a group's are waited for without waiting for the next group's.
const Stream& scatter_stream(int ordinal, std::size_t flight) {
  static std::mutex mutex;
  static auto* streams = new std::map<std::pair<int, std::size_t>, std::unique_ptr<Stream>>;
  std::lock_guard lock(mutex);
  device_context(ordinal).make_current();
  auto& s = (*streams)[{ordinal, flight}];
  if (!s) s = std::make_unique<Stream>();
  return *s;
}

}  // namespace

// Each device's bounce buffer grown, before any group moves, to `flights` parts as large as the
// largest group's need there (no buffer is replaced under a group in flight).
void TransferBlockIo::reserve_bounce(std::span<const std::span<BlockRequest* const>> groups,
                                     bool direct, std::size_t flights) {
  _flight_bytes.clear();
  for (const auto& group : groups) {
    std::map<int, std::uint64_t> need;
    for (BlockRequest* b : group)
      if (through_bounce(*b, direct)) need[gpu_of(*b)] += round_up(request_bytes(*b));
    for (const auto& [ordinal, bytes] : need)
      _flight_bytes[ordinal] = std::max(_flight_bytes[ordinal], bytes);
  }
  for (const auto& [ordinal, bytes] : _flight_bytes) {
    Gather& g = _gather[ordinal];
    if (g.bytes >= bytes * flights) continue;
    g.memory.reset();
    g.memory = allocate_device_memory(std::make_shared<PrimaryContext>(ordinal), bytes * flights);
    g.bytes = bytes * flights;
  }
}

// Groups whose bounced blocks fit `group_bytes` (a block larger alone is a group of its own).
std::vector<std::span<BlockRequest* const>> TransferBlockIo::cut_groups(
    std::span<BlockRequest* const> blocks, bool direct, std::uint64_t group_bytes) {
  std::vector<std::span<BlockRequest* const>> groups;
  std::size_t start = 0;
  std::uint64_t need = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::uint64_t n =
        through_bounce(*blocks[i], direct) ? round_up(request_bytes(*blocks[i])) : 0;
    if (i > start && need + n > group_bytes) {
      groups.push_back(blocks.subspan(start, i - start));
      start = i;
      need = 0;
    }
    need += n;
  }
  groups.push_back(blocks.subspan(start));
  return groups;
}

bool TransferBlockIo::through_bounce(const BlockRequest& r, bool direct) {
  if (direct) return needs_gather(r);
  // Staged: several pieces all on one GPU go as one run (large copies to and from host staging
  // instead of one per piece), where ferry's kernels can gather and scatter them.
  const int ordinal = gpu_of(r);
  return ordinal >= 0 && gatherable(r, ordinal) && kernels_usable(ordinal);
}

bool TransferBlockIo::kernels_usable(int ordinal) {
  auto it = _no_kernels.find(ordinal);
  if (it == _no_kernels.end())
    it = _no_kernels.emplace(ordinal, device_kernels_unavailable(ordinal)).first;
  return it->second.empty();
}

void TransferBlockIo::place_in_bounce(Group& g) {
  g.bounce.assign(g.blocks.size(), 0);
  std::map<int, std::uint64_t> need;
  std::vector<std::uint64_t> at(g.blocks.size(), 0);
  for (std::size_t i = 0; i < g.blocks.size(); ++i)
    if (through_bounce(*g.blocks[i], g.direct)) {
      const int ordinal = gpu_of(*g.blocks[i]);
      at[i] = need[ordinal];
      need[ordinal] += round_up(request_bytes(*g.blocks[i]));
    }
  std::map<int, std::uintptr_t> base;
  for (const auto& [ordinal, bytes] : need) base[ordinal] = bounce_part(ordinal, g.flight, bytes);
  g.views.assign(g.blocks.size(), {});
  // The reason is the same for blocks of as many pieces (the engines' are all alike): built once.
  std::string bounced;
  std::size_t bounced_pieces = 0;
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    BlockRequest& r = *g.blocks[i];
    if (through_bounce(r, g.direct)) {
      g.bounce[i] = base[gpu_of(r)] + at[i];
      g.views[i] = {
          {reinterpret_cast<void*>(g.bounce[i]), request_bytes(r), Device::cuda(gpu_of(r))}};
      if (r.pieces.size() > 1 && r.pieces.size() != bounced_pieces) {
        bounced_pieces = r.pieces.size();
        bounced = concat("its ", r.pieces.size(), " pieces ",
                         g.writing ? "gathered into" : "scattered from",
                         " one run of a device bounce buffer (",
                         g.writing || g.direct ? "one kernel launch per batch"
                                               : "once verified: a kernel launch per block as it "
                                                 "lands, else one per batch",
                         ")");
      }
      if (r.pieces.size() > 1) add_route_reason(r, bounced);
    } else {
      g.views[i].assign(r.pieces.begin(), r.pieces.end());
      if (!g.direct && r.pieces.size() > 1 && gpu_of(r) >= 0 && gatherable(r, gpu_of(r)))
        add_route_reason(r, concat("its ", r.pieces.size(),
                                   " pieces moved one copy each: ", _no_kernels[gpu_of(r)]));
    }
  }
}

void TransferBlockIo::bounce_copies(Group& g, bool into_bounce, void* after_event) {
  std::map<int, std::vector<DeviceCopy>> tables;  // all-GPU blocks: one launch per device
  std::map<int, bool> used;
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    const BlockRequest& r = *g.blocks[i];
    if (!g.bounce[i] || (!into_bounce && r.outcome != BlockOutcome::ok)) continue;
    if (!into_bounce && !g.scattered.empty() && g.scattered[i]) continue;
    const int ordinal = gpu_of(r);
    const Stream& stream = bounce_stream(ordinal);
    if (into_bounce && after_event && !used[ordinal])
      FERRY_CU(cuStreamWaitEvent, stream.get(), static_cast<shim::cu::Event>(after_event), 0);
    used[ordinal] = true;
    const bool by_kernel = gatherable(r, ordinal) && kernels_usable(ordinal);
    std::uintptr_t at = g.bounce[i];
    for (const BlockSpan& p : r.pieces) {
      if (p.size == 0) continue;
      const auto memory = reinterpret_cast<shim::cu::DevicePtr>(p.data);
      if (by_kernel)
        tables[ordinal].push_back(into_bounce ? DeviceCopy{memory, at, p.size}
                                              : DeviceCopy{at, memory, p.size});
      else if (into_bounce && p.device.is_cuda())
        FERRY_CU(cuMemcpyDtoDAsync, at, memory, p.size, stream.get());
      else if (into_bounce)
        FERRY_CU(cuMemcpyHtoDAsync, at, p.data, p.size, stream.get());
      else if (p.device.is_cuda())
        FERRY_CU(cuMemcpyDtoDAsync, memory, at, p.size, stream.get());
      else
        FERRY_CU(cuMemcpyDtoHAsync, p.data, at, p.size, stream.get());
      at += p.size;
    }
  }
  for (const auto& [ordinal, table] : tables)
    queue_device_copies(ordinal, table, bounce_stream(ordinal).get(), _copy_scratch[ordinal]);
  for (const auto& [ordinal, yes] : used) bounce_stream(ordinal).synchronize();
}

void TransferBlockIo::prepare_scatters(Group& g) noexcept {
  g.parts.clear();
  g.scattered.assign(g.blocks.size(), 0);
  try {
    g.parts = scatter_parts(g);
  } catch (...) {
    g.parts.clear();  // the scatter after the group takes them all, and reports its own error
  }
}

std::map<int, DeviceCopyParts> TransferBlockIo::scatter_parts(const Group& g) {
  std::map<int, std::vector<std::vector<DeviceCopy>>> tables;
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    const BlockRequest& r = *g.blocks[i];
    const int ordinal = gpu_of(r);
    if (!g.bounce[i] || !gatherable(r, ordinal) || !kernels_usable(ordinal)) continue;
    auto& table = tables[ordinal];
    table.resize(g.blocks.size());
    table[i].reserve(r.pieces.size());
    std::uintptr_t at = g.bounce[i];
    for (const BlockSpan& p : r.pieces) {
      table[i].push_back({at, reinterpret_cast<shim::cu::DevicePtr>(p.data), p.size});
      at += p.size;
    }
  }
  std::map<int, DeviceCopyParts> parts;
  for (const auto& [ordinal, table] : tables)
    parts[ordinal] = upload_copy_parts(ordinal, table, scatter_stream(ordinal, g.flight).get(),
                                       _part_tables[{ordinal, g.flight}]);
  return parts;
}

void TransferBlockIo::scatter_block(Group& g, std::size_t i, void* event) noexcept {
  try {
    const int ordinal = gpu_of(*g.blocks[i]);
    const auto parts = g.parts.find(ordinal);
    if (parts == g.parts.end()) return;
    const Stream& stream = scatter_stream(ordinal, g.flight);
    FERRY_CU(cuStreamWaitEvent, stream.get(), static_cast<shim::cu::Event>(event), 0);
    queue_copy_part(parts->second, i, stream.get());
    g.scattered[i] = 1;
  } catch (...) {
    // Not scattered: the scatter after the group moves it (and reports an error of its own).
  }
}

void TransferBlockIo::wait_scatters(const Group& g) {
  for (const auto& [ordinal, parts] : g.parts) scatter_stream(ordinal, g.flight).synchronize();
}

std::uintptr_t TransferBlockIo::bounce_part(int ordinal, std::size_t flight, std::uint64_t bytes) {
  const std::uint64_t part = _flight_bytes.at(ordinal);
  const Gather& g = _gather.at(ordinal);
  FERRY_ASSERT(bytes <= part && (flight + 1) * part <= g.bytes);
  return reinterpret_cast<std::uintptr_t>(g.memory.get()) + flight * part;
}

}  // namespace ferry::detail::kv
