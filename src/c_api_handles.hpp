// The definitions of ferry.h's opaque handle types that more than one C ABI file uses.
#pragma once

#include <memory>

#include "ferry/file_set.hpp"

struct ferry_file_set {
  std::shared_ptr<ferry::FileSet> set;
};
