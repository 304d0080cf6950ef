// Multi-process loading (one process per rank, ferry/_distributed.py): the plan every rank
// computes alike, and each rank's reads of one round.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <utility>

#include "engine_options.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout_load.hpp"
#include "interpreter_exit.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry {

void bind_fanout(nb::module_& m) {
  struct PyFanoutPlan {
    std::shared_ptr<const Checkpoint> checkpoint;  // the plan's pieces point into it
    FanoutPlan plan;
  };
  using Spec = std::optional<std::pair<int, std::vector<std::uint64_t>>>;
  nb::class_<PyFanoutPlan>(m, "FanoutPlan")
      .def_prop_ro("ranks", [](const PyFanoutPlan& p) { return p.plan.ranks; })
      .def_prop_ro("read_bytes", [](const PyFanoutPlan& p) { return p.plan.read_bytes; })
      .def_prop_ro("link_bytes", [](const PyFanoutPlan& p) { return p.plan.link_bytes; })
      .def_prop_ro("peer_bytes", [](const PyFanoutPlan& p) { return p.plan.peer_bytes; })
      .def_prop_ro("rounds", [](const PyFanoutPlan& p) { return p.plan.rounds.size(); })
      .def("digest", [](const PyFanoutPlan& p) { return fanout_plan_digest(p.plan); })
      .def("dest_bytes", [](const PyFanoutPlan& p, unsigned rank) {
        return p.plan.layouts.at(rank).dest_bytes;
      })
      .def("scratch_bytes", [](const PyFanoutPlan& p, unsigned rank) {
        return 2 * p.plan.scratch_bank_bytes.at(rank);
      })
      .def(
          "pieces",
          [](const PyFanoutPlan& p, unsigned rank) {
            std::vector<std::tuple<std::string, int, std::uint64_t, std::uint64_t,
                                   std::vector<std::uint64_t>, std::uint64_t, std::uint64_t>>
                out;
            for (const ShardPiece& x : p.plan.layouts.at(rank).pieces)
              out.emplace_back(x.info->name, x.dim, x.begin, x.end, x.shape, x.bytes,
                               x.dest_offset);
            return out;
          },
          "rank"_a, "(name, dim (-1: whole), begin, end, shape, bytes, offset) of each piece.")
      .def(
          "gather",
          [](const PyFanoutPlan& p, std::size_t round) {
            const FanoutRound& r = p.plan.rounds.at(round);
            return std::make_pair(r.gather_offset, r.gather_bytes_per_rank);
          },
          "round"_a, "(offset, bytes per rank) of the round's in-place all-gather.")
      .def(
          "scatters",
          [](const PyFanoutPlan& p, std::size_t round) {
            using Part = std::tuple<unsigned, std::uint64_t, std::uint64_t, std::uint64_t>;
            std::vector<std::tuple<unsigned, std::uint64_t, std::uint64_t, std::uint64_t,
                                   std::vector<Part>>>
                out;
            for (const FanoutScatter& sc : p.plan.rounds.at(round).scatters) {
              std::vector<Part> parts;
              for (const ScatterPart& x : sc.parts)
                parts.emplace_back(x.rank, x.dest_offset, x.row_begin, x.width);
              out.emplace_back(sc.reader, sc.scratch_offset, sc.rows, sc.row_bytes, parts);
            }
            return out;
          },
          "round"_a,
          "(reader, scratch offset, rows, row bytes, [(rank, offset, row begin, width)]) of each "
          "scatter of the round.");
  m.def(
      "plan_fanout",
      [](std::shared_ptr<const Checkpoint> checkpoint, unsigned ranks, const std::string& rule,
         const std::map<std::string, Spec>& specs, std::optional<std::vector<std::string>> names,
         std::uint64_t chunk_bytes, std::uint64_t round_bytes) {
        FERRY_EXPECT(rule == "replicate" || rule == "tensor_parallel", std::invalid_argument,
                     "unknown shard rule \"", rule, "\": expected replicate or tensor_parallel");
        const bool tp = rule == "tensor_parallel";
        ShardRule by_name = [&](const TensorInfo& t) {
          auto it = specs.find(t.name);
          if (it == specs.end()) return tp ? llama_tensor_parallel(t) : ShardSpec::replicate();
          if (!it->second) return ShardSpec::replicate();
          return ShardSpec::split(it->second->first, it->second->second);
        };
        FanoutPlanOptions o;
        if (chunk_bytes) o.chunk_bytes = chunk_bytes;
        if (round_bytes) o.round_bytes = round_bytes;
        auto out = std::make_unique<PyFanoutPlan>();
        const std::vector<std::string> selected = names.value_or(std::vector<std::string>{});
        out->plan = plan_fanout(*checkpoint, ranks, by_name, selected, o);
        out->checkpoint = std::move(checkpoint);
        return out;
      },
      "checkpoint"_a, "ranks"_a, "rule"_a = "replicate", "specs"_a = std::map<std::string, Spec>{},
      "names"_a = nb::none(), "chunk_bytes"_a = 0, "round_bytes"_a = 0,
      "Plans a load onto `ranks` ranks: every tensor whole (rule replicate) or sliced as vLLM\n"
      "shards Llama (tensor_parallel); specs maps names to None (whole) or (dim, sizes).");
  nb::class_<FanoutRoundRead>(m, "FanoutRoundRead")
      .def(
          "wait",
          [](FanoutRoundRead& r) { return stats_dict(without_gil([&] { return r.wait(); })); },
          "Until the round's reads landed; their statistics.");
  m.def(
      "start_fanout_round",
      [](const PyFanoutPlan& p, std::size_t round, unsigned rank, const std::string& device,
         std::uintptr_t memory, std::uintptr_t scratch, unsigned ranks_on_machine,
         unsigned rounds_at_once, nb::kwargs engine) {
        LoadOptions o = make_options(device, std::nullopt, std::nullopt, engine);
        const MachineShare share{ranks_on_machine, rounds_at_once};
        return without_gil([&] {
          return start_fanout_round(*p.checkpoint, p.plan, round, rank, o.device,
                                    reinterpret_cast<void*>(memory),
                                    reinterpret_cast<void*>(scratch), o, share);
        });
      },
      "plan"_a, "round"_a, "rank"_a, "device"_a, "memory"_a, "scratch"_a, "ranks_on_machine"_a = 1,
      "rounds_at_once"_a = 1, "engine"_a,
      "Starts rank `rank`'s reads of one round; wait() on the result until they landed. "
      "`ranks_on_machine` ranks of the group read on this machine, each `rounds_at_once` rounds "
      "at once: where the engine chooses the threads, they share the machine's.");
  m.def(
      "read_fanout_round",
      [](const PyFanoutPlan& p, std::size_t round, unsigned rank, const std::string& device,
         std::uintptr_t memory, std::uintptr_t scratch, nb::kwargs engine) {
        LoadOptions o = make_options(device, std::nullopt, std::nullopt, engine);
        const LoadStats stats = without_gil([&] {
          return read_fanout_round(*p.checkpoint, p.plan, round, rank, o.device,
                                   reinterpret_cast<void*>(memory),
                                   reinterpret_cast<void*>(scratch), o);
        });
        return stats_dict(stats);
      },
      "plan"_a, "round"_a, "rank"_a, "device"_a, "memory"_a, "scratch"_a, "engine"_a,
      "Rank `rank`'s reads of one round into its memory and scratch (addresses on device).");
}

}  // namespace ferry
