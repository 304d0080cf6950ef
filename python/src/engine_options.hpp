// The engine's settings and statistics as Python sees them, shared by the binding files.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "ferry/load_options.hpp"
#include "ferry/load_stats.hpp"

namespace ferry {

// Engine settings from keywords (io, backend, allow_compat, staging_bytes, chunk_bytes, threads,
// slots) through set_load_option; Ctrl-C cancels; `progress` is called with the GIL held.
LoadOptions make_options(const std::string& device, std::optional<std::vector<std::string>> names,
                         std::optional<nanobind::callable> progress, const nanobind::kwargs& engine);

// The library's JSON of the statistics, as a Python dict, with each path exactly as Python sees it.
nanobind::object stats_dict(const LoadStats& s);

}  // namespace ferry
