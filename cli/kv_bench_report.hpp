// How `ferry kv bench` reports: a row of the store beside raw I/O, printed and as JSON, and the
// fleet bench's figures.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kv_bench.hpp"
#include "kv_fleet_bench.hpp"

namespace ferry::cli {

// Each round's ratio of `ours` to the rates beside it, and their median: passes a few seconds
// apart, where the disk's drift between rounds moves the ratio of the medians.
std::string round_ratios(const std::vector<double>& ours, const std::vector<double>& beside);

// `kv bench --writers N`: runs the fleet, prints its figures and writes its row as JSON to
// `json` where not empty (opened first: an unwritable path fails before the run).
void print_fleet_bench(const KVBenchOptions& o, const std::string& json);

// One row of `kv bench` as it finishes: the store beside raw I/O, each round's ratios, where each
// pass's time went and, with page-cache DMA, its warm gets three ways.
void print_bench_row(const KVBenchRow& r, const KVBenchOptions& o);
nlohmann::json bench_row_json(const KVBenchRow& r, const KVBenchOptions& o);

}  // namespace ferry::cli
