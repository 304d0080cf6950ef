// Engine settings measured on this machine rather than guessed: `tune` loads a checkpoint with
// each candidate (reader threads x read size x staging slots) and keeps the fastest; the result
// lives in a small JSON file that every later load reads (`ferry doctor CHECKPOINT --tune`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ferry/checkpoint.hpp"
#include "ferry/device.hpp"

namespace ferry {

struct Tuning {
  unsigned reader_threads = 0;
  std::uint64_t chunk_bytes = 0;
  unsigned slots_per_thread = 0;
  std::string machine;           // this_machine() where it was measured
  std::string measured;          // UTC date and time of the measurement
  double gigabytes_per_second = 0;  // the winner's median load rate
  std::string checkpoint;        // what was loaded to measure
};

// $FERRY_TUNING_FILE, else $XDG_CACHE_HOME/ferry/tuning.json, else ~/.cache/ferry/tuning.json.
std::filesystem::path tuning_file();

// What a tuning is valid for: core count and the name of GPU 0 (or "no GPU").
std::string this_machine();

// nullopt where the file does not exist. Throws, naming the file: FormatError where it is
// malformed, std::system_error where it cannot be read, std::invalid_argument where it is not a
// regular file (a FIFO or a directory is never read: it could block).
std::optional<Tuning> read_tuning(const std::filesystem::path& file);
void write_tuning(const std::filesystem::path& file, const Tuning& tuning);

// The tuning loads use now, and in words where the engine's settings come from (a tuning file,
// or the built-in defaults and why no file applies). Never throws for the file: one that is
// missing, unreadable, malformed or not a regular file means the defaults, and `source` says why.
struct ActiveTuning {
  std::optional<Tuning> tuning;
  std::string source;
};
ActiveTuning active_tuning();

// Loads `checkpoint` to `device` with each candidate setting (`runs` times each, after one
// warm-up load) and returns the fastest by median. Within 2% of the fastest, the most reader
// threads win, then the smallest staging.
// `report` hears each candidate's result.
Tuning tune(const std::shared_ptr<const Checkpoint>& checkpoint, const Device& device,
            unsigned runs = 3,
            const std::function<void(const Tuning& candidate)>& report = nullptr);

}  // namespace ferry
