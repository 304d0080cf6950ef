// A load's engine settings (reader threads, read size, slots per thread): the caller's, else
// this machine's tuning file, else the built-in defaults; all within options.staging_bytes.
// The tuning is read once, at the top of a load, and passed down: the transfer core never reads
// the user's files.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/load_options.hpp"
#include "ferry/transfer.hpp"
#include "ferry/tuning.hpp"

namespace ferry::detail {

struct EngineSettings {
  unsigned threads = 1;
  std::uint64_t chunk_bytes = 0;
  unsigned slots_per_thread = 2;
  std::string source;  // where threads, chunk size and slots came from, in words
};

// The tuning a load with these options uses: none read where the caller gave every setting.
ActiveTuning tuning_for(const LoadOptions& options);

EngineSettings choose_settings(const LoadOptions& options, const ActiveTuning& tuning);
// Reads the tuning itself (for `ferry doctor`, which shows what a load would use).
EngineSettings choose_settings(const LoadOptions& options);

// The transfer core's options that shape a load's set-up: the settings' threads, read size and
// slots, the caller's staging bound, copy streams and page-cache DMA budget (a load's submission
// and its preparation take the same).
TransferOptions staging_options(const EngineSettings& settings, const LoadOptions& options);

}  // namespace ferry::detail
