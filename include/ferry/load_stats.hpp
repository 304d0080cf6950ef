// What a load did: bytes, time, and the I/O path each file really took (never a silent
// fallback: a file read buffered says so, and why).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/io_types.hpp"

namespace ferry {

struct LoadStats {
  std::string device;                 // "cuda:0" or "cpu"
  std::uint64_t tensor_bytes = 0;     // bytes that landed in destination memory
  std::uint64_t allocated_bytes = 0;  // destination memory ferry allocated (0 for load_into)
  std::uint64_t bytes_read = 0;       // bytes read from files (alignment and holes included)
  double seconds = 0;                 // from planning to the last copy finished
  double allocate_seconds = 0;        // of which: allocating destination memory
  double staging_seconds = 0;         // of which: allocating staging memory
  double open_seconds = 0;            // of which: opening files, probing their page-cache residency
  unsigned reader_threads = 0;
  unsigned slots_per_thread = 0;
  std::uint64_t chunk_bytes = 0;
  std::string settings_source;      // where threads, read size and slots came from (see tuning.hpp)
  std::uint64_t staging_bytes = 0;  // host staging actually allocated
  bool staging_pinned = false;
  // Where the reader threads' time went, summed over threads (the staged path only): reading
  // into staging, waiting for a slot's earlier copies, and queueing copies; setup is each
  // thread's stream and events.
  double setup_thread_seconds = 0;
  double read_thread_seconds = 0;
  double wait_thread_seconds = 0;
  double queue_thread_seconds = 0;
  std::vector<FileLoadStats> files;
  // Page-cache DMA (LoadOptions::page_cache_pin_bytes): bytes copied to the GPU straight from
  // registered page-cache mappings, and the time this load spent registering files (0 where
  // every registration was kept from an earlier load).
  std::uint64_t bytes_from_registered_page_cache = 0;
  double page_cache_register_seconds = 0;
  double submit_seconds = 0;  // from the load's start to the submission (plan, allocation, route)
  PipelineTimes pipeline;     // from the submission on
  // When the load reached each phase, in seconds from its start, in order: what a first load
  // pays before its first read shows here (planned, allocated, submitted, then the staged path's
  // workers started, staging ready, streams ready, first read...; pipeline's times moved onto
  // the load's clock). Phases not reached are left out.
  std::vector<std::pair<std::string, double>> timeline;

  double gigabytes_per_second() const {
    return seconds > 0 ? static_cast<double>(tensor_bytes) / seconds / 1e9 : 0.0;
  }
};

// The statistics as one JSON object, field names as above (gigabytes_per_second included, each
// file's io_path by name): what `ferry load --json` prints and Python's stats() returns.
std::string to_json(const LoadStats& stats);

// Appends a staged submission's phases (its PipelineTimes, `submitted` seconds after the load's
// start) to `timeline`, in the order they were reached, each name after `prefix`.
void add_pipeline_phases(const PipelineTimes& pipeline, double submitted,
                         std::vector<std::pair<std::string, double>>& timeline,
                         std::string_view prefix = {});

}  // namespace ferry
