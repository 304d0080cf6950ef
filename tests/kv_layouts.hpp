// The inference engines' paged KV layouts as the KV store sees them: a set of cache tensors (one
// or two per layer) and, for block b, the pieces of them that hold its bytes, in the order the
// store keeps them. Shared by the host tests (test_kv_layouts.cpp) and the GPU ones
// (test_gpu_kv_layouts.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::test {

struct PieceAt {
  std::size_t tensor = 0;
  std::uint64_t offset = 0, size = 0;
};

struct KvLayout {
  std::string name;
  std::size_t num_blocks = 0;
  std::vector<std::uint64_t> tensor_bytes;
  std::vector<std::vector<PieceAt>> blocks;  // per block, its pieces
  std::uint64_t block_bytes() const {
    std::uint64_t n = 0;
    for (const PieceAt& p : blocks.at(0)) n += p.size;
    return n;
  }
};

// vLLM FlashAttention, per layer one tensor [2, num_blocks, block_tokens, kv_heads, head_dim]:
// a block is a K page and a V page per layer.
inline KvLayout vllm_layout(int layers, std::size_t num_blocks, int block_tokens, int kv_heads,
                            int head_dim, int element_bytes) {
  KvLayout l;
  l.name = "vllm";
  l.num_blocks = num_blocks;
  const std::uint64_t page =
      std::uint64_t(block_tokens) * kv_heads * head_dim * std::uint64_t(element_bytes);
  l.tensor_bytes.assign(layers, 2 * num_blocks * page);
  l.blocks.resize(num_blocks);
  for (std::size_t b = 0; b < num_blocks; ++b)
    for (int t = 0; t < layers; ++t)
      for (int kv = 0; kv < 2; ++kv)
        l.blocks[b].push_back({std::size_t(t), (kv * num_blocks + b) * page, page});
  return l;
}

// vLLM's canonical per-layer view (num_blocks, page_bytes) int8: one page per layer (K and V).
inline KvLayout vllm_canonical_layout(int layers, std::size_t num_blocks, std::uint64_t page) {
  KvLayout l;
  l.name = "vllm-canonical";
  l.num_blocks = num_blocks;
  l.tensor_bytes.assign(layers, num_blocks * page);
  l.blocks.resize(num_blocks);
  for (std::size_t b = 0; b < num_blocks; ++b)
    for (int t = 0; t < layers; ++t) l.blocks[b].push_back({std::size_t(t), b * page, page});
  return l;
}

// MLA (DeepSeek): one latent page per layer, [num_blocks, block_tokens, 576] in bf16.
inline KvLayout mla_layout(int layers, std::size_t num_blocks, int block_tokens = 64) {
  KvLayout l = vllm_canonical_layout(layers, num_blocks, std::uint64_t(block_tokens) * 576 * 2);
  l.name = "mla";
  return l;
}

// SGLang: per layer a K buffer and a V buffer [tokens, kv_heads, head_dim]; a block is
// block_tokens consecutive tokens of each.
inline KvLayout sglang_layout(int layers, std::size_t num_blocks, int block_tokens, int kv_heads,
                              int head_dim, int element_bytes) {
  KvLayout l;
  l.name = "sglang";
  l.num_blocks = num_blocks;
  const std::uint64_t page =
      std::uint64_t(block_tokens) * kv_heads * head_dim * std::uint64_t(element_bytes);
  l.tensor_bytes.assign(2 * layers, num_blocks * page);
  l.blocks.resize(num_blocks);
  for (std::size_t b = 0; b < num_blocks; ++b)
    for (int t = 0; t < layers; ++t)
      for (int kv = 0; kv < 2; ++kv)
        l.blocks[b].push_back({std::size_t(2 * t + kv), b * page, page});
  return l;
}

// The layouts the tests cover: 16-128 KiB pieces, 24-128 layers, bf16 and fp8.
inline std::vector<KvLayout> test_layouts(std::size_t num_blocks) {
  return {
      vllm_layout(32, num_blocks, 16, 8, 128, 2),   // 64 x 32 KiB (Llama-3-8B, bf16)
      vllm_layout(24, num_blocks, 16, 8, 128, 1),   // 48 x 16 KiB (fp8)
      vllm_layout(128, num_blocks, 16, 4, 128, 2),  // 256 x 16 KiB, 128 layers
      vllm_canonical_layout(32, num_blocks, 64 << 10), mla_layout(61, num_blocks),  // 61 x 72 KiB
      sglang_layout(24, num_blocks, 64, 8, 128, 2),                                 // 48 x 128 KiB
      sglang_layout(40, num_blocks, 16, 8, 128, 1),  // 80 x 16 KiB (fp8)
  };
}

}  // namespace ferry::test
