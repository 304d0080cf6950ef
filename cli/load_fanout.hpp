// `ferry load PATH --device cuda:0,cuda:1`: one process loads onto several devices at once.
#pragma once

#include <string>

#include "ferry/load_options.hpp"

namespace ferry::cli {

struct FanoutRequest {
  std::string path;
  std::string devices;  // "cuda:0,cuda:1"
  LoadOptions options;  // engine settings as for one device
  bool tensor_parallel = false;
  bool hash = false;
  bool json = false;
  unsigned repeat = 1;
  std::uint64_t round_bytes = 0;
  bool next_round_at_tail = false;  // --next-round at-tail
  bool per_device = false;          // --submissions per-device
  bool keep = false;                // --keep: every load held to the end
};

// True when `device` names more than one device.
bool lists_several_devices(const std::string& device);

void run_fanout_load(const FanoutRequest& request);

}  // namespace ferry::cli
