// ferry.prepare_load: a first load's set-up made ahead (ferry/load_preparation.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <optional>
#include <utility>

#include "engine_options.hpp"
#include "ferry/load_preparation.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry {
namespace {

// Dropped by Python, it waits for the preparing thread without the GIL.
struct PyLoadPreparation {
  LoadPreparation preparation;
  ~PyLoadPreparation() {
    nb::gil_scoped_release release;
    preparation = LoadPreparation();
  }
};

nb::dict report_dict(const WarmUpReport& r) {
  nb::dict d;
  d["staging_bytes"] = r.staging_bytes;
  d["slabs"] = r.slabs;
  d["pinned"] = r.pinned;
  d["threads"] = r.threads;
  d["streams"] = r.streams;
  d["page_cache_bytes"] = r.page_cache_bytes;
  d["page_cache_why_not"] = r.page_cache_why_not;
  d["seconds"] = r.seconds;
  return d;
}

}  // namespace

void bind_prepare(nb::module_& m) {
  nb::class_<PyLoadPreparation>(
      m, "LoadPreparation",
      "A load's set-up (pinned staging, threads, copy streams) being made on a thread of its own.")
      .def_prop_ro("done", [](const PyLoadPreparation& p) { return p.preparation.done(); })
      .def(
          "wait",
          [](const PyLoadPreparation& p) {
            WarmUpReport r;
            {
              nb::gil_scoped_release release;
              r = p.preparation.wait();
            }
            return report_dict(r);
          },
          "Waits; returns what was made (staging_bytes, slabs, pinned, threads, streams, "
          "page_cache_bytes, page_cache_why_not, seconds), or raises what the preparation failed "
          "with.");
  m.def(
      "prepare_load",
      [](const std::string& device, std::optional<std::shared_ptr<Checkpoint>> checkpoint,
         const nb::kwargs& engine) {
        // Anything but a ferry.Checkpoint (or None) is a TypeError naming the parameter.
        const LoadOptions options = make_options(device, std::nullopt, std::nullopt, engine);
        auto p = std::make_unique<PyLoadPreparation>();
        p->preparation = LoadPreparation(options, checkpoint.value_or(nullptr));
        return p;
      },
      "device"_a = "cpu", "checkpoint"_a = nb::none(), "engine"_a,
      "Starts making, on a thread of its own, what the process's first load onto `device` with "
      "these engine settings would set up while it reads: each reader's staging (pinned for a "
      "GPU), the reader threads, the copy streams. A server calls it while it builds its model; "
      "its load then runs as fast as a later one. With a `checkpoint` (a ferry.Checkpoint) and "
      "page_cache_pin, its files wholly in the page cache are registered for page-cache DMA too. "
      "Returns a LoadPreparation; a load need not wait for it (it uses what is ready).");
}

}  // namespace ferry
