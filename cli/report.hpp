// How the CLI shows sizes and load statistics, for people and as JSON.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/load_stats.hpp"

namespace ferry::cli {

// "1.19 GB", "12.3 MB", "256 bytes".
std::string human_bytes(std::uint64_t bytes);

// "[151936, 1024]"
std::string shape_text(const std::vector<std::uint64_t>& shape);

void print_stats(std::FILE* out, const LoadStats& stats, std::size_t tensor_count);

nlohmann::json stats_json(const LoadStats& stats);

}  // namespace ferry::cli
