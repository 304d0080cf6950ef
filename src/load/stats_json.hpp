// The JSON pieces every load's statistics share (`ferry load --json`, Python's stats()).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/load_stats.hpp"

namespace ferry::detail {

// One object per file: path, io_path by name, reason, bytes_read.
nlohmann::json files_json(const std::vector<FileLoadStats>& files);

// Compact text; paths are bytes, not always UTF-8: what JSON cannot hold becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);

}  // namespace ferry::detail
