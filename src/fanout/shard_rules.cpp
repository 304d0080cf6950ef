// Shard rules: which tensors tensor parallelism splits, and along which dimension.
#include <array>
#include <string_view>

#include "ferry/shard_plan.hpp"

namespace ferry {
namespace {

// True when `name` has `part` as one of its dot-separated components.
bool has_part(std::string_view name, std::string_view part) {
  std::size_t at = 0;
  while (at <= name.size()) {
    const std::size_t dot = name.find('.', at);
    const std::size_t end = dot == std::string_view::npos ? name.size() : dot;
    if (name.substr(at, end - at) == part) return true;
    if (dot == std::string_view::npos) break;
    at = dot + 1;
  }
  return false;
}

template <std::size_t N>
bool has_any(std::string_view name, const std::array<std::string_view, N>& parts) {
  for (std::string_view p : parts)
    if (has_part(name, p)) return true;
  return false;
}

// Column-parallel layers (each rank computes some outputs): weight and bias split by rows.
constexpr std::array<std::string_view, 12> kByRows = {
    "q_proj",  "k_proj", "v_proj", "gate_proj", "up_proj",  "embed_tokens",
    "lm_head", "attn_q", "attn_k", "attn_v",    "ffn_gate", "ffn_up"};
// Row-parallel layers (each rank reduces over some inputs): the weight split by columns, the
// bias (added once after the reduction) whole.
constexpr std::array<std::string_view, 4> kByColumns = {"o_proj", "down_proj", "attn_output",
                                                        "ffn_down"};

}  // namespace

ShardSpec llama_tensor_parallel(const TensorInfo& tensor) {
  const std::string_view name = tensor.name;
  const bool weight = has_part(name, "weight");
  if (tensor.shape.empty()) return ShardSpec::replicate();
  if (has_any(name, kByRows)) return ShardSpec::split(0);
  // GGUF names the embedding token_embd and lm_head output (output_norm is a norm).
  if (weight && (name.starts_with("token_embd.") || name.starts_with("output.")))
    return ShardSpec::split(0);
  if (weight && tensor.shape.size() >= 2 && has_any(name, kByColumns)) return ShardSpec::split(1);
  return ShardSpec::replicate();
}

}  // namespace ferry
