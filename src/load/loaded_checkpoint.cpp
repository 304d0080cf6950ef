#include "ferry/loaded_checkpoint.hpp"

#include <chrono>
#include <unordered_set>

#include "cuda/cuda_resources.hpp"
#include "cuda/device_memory_cache.hpp"
#include "ferry/error.hpp"
#include "ferry/transfer.hpp"
#include "load/load_plan.hpp"
#include "load/settings.hpp"
#include "load/ticket_wait.hpp"
#include "services/pinned_pool.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

// Turns each planned chunk into one extent: its copies become memory spans (holes the plan reads
// through become spans without memory), merged where both the file bytes and the destination
// are contiguous (consecutive tensors of a checkpoint usually are).
std::vector<Extent> resolve(const LoadPlan& plan, const std::vector<std::uintptr_t>& addresses,
                            const Device& device) {
  std::vector<Extent> out;
  out.reserve(plan.chunks.size());
  for (const ReadChunk& c : plan.chunks) {
    Extent x{c.file_index, c.file_offset, {}};
    std::uint64_t at = 0;  // chunk bytes covered so far
    for (const CopySegment& s : c.copies) {
      const std::uintptr_t dst = addresses[s.tensor] + s.tensor_offset;
      if (s.chunk_offset > at) x.spans.push_back({Device::cpu(), nullptr, s.chunk_offset - at});
      auto* last = x.spans.empty() ? nullptr : &x.spans.back();
      if (last && last->data && s.chunk_offset == at &&
          reinterpret_cast<std::uintptr_t>(last->data) + last->size == dst) {
        last->size += s.size;
      } else {
        x.spans.push_back({device, reinterpret_cast<void*>(dst), s.size});
      }
      at = s.chunk_offset + s.size;
    }
    if (c.size > at) x.spans.push_back({Device::cpu(), nullptr, c.size - at});
    out.push_back(std::move(x));
  }
  return out;
}

std::shared_ptr<detail::PrimaryContext> context_for(const Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_shared<detail::PrimaryContext>(device.index);
}

// Submits a load's extents to the transfer core. `own` is ferry's destination allocation,
// registered with cuFile for the load; empty for caller-owned destinations.
Ticket submit_load(const Checkpoint& checkpoint, std::vector<Extent> extents,
                   const detail::EngineSettings& settings, const LoadOptions& options,
                   std::uintptr_t own_base, std::uint64_t own_bytes) {
  TransferOptions t = detail::staging_options(settings, options);
  t.backend = options.backend;
  t.allow_compat = options.allow_compat;
  t.io = options.io;
  t.stop_at_first_error = true;  // a load fails whole: no need to read the rest
  t.progress = options.progress;
  t.profile_copies = options.profile;
  // ferry's own allocation is registered with cuFile for the load where cuFile serves it.
  t.destination = {options.device, reinterpret_cast<void*>(own_base), own_bytes};
  return submit(checkpoint.shared_file_set(), Direction::FileToMemory, std::move(extents), t);
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Waits for a load's submission (every copy out of staging has finished when the wait returns,
// even on failure) and completes its statistics, the timeline included.
void finish_load(Ticket& ticket, const std::string& settings_source, const LoadOptions& options,
                 LoadStats& stats, Clock::time_point started, Clock::time_point submitting) {
  detail::wait_for_load(ticket, options);
  const TransferStats& ts = ticket.stats();
  const double submitted = seconds_between(started, submitting);
  // From the load's start to the submission: plan, allocation and the route.
  stats.submit_seconds = submitted + ts.route_seconds;
  stats.timeline.emplace_back("submitted", stats.submit_seconds);
  stats.reader_threads = ts.threads;
  stats.chunk_bytes = ts.chunk_bytes;
  if (ts.backend == "staged") {
    stats.slots_per_thread = ts.slots_per_thread;
    stats.settings_source = settings_source;
    if (!ts.note.empty() && ts.note != ts.route_note) stats.settings_source += "; " + ts.note;
    stats.staging_bytes = ts.staging_bytes;
    stats.staging_pinned = ts.staging_pinned;
    stats.staging_seconds = ts.staging_seconds;
    stats.setup_thread_seconds = ts.setup_thread_seconds;
    stats.read_thread_seconds = ts.read_thread_seconds;
    stats.wait_thread_seconds = ts.wait_thread_seconds;
    stats.queue_thread_seconds = ts.queue_thread_seconds;
    stats.pipeline = ts.pipeline;
    add_pipeline_phases(ts.pipeline, stats.submit_seconds, stats.timeline);
  }
  stats.bytes_from_registered_page_cache = ts.bytes_from_registered_page_cache;
  stats.page_cache_register_seconds = ts.page_cache_register_seconds;
  stats.files = ts.files;
  for (const auto& f : stats.files) stats.bytes_read += f.bytes_read;
  if (!ts.route_note.empty())
    for (auto& f : stats.files) f.reason += "; " + ts.route_note;
  stats.seconds = seconds_between(started, Clock::now());
  stats.timeline.emplace_back("done", stats.seconds);
}

PlanOptions plan_options(const detail::EngineSettings& settings) {
  PlanOptions p;
  p.chunk_bytes = settings.chunk_bytes;
  return p;
}

}  // namespace

void release_staging_memory() { detail::staging_pool().release_idle(); }

std::uint64_t release_cached_device_memory() { return detail::trim_device_memory_caches(); }

const LoadedTensor* LoadedCheckpoint::find(std::string_view name) const {
  auto it = _by_name.find(std::string(name));
  return it == _by_name.end() ? nullptr : &_tensors[it->second];
}

PendingLoad start_load(std::shared_ptr<const Checkpoint> checkpoint, const LoadOptions& options) {
  FERRY_EXPECT(checkpoint != nullptr, std::invalid_argument, "load: no checkpoint given");
  auto context = context_for(options.device);  // before the clock: CUDA start-up is not I/O
  const ActiveTuning tuning = detail::tuning_for(options);  // read once, passed down
  PendingLoad pending;
  pending._started = Clock::now();
  pending._options = options;
  detail::EngineSettings settings = detail::choose_settings(options, tuning);
  pending._settings_source = settings.source;
  LoadPlan plan = plan_load(*checkpoint, options.names, plan_options(settings));

  LoadedCheckpoint& result = pending._loaded;
  LoadStats& stats = result._stats;
  result._checkpoint = checkpoint;
  result._device = options.device;
  const auto allocating = Clock::now();
  stats.timeline.emplace_back("planned", seconds_between(pending._started, allocating));
  if (!context) {
    result._memory = detail::allocate_host_memory(plan.dest_bytes);
  } else if (options.cache_device_memory) {
    result._memory = detail::allocate_cached_device_memory(context, plan.dest_bytes);
  } else {
    result._memory = detail::allocate_device_memory(context, plan.dest_bytes);
  }
  const auto allocated = Clock::now();
  stats.allocate_seconds = seconds_between(allocating, allocated);
  stats.timeline.emplace_back("allocated", seconds_between(pending._started, allocated));
  const auto base = reinterpret_cast<std::uintptr_t>(result._memory.get());
  std::vector<std::uintptr_t> addresses;
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    addresses.push_back(base + plan.dest_offsets[i]);
    result._tensors.push_back({plan.tensors[i], reinterpret_cast<void*>(addresses.back())});
    result._by_name.emplace(plan.tensors[i]->name, i);
  }
  stats.device = options.device.to_string();
  stats.tensor_bytes = plan.tensor_bytes;
  stats.allocated_bytes = plan.dest_bytes;
  pending._submitting = Clock::now();
  pending._ticket = submit_load(*checkpoint, resolve(plan, addresses, options.device), settings,
                                options, base, plan.dest_bytes);
  return pending;
}

PendingLoad::~PendingLoad() {
  if (!_waited) _ticket.cancel();  // then ~Ticket waits for the copies to stop
}

LoadedCheckpoint PendingLoad::wait() {
  FERRY_EXPECT(!_waited, std::logic_error, "load: waited for already");
  _waited = true;
  finish_load(_ticket, _settings_source, _options, _loaded._stats, _started, _submitting);
  return std::move(_loaded);
}

LoadedCheckpoint load(std::shared_ptr<const Checkpoint> checkpoint, const LoadOptions& options) {
  return start_load(std::move(checkpoint), options).wait();
}

LoadStats load_into(const Checkpoint& checkpoint, std::span<const TensorDestination> destinations,
                    const LoadOptions& options) {
  auto context = context_for(options.device);
  const ActiveTuning tuning = detail::tuning_for(options);  // read once, passed down
  const auto started = Clock::now();
  std::vector<std::string> names;
  std::unordered_map<std::string, const TensorDestination*> by_name;
  for (const auto& d : destinations) {
    FERRY_EXPECT(by_name.emplace(d.name, &d).second, std::invalid_argument, "load_into: tensor \"",
                 d.name, "\" has two destinations");
    names.push_back(d.name);
  }
  detail::EngineSettings settings = detail::choose_settings(options, tuning);
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
  const auto submitting = Clock::now();
  stats.timeline.emplace_back("planned", seconds_between(started, submitting));
  Ticket ticket = submit_load(checkpoint, resolve(plan, addresses, options.device), settings,
                              options, 0, 0);
  finish_load(ticket, settings.source, options, stats, started, submitting);
  return stats;
}

}  // namespace ferry
