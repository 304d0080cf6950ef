// What a checkpoint says about one tensor: its name, element type, shape and where its bytes
// lie. Formats (safetensors, GGUF) all produce these records; the planner consumes them.
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
  // GGUF only: the ggml type id (see ggml_type.hpp), -1 for other formats, and the dimensions
  // as GGUF states them, ne[0] (the row length) first. `dtype` and `shape` then describe the
  // bytes: a plain type's DType and the dims reversed, or U8 and [rows..., bytes per row] for a
  // quantized type. (ggml_dims has "= {}" so that aggregate initialisers that stop before it,
  // written before GGUF came, stay free of -Wmissing-field-initializers.)
  std::int32_t ggml_type = -1;
  std::vector<std::uint64_t> ggml_dims = {};
};

}  // namespace ferry
