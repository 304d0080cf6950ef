#include "load/load_plan.hpp"

#include <algorithm>
#include <unordered_set>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kPageBytes = 4096;

std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

std::vector<const TensorInfo*> select(const Checkpoint& checkpoint,
                                      std::span<const std::string> names) {
  std::vector<const TensorInfo*> selected;
  if (names.empty()) {
    for (const auto& t : checkpoint.tensors()) selected.push_back(&t);
    return selected;
  }
  std::unordered_set<const TensorInfo*> wanted;
  for (const auto& name : names) {
    const TensorInfo* t = checkpoint.find(name);
    FERRY_EXPECT(t != nullptr, std::invalid_argument, checkpoint.path().string(),
                 ": no tensor named \"", name, "\"");
    wanted.insert(t);
  }
  for (const auto& t : checkpoint.tensors())
    if (wanted.count(&t)) selected.push_back(&t);  // keeps read order
  return selected;
}

// Builds chunks over the selection, which is sorted by (file, offset) and never overlaps.
class ChunkBuilder {
 public:
  ChunkBuilder(const PlanOptions& options, std::vector<ReadChunk>& out)
      : _options(options), _out(out) {}

  void add(std::uint32_t tensor, const TensorInfo& info) {
    std::uint64_t pos = info.offset;
    std::uint64_t done = 0;
    while (done < info.size) {
      if (!fits(info.file_index, pos)) open(info.file_index, pos);
      ReadChunk& c = _out.back();
      std::uint64_t n = std::min(info.size - done, limit(c) - pos);
      c.copies.push_back({tensor, done, pos - c.file_offset, n});
      c.size = pos + n - c.file_offset;
      pos += n;
      done += n;
    }
  }

 private:
  // Chunks that split a tensor end on a page boundary, so O_DIRECT reads stay aligned.
  std::uint64_t limit(const ReadChunk& c) const {
    std::uint64_t end = c.file_offset + _options.chunk_bytes;
    std::uint64_t aligned = end / kPageBytes * kPageBytes;
    return aligned > c.file_offset ? aligned : end;
  }

  bool fits(std::uint32_t file, std::uint64_t pos) const {
    if (_out.empty()) return false;
    const ReadChunk& c = _out.back();
    const std::uint64_t end = c.file_offset + c.size;
    return c.file_index == file && pos <= end + _options.max_gap_bytes && pos < limit(c);
  }

  void open(std::uint32_t file, std::uint64_t pos) {
    _out.push_back(ReadChunk{file, pos, 0, {}});
  }

  const PlanOptions& _options;
  std::vector<ReadChunk>& _out;
};

}  // namespace

LoadPlan plan_load(const Checkpoint& checkpoint, std::span<const std::string> names,
                   const PlanOptions& options) {
  FERRY_EXPECT(options.chunk_bytes > 0, std::invalid_argument, "chunk size must be positive");
  FERRY_EXPECT(options.alignment > 0 && (options.alignment & (options.alignment - 1)) == 0,
               std::invalid_argument, "alignment ", options.alignment, " is not a power of two");
  LoadPlan plan;
  plan.tensors = select(checkpoint, names);
  ChunkBuilder builder(options, plan.chunks);
  for (std::uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo& t = *plan.tensors[i];
    plan.dest_bytes = align_up(plan.dest_bytes, options.alignment);
    plan.dest_offsets.push_back(plan.dest_bytes);
    plan.dest_bytes += t.size;
    plan.tensor_bytes += t.size;
    builder.add(i, t);
  }
  for (const auto& c : plan.chunks) plan.read_bytes += c.size;
  return plan;
}

}  // namespace ferry
