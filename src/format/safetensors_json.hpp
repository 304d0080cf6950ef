// The JSON text of a safetensors header, read in one pass of SAX events straight into TensorInfo
// records: no JSON tree of the header and none of a tensor entry in the usual case (an entry of
// exactly "dtype": string, "shape" and "data_offsets": arrays of unsigned integers). Anything
// else (unknown fields, wrong types, "__metadata__") is built as JSON for that member only and
// checked by the same validation, so every error reads as it did.
#pragma once

#include <cstdint>
#include <string_view>

#include "ferry/safetensors.hpp"

namespace ferry::detail {

// Fills out.tensors (offsets relative to the data section, unsorted, file_index 0),
// out.metadata and out.has_metadata. Throws FormatError naming `label` for invalid JSON, a root
// that is not an object, nesting deeper than `max_depth`, a key twice in one object (tensor
// names included), and every defect of an entry: a missing or mistyped field, an unknown dtype,
// a shape whose bytes overflow or differ from its data_offsets, offsets past `data_bytes`.
void parse_safetensors_json(std::string_view text, std::uint64_t data_bytes, std::string_view label,
                            int max_depth, SafetensorsHeader& out);

}  // namespace ferry::detail
