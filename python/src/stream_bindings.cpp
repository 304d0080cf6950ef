// ferry._ferry.WeightStream and ExpertCache: weight streaming for ferry/_offload.py. Groups
// arrive as lists of (bytes, host address, file index, file offset); compute streams as the
// integer a torch.cuda.Stream's cuda_stream gives. The GIL is released where a call may wait
// for file reads.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/expert_cache.hpp"
#include "ferry/stream_plan.hpp"
#include "ferry/weight_stream.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry {
namespace {

using PyTensor = std::tuple<std::uint64_t, std::uintptr_t, std::uint32_t, std::uint64_t>;
using PyGroups = std::vector<std::vector<PyTensor>>;

std::vector<StreamGroup> to_groups(const PyGroups& groups) {
  std::vector<StreamGroup> out;
  out.reserve(groups.size());
  for (const auto& g : groups) {
    StreamGroup group;
    for (const auto& [size, host, file, offset] : g)
      group.tensors.push_back({size, reinterpret_cast<const void*>(host), file, offset});
    out.push_back(std::move(group));
  }
  return out;
}

StreamOptions to_options(const std::string& device, const Checkpoint* checkpoint,
                         const std::string& io) {
  StreamOptions options;
  options.device = Device::parse(device);
  if (checkpoint != nullptr) {
    options.source = StreamSource::Files;
    options.files = checkpoint->shared_file_set();
  }
  if (io == "direct") {
    options.transfer.io = IoMode::Direct;
  } else if (io == "buffered") {
    options.transfer.io = IoMode::Buffered;
  } else {
    FERRY_EXPECT(io == "auto", std::invalid_argument, "io must be auto, direct or buffered, not ",
                 io);
  }
  return options;
}

void* as_stream(std::uintptr_t stream) { return reinterpret_cast<void*>(stream); }

nb::dict stats_dict(const StreamStats& s) {
  nb::dict d;
  d["fills"] = s.fills;
  d["bytes"] = s.bytes;
  d["demand_fills"] = s.demand_fills;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["evictions"] = s.evictions;
  d["skipped_waits"] = s.skipped_waits;
  return d;
}

}  // namespace

void bind_stream(nb::module_& m) {
  using Release = nb::call_guard<nb::gil_scoped_release>;
  m.def("every_nth_blocks", &every_nth_blocks, "count"_a, "group_size"_a, "last"_a);
  m.def(
      "plan_stream",
      [](std::vector<std::uint64_t> block_bytes, std::vector<double> block_seconds,
         std::uint64_t other_bytes, double link, unsigned prefetch,
         std::optional<std::vector<std::size_t>> streamed,
         std::optional<std::uint64_t> gpu_budget) {
        StreamPlanInput input{std::move(block_bytes), std::move(block_seconds), other_bytes, link,
                              prefetch};
        FERRY_EXPECT(streamed.has_value() != gpu_budget.has_value(), std::invalid_argument,
                     "plan_stream: give streamed or gpu_budget");
        const StreamPlan p =
            streamed ? plan_stream(input, *streamed) : plan_for_budget(input, *gpu_budget);
        nb::dict d;
        d["streamed"] = p.streamed;
        d["streamed_bytes"] = p.streamed_bytes;
        d["slot_bytes"] = p.slot_bytes;
        d["gpu_bytes"] = p.gpu_bytes;
        d["compute_seconds"] = p.compute_seconds;
        d["copy_seconds"] = p.copy_seconds;
        d["step_seconds"] = p.step_seconds;
        d["stall_seconds"] = p.stall_seconds;
        return d;
      },
      "block_bytes"_a, "block_seconds"_a, "other_bytes"_a, "link_bytes_per_second"_a, "prefetch"_a,
      "streamed"_a.none() = nb::none(), "gpu_budget"_a.none() = nb::none(),
      "The stream planner (ferry/stream_plan.hpp): a dict of the plan.");
  m.def(
      "slot_offsets",
      [](const std::vector<std::uint64_t>& sizes) {
        StreamGroup group;
        for (auto size : sizes) group.tensors.push_back({size});
        const SlotLayout layout = slot_layout(group);
        return std::make_pair(layout.offsets, layout.bytes);
      },
      "sizes"_a, "(offsets, slot bytes) of tensors of these sizes inside one slot.");
  nb::class_<WeightStream>(m, "WeightStream")
      .def(
          "__init__",
          [](WeightStream* self, const PyGroups& groups, unsigned prefetch,
             const std::string& device, const Checkpoint* checkpoint,
             std::vector<std::uintptr_t> slot_memory, const std::string& io) {
            auto g = to_groups(groups);
            auto options = to_options(device, checkpoint, io);
            nb::gil_scoped_release unlocked;
            new (self)
                WeightStream(std::move(g), prefetch, std::move(options), std::move(slot_memory));
          },
          "groups"_a, "prefetch"_a, "device"_a, "checkpoint"_a.none() = nb::none(),
          "slot_memory"_a = std::vector<std::uintptr_t>{}, "io"_a = "auto")
      .def_static(
          "slot_sizes",
          [](const PyGroups& groups, unsigned prefetch) {
            return WeightStream::slot_sizes(to_groups(groups), prefetch);
          },
          "groups"_a, "prefetch"_a)
      .def_prop_ro("group_count", &WeightStream::group_count)
      .def_prop_ro("slot_count", &WeightStream::slot_count)
      .def_prop_ro("prefetch", &WeightStream::prefetch)
      .def("slot_of", &WeightStream::slot_of, "group"_a)
      .def("slot_address", &WeightStream::slot_address, "slot"_a)
      .def("tensor_address", &WeightStream::tensor_address, "group"_a, "tensor"_a)
      .def(
          "host_address",
          [](const WeightStream& s, std::size_t g, std::size_t t) {
            return reinterpret_cast<std::uintptr_t>(s.host_address(g, t));
          },
          "group"_a, "tensor"_a)
      .def(
          "prime", [](WeightStream& s, std::uintptr_t stream) { s.prime(as_stream(stream)); },
          "stream"_a, Release())
      .def(
          "wait",
          [](WeightStream& s, std::size_t g, std::uintptr_t stream) {
            s.wait(g, as_stream(stream));
          },
          "group"_a, "stream"_a, Release())
      .def(
          "release",
          [](WeightStream& s, std::size_t g, std::uintptr_t stream) {
            s.release(g, as_stream(stream));
          },
          "group"_a, "stream"_a, Release())
      .def(
          "join", [](WeightStream& s, std::uintptr_t stream) { s.join(as_stream(stream)); },
          "stream"_a)
      .def("synchronize", &WeightStream::synchronize, Release())
      .def("stats", [](const WeightStream& s) { return stats_dict(s.stats()); });

  nb::class_<ExpertCache>(m, "ExpertCache")
      .def(
          "__init__",
          [](ExpertCache* self, const PyGroups& experts, unsigned slots, const std::string& device,
             const Checkpoint* checkpoint, const std::string& policy,
             std::vector<std::uintptr_t> slot_memory, const std::string& io) {
            FERRY_EXPECT(policy == "lru" || policy == "frequency", std::invalid_argument,
                         "policy must be lru or frequency, not ", policy);
            auto g = to_groups(experts);
            auto options = to_options(device, checkpoint, io);
            nb::gil_scoped_release unlocked;
            new (self)
                ExpertCache(std::move(g), slots, std::move(options),
                            policy == "lru" ? EvictionPolicy::Lru : EvictionPolicy::Frequency,
                            std::move(slot_memory));
          },
          "experts"_a, "slots"_a, "device"_a, "checkpoint"_a.none() = nb::none(),
          "policy"_a = "lru", "slot_memory"_a = std::vector<std::uintptr_t>{}, "io"_a = "auto")
      .def_prop_ro("expert_count", &ExpertCache::expert_count)
      .def_prop_ro("slot_count", &ExpertCache::slot_count)
      .def_prop_ro("slot_bytes", &ExpertCache::slot_bytes)
      .def("slot_address", &ExpertCache::slot_address, "slot"_a)
      .def("resident_slot", &ExpertCache::resident_slot, "expert"_a)
      .def(
          "host_address",
          [](const ExpertCache& c, std::size_t e, std::size_t t) {
            return reinterpret_cast<std::uintptr_t>(c.host_address(e, t));
          },
          "expert"_a, "tensor"_a)
      .def(
          "acquire",
          [](ExpertCache& c, const std::vector<std::size_t>& experts, std::uintptr_t stream,
             const std::vector<std::size_t>& speculative) {
            return c.acquire(experts, as_stream(stream), speculative);
          },
          "experts"_a, "stream"_a, "speculative"_a = std::vector<std::size_t>{}, Release())
      .def(
          "release",
          [](ExpertCache& c, const std::vector<std::size_t>& experts) { c.release(experts); },
          "experts"_a)
      .def(
          "join", [](ExpertCache& c, std::uintptr_t stream) { c.join(as_stream(stream)); },
          "stream"_a)
      .def("synchronize", &ExpertCache::synchronize, Release())
      .def("stats", [](const ExpertCache& c) { return stats_dict(c.stats()); });
}

}  // namespace ferry
