// The definitions of ferry.h's opaque handle types that more than one C ABI file uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/ferry.h"
#include "ferry/file_set.hpp"
#include "ferry/load_options.hpp"

struct ferry_file_set {
  std::shared_ptr<ferry::FileSet> set;
};

struct ferry_checkpoint {
  std::shared_ptr<const ferry::Checkpoint> checkpoint;
  std::vector<std::string> file_names;
};

namespace ferry::capi {

// The C options as the C++ ones, through the checks the CLI's flags and Python's keywords pass
// (options->device included). Throws std::invalid_argument for a bad struct_size or value.
LoadOptions load_options(const ferry_load_options& options);

}  // namespace ferry::capi
