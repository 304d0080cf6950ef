#include "ferry/loaded_checkpoint.hpp"

#include <chrono>
#include <unordered_set>

#include "cuda/cuda_resources.hpp"
#include "transfer/cufile_engine.hpp"
#include "transfer/staged_engine.hpp"
#include "transfer/staging_cache.hpp"
#include "ferry/error.hpp"
#include "ferry/load_plan.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

// Turns plan segments into copies to absolute addresses, merging segments that are contiguous
// both in staging and in the destination (consecutive tensors of a checkpoint usually are).
std::vector<detail::EngineChunk> resolve(const LoadPlan& plan,
                                         const std::vector<std::uintptr_t>& tensor_addresses) {
  std::vector<detail::EngineChunk> out;
  out.reserve(plan.chunks.size());
  for (const ReadChunk& c : plan.chunks) {
    detail::EngineChunk e{c.file_index, c.file_offset, c.size, {}};
    for (const CopySegment& s : c.copies) {
      const std::uintptr_t dst = tensor_addresses[s.tensor] + s.tensor_offset;
      if (!e.copies.empty()) {
        auto& last = e.copies.back();
        if (last.chunk_offset + last.size == s.chunk_offset && last.destination + last.size == dst) {
          last.size += s.size;
          continue;
        }
      }
      e.copies.push_back({s.chunk_offset, dst, s.size});
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::shared_ptr<detail::PrimaryContext> context_for(const Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_shared<detail::PrimaryContext>(device.index);
}

// Runs the resolved chunks on the path choose_backend picks. `own` is ferry's destination
// allocation, registered with cuFile for the load; empty for caller-owned destinations.
void execute(std::span<const CheckpointFile> files, const std::vector<detail::EngineChunk>& chunks,
             const detail::EngineSettings& settings, const LoadOptions& options, LoadStats& stats,
             std::uintptr_t own_base, std::uint64_t own_bytes) {
  detail::BackendChoice choice = detail::choose_backend(files, options);
  if (choice.cufile) {
    detail::RegisteredBuffer registered(own_base, own_bytes);
    detail::run_cufile(files, chunks, settings, choice.verdicts, registered.base(), stats);
    return;
  }
  detail::run_staged(files, chunks, settings, stats);
  if (!choice.note.empty())
    for (auto& f : stats.files) f.reason += "; " + choice.note;
}

PlanOptions plan_options(const detail::EngineSettings& settings) {
  PlanOptions p;
  p.chunk_bytes = settings.chunk_bytes;
  return p;
}

}  // namespace

IoMode parse_io_mode(std::string_view text) {
  if (text == "auto") return IoMode::Auto;
  if (text == "direct") return IoMode::Direct;
  if (text == "buffered") return IoMode::Buffered;
  detail::fail<std::invalid_argument>("unknown I/O mode \"", text,
                                      "\": expected auto, direct or buffered");
}

Backend parse_backend(std::string_view text) {
  if (text == "auto") return Backend::Auto;
  if (text == "cufile") return Backend::Cufile;
  if (text == "posix") return Backend::Posix;
  detail::fail<std::invalid_argument>("unknown backend \"", text,
                                      "\": expected auto, cufile or posix");
}

std::string_view io_path_name(IoPath path) {
  switch (path) {
    case IoPath::Direct: return "odirect";
    case IoPath::Buffered: return "buffered";
    case IoPath::CufileGds: return "cufile-gds";
    case IoPath::CufileCompat: return "cufile-compat";
  }
  return "unknown";
}

void release_staging_memory() { detail::release_staging(); }

const LoadedTensor* LoadedCheckpoint::find(std::string_view name) const {
  auto it = _by_name.find(std::string(name));
  return it == _by_name.end() ? nullptr : &_tensors[it->second];
}

LoadedCheckpoint load(std::shared_ptr<const Checkpoint> checkpoint, const LoadOptions& options) {
  FERRY_EXPECT(checkpoint != nullptr, std::invalid_argument, "load: no checkpoint given");
  auto context = context_for(options.device);  // before the clock: CUDA start-up is not I/O
  const auto started = Clock::now();
  detail::EngineSettings settings = detail::choose_settings(options);
  settings.gpu = context.get();
  LoadPlan plan = plan_load(*checkpoint, options.names, plan_options(settings));

  LoadedCheckpoint result;
  result._checkpoint = checkpoint;
  result._device = options.device;
  const auto allocating = Clock::now();
  result._memory = context ? detail::allocate_device_memory(context, plan.dest_bytes)
                           : detail::allocate_host_memory(plan.dest_bytes);
  result._stats.allocate_seconds = std::chrono::duration<double>(Clock::now() - allocating).count();
  const auto base = reinterpret_cast<std::uintptr_t>(result._memory.get());
  std::vector<std::uintptr_t> addresses;
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    addresses.push_back(base + plan.dest_offsets[i]);
    result._tensors.push_back({plan.tensors[i], reinterpret_cast<void*>(addresses.back())});
    result._by_name.emplace(plan.tensors[i]->name, i);
  }

  LoadStats& stats = result._stats;
  stats.device = options.device.to_string();
  stats.tensor_bytes = plan.tensor_bytes;
  stats.allocated_bytes = plan.dest_bytes;
  execute(checkpoint->files(), resolve(plan, addresses), settings, options, stats, base,
          plan.dest_bytes);
  stats.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

LoadStats load_into(const Checkpoint& checkpoint, std::span<const TensorDestination> destinations,
                    const LoadOptions& options) {
  auto context = context_for(options.device);
  const auto started = Clock::now();
  std::vector<std::string> names;
  std::unordered_map<std::string, const TensorDestination*> by_name;
  for (const auto& d : destinations) {
    FERRY_EXPECT(by_name.emplace(d.name, &d).second, std::invalid_argument,
                 "load_into: tensor \"", d.name, "\" has two destinations");
    names.push_back(d.name);
  }
  detail::EngineSettings settings = detail::choose_settings(options);
  settings.gpu = context.get();
  LoadPlan plan = plan_load(checkpoint, names, plan_options(settings));
  std::vector<std::uintptr_t> addresses;
  for (const TensorInfo* t : plan.tensors) {
    const TensorDestination& d = *by_name.at(t->name);
    FERRY_EXPECT(d.data != nullptr || t->size == 0, std::invalid_argument, "load_into: tensor \"",
                 t->name, "\" has a null destination");
    FERRY_EXPECT(d.capacity >= t->size, std::invalid_argument, "load_into: tensor \"", t->name,
                 "\" needs ", t->size, " bytes but its destination holds ", d.capacity);
    addresses.push_back(reinterpret_cast<std::uintptr_t>(d.data));
  }
  LoadStats stats;
  stats.device = options.device.to_string();
  stats.tensor_bytes = plan.tensor_bytes;
  execute(checkpoint.files(), resolve(plan, addresses), settings, options, stats, 0, 0);
  stats.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return stats;
}

}  // namespace ferry
