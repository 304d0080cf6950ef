// Helpers shared by the KV store tests: a namespace, each key's deterministic block bytes, runs of
// keys, and one-block put/get wrappers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "ferry/kv_store.hpp"
#include "test_support.hpp"

namespace ferry::test {

inline KVNamespace kv_namespace(const std::string& model = "llama-test", int rank = 0) {
  return {model, "bf16", "layers=4,kv=2,block=16", rank, 2};
}

// The bytes a key's block holds in these tests: a function of the key and length only.
inline std::vector<std::byte> kv_bytes(KVKey key, std::size_t size) {
  return random_bytes(size, key * 7919 + size);
}

inline std::vector<KVKey> iota_keys(std::size_t n, KVKey first = 1) {
  std::vector<KVKey> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = first + i;
  return keys;
}

inline KVResult put_one(KVStore& store, KVKey key, const std::vector<std::byte>& bytes) {
  KVPiece piece{const_cast<std::byte*>(bytes.data()), bytes.size()};
  KVBlock block(&piece, 1);
  return store.put(std::span(&key, 1), std::span(&block, 1))[0];
}

inline KVResult get_one(KVStore& store, KVKey key, std::vector<std::byte>& out) {
  KVPiece piece{out.data(), out.size()};
  KVBlock block(&piece, 1);
  return store.get(std::span(&key, 1), std::span(&block, 1))[0];
}

}  // namespace ferry::test
