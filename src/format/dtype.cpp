#include "ferry/dtype.hpp"

#include <array>

namespace ferry {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  unsigned bits;
};

constexpr std::array kDTypes = {
    DTypeEntry{DType::Bool, "BOOL", 8},          DTypeEntry{DType::U8, "U8", 8},
    DTypeEntry{DType::I8, "I8", 8},              DTypeEntry{DType::U16, "U16", 16},
    DTypeEntry{DType::I16, "I16", 16},           DTypeEntry{DType::U32, "U32", 32},
    DTypeEntry{DType::I32, "I32", 32},           DTypeEntry{DType::U64, "U64", 64},
    DTypeEntry{DType::I64, "I64", 64},           DTypeEntry{DType::F16, "F16", 16},
    DTypeEntry{DType::BF16, "BF16", 16},         DTypeEntry{DType::F32, "F32", 32},
    DTypeEntry{DType::F64, "F64", 64},           DTypeEntry{DType::C64, "C64", 64},
    DTypeEntry{DType::F8_E4M3, "F8_E4M3", 8},    DTypeEntry{DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    DTypeEntry{DType::F8_E5M2, "F8_E5M2", 8},    DTypeEntry{DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    DTypeEntry{DType::F8_E8M0, "F8_E8M0", 8},    DTypeEntry{DType::F6_E2M3, "F6_E2M3", 6},
    DTypeEntry{DType::F6_E3M2, "F6_E3M2", 6},    DTypeEntry{DType::F4, "F4", 4},
};

const DTypeEntry& entry(DType dtype) { return kDTypes[static_cast<std::size_t>(dtype)]; }

static_assert([] {
  for (std::size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  return true;
}(), "kDTypes must be indexed by DType");

}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kDTypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) { return entry(dtype).name; }

unsigned dtype_bits(DType dtype) { return entry(dtype).bits; }

std::optional<std::uint64_t> tensor_byte_size(DType dtype, std::span<const std::uint64_t> shape) {
  std::uint64_t elements = 1;
  for (std::uint64_t d : shape) {
    if (d != 0 && elements > UINT64_MAX / d) return std::nullopt;
    elements *= d;
  }
  const unsigned bits = dtype_bits(dtype);
  if (elements > UINT64_MAX / bits || elements * bits % 8 != 0) return std::nullopt;
  return elements * bits / 8;
}

}  // namespace ferry
