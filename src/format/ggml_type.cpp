#include "ferry/ggml_type.hpp"

#include <array>

namespace ferry {
namespace {

// QK_K: the super-block of the k-quants and of the i-quants and ternary types that followed.
constexpr std::uint32_t kSuper = 256;

// Sizes as ggml's block structs define them (ggml-common.h), written as their fields add up so
// each one can be checked against the struct: half = 2 bytes, scales and quants after it.
constexpr std::array kTypes = {
    GgmlTypeTraits{GgmlType::F32, "F32", 1, 4, DType::F32},
    GgmlTypeTraits{GgmlType::F16, "F16", 1, 2, DType::F16},
    GgmlTypeTraits{GgmlType::Q4_0, "Q4_0", 32, 2 + 16, std::nullopt},
    GgmlTypeTraits{GgmlType::Q4_1, "Q4_1", 32, 2 + 2 + 16, std::nullopt},
    GgmlTypeTraits{GgmlType::Q5_0, "Q5_0", 32, 2 + 4 + 16, std::nullopt},
    GgmlTypeTraits{GgmlType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16, std::nullopt},
    GgmlTypeTraits{GgmlType::Q8_0, "Q8_0", 32, 2 + 32, std::nullopt},
    GgmlTypeTraits{GgmlType::Q8_1, "Q8_1", 32, 4 + 4 + 32, std::nullopt},
    GgmlTypeTraits{GgmlType::Q2_K, "Q2_K", kSuper, 2 + 2 + kSuper / 16 + kSuper / 4, std::nullopt},
    GgmlTypeTraits{GgmlType::Q3_K, "Q3_K", kSuper, 2 + kSuper / 4 + kSuper / 8 + 12, std::nullopt},
    GgmlTypeTraits{GgmlType::Q4_K, "Q4_K", kSuper, 2 + 2 + kSuper / 2 + 12, std::nullopt},
    GgmlTypeTraits{GgmlType::Q5_K, "Q5_K", kSuper, 2 + 2 + kSuper / 2 + kSuper / 8 + 12,
                   std::nullopt},
    GgmlTypeTraits{GgmlType::Q6_K, "Q6_K", kSuper, 2 + kSuper / 2 + kSuper / 4 + kSuper / 16,
                   std::nullopt},
    GgmlTypeTraits{GgmlType::Q8_K, "Q8_K", kSuper, 4 + kSuper + kSuper / 8, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ2_XXS, "IQ2_XXS", kSuper, 2 + kSuper / 4, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ2_XS, "IQ2_XS", kSuper, 2 + kSuper / 4 + kSuper / 32, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ3_XXS, "IQ3_XXS", kSuper, 2 + kSuper / 4 + kSuper / 8, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ1_S, "IQ1_S", kSuper, 2 + kSuper / 8 + kSuper / 16, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ4_NL, "IQ4_NL", 32, 2 + 16, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ3_S, "IQ3_S", kSuper, 2 + kSuper / 4 + kSuper / 8 + kSuper / 32 + 4,
                   std::nullopt},
    GgmlTypeTraits{GgmlType::IQ2_S, "IQ2_S", kSuper, 2 + kSuper / 4 + kSuper / 16, std::nullopt},
    GgmlTypeTraits{GgmlType::IQ4_XS, "IQ4_XS", kSuper, 2 + 2 + kSuper / 2 + kSuper / 64,
                   std::nullopt},
    GgmlTypeTraits{GgmlType::I8, "I8", 1, 1, DType::I8},
    GgmlTypeTraits{GgmlType::I16, "I16", 1, 2, DType::I16},
    GgmlTypeTraits{GgmlType::I32, "I32", 1, 4, DType::I32},
    GgmlTypeTraits{GgmlType::I64, "I64", 1, 8, DType::I64},
    GgmlTypeTraits{GgmlType::F64, "F64", 1, 8, DType::F64},
    GgmlTypeTraits{GgmlType::IQ1_M, "IQ1_M", kSuper, kSuper / 8 + kSuper / 16 + kSuper / 32,
                   std::nullopt},
    GgmlTypeTraits{GgmlType::BF16, "BF16", 1, 2, DType::BF16},
    GgmlTypeTraits{GgmlType::TQ1_0, "TQ1_0", kSuper, 2 + 4 * 13, std::nullopt},
    GgmlTypeTraits{GgmlType::TQ2_0, "TQ2_0", kSuper, 2 + 64, std::nullopt},
    GgmlTypeTraits{GgmlType::MXFP4, "MXFP4", 32, 1 + 16, std::nullopt},
    GgmlTypeTraits{GgmlType::NVFP4, "NVFP4", 64, 4 + 32, std::nullopt},
    GgmlTypeTraits{GgmlType::Q1_0, "Q1_0", 128, 2 + 16, std::nullopt},
};

// One past the largest id: a direct index from id to table entry.
constexpr std::size_t kIdLimit = 42;

constexpr std::array<std::int8_t, kIdLimit> kIndexById = [] {
  std::array<std::int8_t, kIdLimit> index{};
  index.fill(-1);
  for (std::size_t i = 0; i < kTypes.size(); ++i)
    index[static_cast<std::size_t>(kTypes[i].type)] = static_cast<std::int8_t>(i);
  return index;
}();

static_assert(
    [] {
      for (const auto& t : kTypes)
        if (t.block_size == 0 || t.type_size == 0 || (t.dtype && t.block_size != 1)) return false;
      return true;
    }(),
    "every type has a block, and plain types hold one element per block");

}  // namespace

const GgmlTypeTraits* find_ggml_type(std::uint32_t id) noexcept {
  if (id >= kIdLimit || kIndexById[id] < 0) return nullptr;
  return &kTypes[static_cast<std::size_t>(kIndexById[id])];
}

const GgmlTypeTraits& ggml_type_traits(GgmlType type) noexcept {
  return *find_ggml_type(static_cast<std::uint32_t>(type));
}

std::string_view ggml_type_name(std::int64_t id) noexcept {
  if (id < 0 || id > UINT32_MAX) return "?";
  const GgmlTypeTraits* traits = find_ggml_type(static_cast<std::uint32_t>(id));
  return traits ? traits->name : "?";
}

std::optional<std::uint64_t> ggml_row_bytes(const GgmlTypeTraits& traits, std::uint64_t ne0) {
  if (ne0 % traits.block_size != 0) return std::nullopt;
  const std::uint64_t blocks = ne0 / traits.block_size;
  if (blocks > UINT64_MAX / traits.type_size) return std::nullopt;
  return blocks * traits.type_size;
}

}  // namespace ferry
