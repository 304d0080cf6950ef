// What a checkpoint says about one tensor: its name, element type, shape and where its bytes
// lie. Formats (safetensors, later GGUF) all produce these records; the planner consumes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/dtype.hpp"

namespace ferry {

struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
  std::uint32_t file_index = 0;  // into Checkpoint::files()
  std::uint64_t offset = 0;      // absolute byte offset of the first byte in that file
  std::uint64_t size = 0;        // bytes
};

}  // namespace ferry
