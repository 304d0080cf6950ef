// ferry demo: writes a Qwen3-0.6B-shaped checkpoint (310 bf16 tensors, 256 bytes to 297 MiB),
// loads it to the GPU if there is one and to host memory otherwise, and checks every tensor.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "commands.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/safetensors_writer.hpp"
#include "ferry/tensor_digest.hpp"
#include "ferry/utf8_path.hpp"
#include "load_command.hpp"
#include "progress.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;

// Qwen3-0.6B: hidden 1024, 28 layers, 16 query and 8 KV heads of 128, MLP 3072, vocab 151936,
// tied embeddings (no lm_head).
std::vector<TensorSpec> qwen3_0_6b_shapes() {
  constexpr std::uint64_t kHidden = 1024, kLayers = 28, kHeadDim = 128, kQ = 16 * kHeadDim,
                          kKV = 8 * kHeadDim, kMlp = 3072, kVocab = 151936;
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
    specs.push_back({std::move(name), DType::BF16, std::move(shape)});
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  for (std::uint64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden});
    add(p + "self_attn.q_proj.weight", {kQ, kHidden});
    add(p + "self_attn.k_proj.weight", {kKV, kHidden});
    add(p + "self_attn.v_proj.weight", {kKV, kHidden});
    add(p + "self_attn.o_proj.weight", {kHidden, kQ});
    add(p + "self_attn.q_norm.weight", {kHeadDim});
    add(p + "self_attn.k_norm.weight", {kHeadDim});
    add(p + "post_attention_layernorm.weight", {kHidden});
    add(p + "mlp.gate_proj.weight", {kMlp, kHidden});
    add(p + "mlp.up_proj.weight", {kMlp, kHidden});
    add(p + "mlp.down_proj.weight", {kHidden, kMlp});
  }
  add("model.norm.weight", {kHidden});
  return specs;
}

// Fast deterministic bytes (xorshift64*), different for every tensor.
void fill_random(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    const std::uint64_t v = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 131 + seed);
}

// A private temporary directory, removed with everything in it when the demo ends.
class TemporaryDirectory {
 public:
  explicit TemporaryDirectory(const fs::path& parent) {
    // mkdtemp's contract, portably: a fresh directory of a random name that we created.
    std::random_device seed;
    std::mt19937_64 random(seed());
    for (int attempt = 0; attempt < 100 && _path.empty(); ++attempt) {
      const fs::path candidate = parent / ("ferry-demo-" + std::to_string(random()));
      if (fs::create_directory(candidate)) _path = candidate;
    }
    FERRY_EXPECT(!_path.empty(), std::runtime_error, parent.string(),
                 ": cannot create a temporary directory");
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  ~TemporaryDirectory() {
    std::error_code ignored;
    fs::remove_all(_path, ignored);
  }
  const fs::path& path() const { return _path; }

 private:
  fs::path _path;
};

}  // namespace

void add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "demo", "Write a Qwen3-0.6B-shaped checkpoint, load it (GPU if present), verify every byte");
  static std::string device = "auto";
  static std::string dir;
  cmd->add_option("--device", device, "cuda:N, cpu, or auto")->capture_default_str();
  cmd->add_option("--dir", dir,
                  "where to write the temporary checkpoint (default: $TMPDIR or /tmp)");
  cmd->callback([] {
    const char* tmp = std::getenv("TMPDIR");
    TemporaryDirectory work(!dir.empty() ? path_from_utf8(dir)
                            : tmp        ? fs::path(tmp)
                                         : fs::temp_directory_path());
    const fs::path file = work.path() / "model.safetensors";
    const auto specs = qwen3_0_6b_shapes();
    std::map<std::string, std::uint64_t> expected;
    std::uint64_t seed = 0;
    std::printf("writing %zu bf16 tensors shaped like Qwen3-0.6B to %s\n", specs.size(),
                file.string().c_str());
    write_safetensors(file, specs, [&](const TensorSpec& spec, std::span<std::byte> bytes) {
      fill_random(bytes, ++seed);
      expected[spec.name] = bytes_digest(bytes);
    });

    auto checkpoint = Checkpoint::open_shared(file);
    LoadOptions options;
    options.device = resolve_device(device);
    auto progress = std::make_shared<Progress>("loading");
    options.progress = [progress](auto done, auto total) { progress->update(done, total); };
    LoadedCheckpoint loaded = load(checkpoint, options);
    progress->finish();
    print_stats(stdout, loaded.stats(), loaded.tensors().size());

    std::size_t mismatches = 0;
    for (const auto& t : loaded.tensors())
      if (tensor_digest(loaded, t) != expected.at(t.info->name)) {
        std::fprintf(stderr, "ferry demo: tensor %s differs from what was written\n",
                     t.info->name.c_str());
        ++mismatches;
      }
    FERRY_EXPECT(mismatches == 0, std::runtime_error, mismatches, " of ", expected.size(),
                 " tensors differ from what was written");
    std::printf("verified: all %zu tensors match what was written (XXH3-64)\n", expected.size());
  });
}

}  // namespace ferry::cli
