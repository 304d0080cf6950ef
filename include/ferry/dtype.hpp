// Element types of tensors in a checkpoint, with their safetensors names and bit widths.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace ferry {

enum class DType : std::uint8_t {
  Bool,
  U8,
  I8,
  U16,
  I16,
  U32,
  I32,
  U64,
  I64,
  F16,
  BF16,
  F32,
  F64,
  C64,
  F8_E4M3,
  F8_E4M3FNUZ,
  F8_E5M2,
  F8_E5M2FNUZ,
  F8_E8M0,
  F6_E2M3,
  F6_E3M2,
  F4,
};

// The safetensors spelling ("BF16", "F8_E4M3", ...); nullopt for a name ferry does not know.
std::optional<DType> dtype_from_name(std::string_view name);
std::string_view dtype_name(DType dtype);

// Bits per element: 4 and 6 for packed types, so byte sizes need bits * count / 8.
unsigned dtype_bits(DType dtype);

// Bytes of a tensor of this dtype and shape; nullopt when the element count or the bit count
// overflows 64 bits, or the bits do not fill whole bytes.
std::optional<std::uint64_t> tensor_byte_size(DType dtype, std::span<const std::uint64_t> shape);

}  // namespace ferry
