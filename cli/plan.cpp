// ferry plan CHECKPOINT --gpu-gib N: which decoder blocks to stream so that a checkpoint's
// weights fit N GiB of GPU memory, and what a step then costs (the stream planner's pipeline
// simulation over the link measured here, or given, and a compute time per block, if given).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/device.hpp"
#include "ferry/error.hpp"
#include "ferry/machine.hpp"
#include "ferry/stream_plan.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

struct Options {
  std::string path;
  double gpu_gib = 0;
  unsigned prefetch = 2;
  double link_gbps = 0;  // 0: measured on cuda:0
  double block_ms = 0;
};

// `text` for a message, cut to its first bytes where it is long (a name of 200,000 digits).
std::string shortened(std::string_view text) {
  constexpr std::size_t kShown = 60;
  if (text.size() <= kShown) return std::string(text);
  return std::string(text.substr(0, kShown)) + "... (" + std::to_string(text.size()) + " bytes)";
}

// The block a tensor belongs to: N of the first "layers.N." (also h.N., blocks.N., blk.N. for
// GGUF) at the start of its name or after a dot; none for the rest (embeddings, final norm,
// head). One pass over the name, no recursion (std::regex overflowed the stack on a long run of
// digits). Throws std::invalid_argument, naming the tensor, for an index past 2^64 - 1.
std::optional<std::uint64_t> block_index(std::string_view name) {
  static constexpr std::string_view kPrefixes[] = {"layers.", "h.", "blocks.", "blk."};
  for (std::size_t start = 0; start < name.size();) {
    const std::string_view rest = name.substr(start);
    for (std::string_view prefix : kPrefixes) {
      if (!rest.starts_with(prefix)) continue;
      const std::string_view tail = rest.substr(prefix.size());
      const std::size_t digits = std::min(tail.find_first_not_of("0123456789"), tail.size());
      if (digits == 0 || digits == tail.size() || tail[digits] != '.') continue;
      std::uint64_t index = 0;
      const auto [end, error] = std::from_chars(tail.data(), tail.data() + digits, index);
      FERRY_EXPECT(error == std::errc() && end == tail.data() + digits, std::invalid_argument,
                   "tensor \"", shortened(name), "\": block index ",
                   shortened(tail.substr(0, digits)), " is larger than ferry can count (2^64 - 1)");
      return index;
    }
    const std::size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return std::nullopt;
}

StreamPlanInput blocks_of(const Checkpoint& checkpoint, std::vector<std::string>& names) {
  std::map<std::uint64_t, std::uint64_t> bytes;
  StreamPlanInput input;
  for (const auto& t : checkpoint.tensors()) {
    if (const auto index = block_index(t.name))
      bytes[*index] += t.size;
    else
      input.other_bytes += t.size;
  }
  for (const auto& [index, size] : bytes) {
    input.block_bytes.push_back(size);
    names.push_back(std::to_string(index));
  }
  return input;
}

void run(const Options& o) {
  const Checkpoint checkpoint = Checkpoint::open(o.path);
  std::vector<std::string> names;
  StreamPlanInput input = blocks_of(checkpoint, names);
  FERRY_EXPECT(!input.block_bytes.empty(), std::invalid_argument, printable(o.path),
               ": no tensors named as decoder blocks (layers.N., h.N., blocks.N., blk.N.)");
  input.prefetch = o.prefetch;
  double gbps = o.link_gbps;
  if (gbps <= 0) {
    FERRY_EXPECT(cuda_available(), std::invalid_argument,
                 "no GPU here to measure the link: give --link-gbps");
    gbps = measure_host_to_device(0, 256ull << 20, 3).pinned_gbps;
  }
  input.link_bytes_per_second = gbps * 1e9;
  input.block_seconds.assign(input.block_bytes.size(), o.block_ms / 1e3);
  const StreamPlan plan = plan_for_budget(input, static_cast<std::uint64_t>(o.gpu_gib * kGiB));
  std::uint64_t in_blocks = 0;
  for (auto b : input.block_bytes) in_blocks += b;
  std::printf("checkpoint: %s, %zu blocks, %s in blocks + %s resident elsewhere\n",
              printable(o.path).c_str(), input.block_bytes.size(), human_bytes(in_blocks).c_str(),
              human_bytes(input.other_bytes).c_str());
  if (plan.streamed.empty()) {
    std::printf("fits in %.2f GiB without streaming (%s)\n", o.gpu_gib,
                human_bytes(plan.gpu_bytes).c_str());
    return;
  }
  std::string streamed;
  for (std::size_t i : plan.streamed) streamed += (streamed.empty() ? "" : ",") + names[i];
  std::printf("stream %zu blocks: %s\n", plan.streamed.size(), streamed.c_str());
  std::printf("GPU memory: %s (slots %s, prefetch %u)\n", human_bytes(plan.gpu_bytes).c_str(),
              human_bytes(plan.slot_bytes).c_str(), o.prefetch);
  std::printf("per step: %s copied at %.1f GB/s = %.3f ms (the bound)\n",
              human_bytes(plan.streamed_bytes).c_str(), gbps, plan.copy_seconds * 1e3);
  if (o.block_ms > 0 && plan.stall_seconds > 1e-9)
    std::printf("step: %.3f ms against %.3f ms resident: stalls %.3f ms\n", plan.step_seconds * 1e3,
                plan.compute_seconds * 1e3, plan.stall_seconds * 1e3);
  else if (o.block_ms > 0)
    std::printf("step: %.3f ms, as resident: the copies hide behind compute\n",
                plan.step_seconds * 1e3);
  else
    std::printf(
        "step: at least %.3f ms (give --block-ms, a block's compute time, to see "
        "whether copies hide behind it)\n",
        plan.step_seconds * 1e3);
}

}  // namespace

void add_plan(CLI::App& app) {
  static Options o;
  auto* cmd = app.add_subcommand(
      "plan",
      "Which decoder blocks to stream so a checkpoint fits a GPU memory budget, and the "
      "step time that follows");
  cmd->add_option("checkpoint", o.path, "a safetensors or GGUF file, shard directory or index")
      ->required();
  cmd->add_option("--gpu-gib", o.gpu_gib, "GPU memory for the weights, GiB")
      ->required()
      ->check(finite_between(0, 1 << 20));
  cmd->add_option("--prefetch", o.prefetch, "slots per block shape (prefetch distance)")
      ->capture_default_str();
  cmd->add_option("--link-gbps", o.link_gbps,
                  "the source's rate into the GPU, GB/s (default: pinned H2D measured on cuda:0)")
      ->check(finite_between(1e-3, 1e4));  // below 1 MB/s a step's time is no plan
  cmd->add_option("--block-ms", o.block_ms, "compute time of one block per step, ms")
      ->check(finite_between(0, 1e6));
  cmd->callback([] { run(o); });
}

}  // namespace ferry::cli
