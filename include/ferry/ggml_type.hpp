// ggml's tensor types as GGUF files number them, with the block layout that gives their byte
// sizes. A quantized type packs `block_size` consecutive elements of a row into `type_size`
// bytes, so a row of ne[0] elements takes ne[0] / block_size * type_size bytes and ne[0] must be
// a multiple of block_size. Plain types have block_size 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "ferry/dtype.hpp"

namespace ferry {

// The ids of ggml's `enum ggml_type`. Ids ggml retired (4 and 5, once Q4_2 and Q4_3; 31-33 and
// 36-38, briefly Q4_0_4_4 and friends, and IQ4_NL_4_4 and friends) are unknown here, as in ggml.
enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;       // ggml's spelling without the prefix: "Q4_K", "BF16"
  std::uint32_t block_size;    // elements per block
  std::uint32_t type_size;     // bytes per block
  std::optional<DType> dtype;  // the matching element type for plain types; nullopt if quantized
};

// nullptr for an id ggml does not define (or no longer does).
const GgmlTypeTraits* find_ggml_type(std::uint32_t id) noexcept;
const GgmlTypeTraits& ggml_type_traits(GgmlType type) noexcept;

// "Q4_K"; "?" for an unknown id (TensorInfo::ggml_type is -1 outside GGUF).
std::string_view ggml_type_name(std::int64_t id) noexcept;

// Bytes of one row of ne0 elements; nullopt when ne0 is not a multiple of the block size or the
// byte count overflows 64 bits.
std::optional<std::uint64_t> ggml_row_bytes(const GgmlTypeTraits& traits, std::uint64_t ne0);

}  // namespace ferry
