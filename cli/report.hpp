// How the CLI shows sizes and load statistics, for people and as JSON.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/load_stats.hpp"

namespace ferry::cli {

// `text` made safe for a terminal: control characters (C0, DEL, C1) and bytes that are not
// UTF-8 are escaped (\n, \t, \r, else \xNN), so that names, metadata and paths from a file
// cannot move the cursor, retitle the window or hide what follows. Valid UTF-8 is kept.
std::string printable(std::string_view text);

// A CLI11 check for a finite number from `low` to `high` (CLI11's own ranges let NaN through,
// and a size past 2^64 bytes would wrap when converted).
CLI::Validator finite_between(double low, double high);

// "1.19 GB", "12.3 MB", "256 bytes".
std::string human_bytes(std::uint64_t bytes);

// "[151936, 1024]"
std::string shape_text(const std::vector<std::uint64_t>& shape);

void print_stats(std::FILE* out, const LoadStats& stats, std::size_t tensor_count);

nlohmann::json stats_json(const LoadStats& stats);

}  // namespace ferry::cli
