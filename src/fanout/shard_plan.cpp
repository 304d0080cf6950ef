#include "ferry/shard_plan.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"

namespace ferry {
namespace {

std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// How a split tensor lies in its file: `outer` blocks of `length` x `unit` bytes along dim.
struct SplitGeometry {
  std::uint64_t outer = 1;
  std::uint64_t length = 0;
  std::uint64_t unit = 0;     // bytes of one step along dim
  std::uint64_t granule = 1;  // steps a split must keep together (a quantized block's bytes)
};

SplitGeometry geometry(const TensorInfo& t, int dim) {
  FERRY_EXPECT(static_cast<std::size_t>(dim) < t.shape.size(), std::invalid_argument, "tensor \"",
               t.name, "\": cannot split dimension ", dim, " of a tensor with ", t.shape.size(),
               " dimension(s)");
  SplitGeometry g;
  for (int d = 0; d < dim; ++d) g.outer *= t.shape[d];
  g.length = t.shape[dim];
  const std::uint64_t steps = g.outer * g.length;
  if (steps > 0) {
    FERRY_EXPECT(t.size % steps == 0, std::invalid_argument, "tensor \"", t.name, "\": its ",
                 t.size, " bytes do not divide into ", steps, " slices of dimension ", dim,
                 " (a packed element type)");
    g.unit = t.size / steps;
  }
  // A quantized GGUF tensor's last dimension counts bytes of whole blocks.
  if (t.ggml_type >= 0 && static_cast<std::size_t>(dim) + 1 == t.shape.size()) {
    const GgmlTypeTraits* traits = find_ggml_type(static_cast<std::uint32_t>(t.ggml_type));
    if (traits && traits->block_size > 1) g.granule = traits->type_size;
  }
  return g;
}

// Each rank's [begin, end) along the split dimension.
std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges(const TensorInfo& t,
                                                            const ShardSpec& spec,
                                                            const SplitGeometry& g,
                                                            unsigned ranks) {
  std::vector<std::uint64_t> sizes = spec.sizes;
  if (sizes.empty()) {
    FERRY_EXPECT(g.length % g.granule == 0, std::invalid_argument, "tensor \"", t.name,
                 "\": dimension ", spec.dim, " (", g.length,
                 ") is not a whole number of quantized blocks");
    const std::uint64_t blocks = g.length / g.granule;
    for (unsigned r = 0; r < ranks; ++r)
      sizes.push_back((blocks / ranks + (r < blocks % ranks ? 1 : 0)) * g.granule);
  }
  FERRY_EXPECT(sizes.size() == ranks, std::invalid_argument, "tensor \"", t.name,
               "\": ", sizes.size(), " split sizes given for ", ranks, " ranks");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::uint64_t at = 0;
  for (std::uint64_t s : sizes) {
    FERRY_EXPECT(s % g.granule == 0, std::invalid_argument, "tensor \"", t.name, "\": a split of ",
                 s, " along dimension ", spec.dim, " would cut a quantized block of ", g.granule,
                 " bytes");
    FERRY_EXPECT(s <= g.length - std::min(at, g.length), std::invalid_argument, "tensor \"", t.name,
                 "\": split sizes add up to more than dimension ", spec.dim, " (", g.length, ")");
    out.emplace_back(at, at + s);
    at += s;
  }
  FERRY_EXPECT(at == g.length, std::invalid_argument, "tensor \"", t.name,
               "\": split sizes add up to ", at, ", not to dimension ", spec.dim, " (", g.length,
               ")");
  return out;
}

// Appends byte runs (file range -> one rank's destination) to reads: a run continues the
// current read where it follows it in the same file and the read stays within chunk_bytes.
class ReadBuilder {
 public:
  explicit ReadBuilder(std::uint64_t chunk_bytes) : _chunk(chunk_bytes) {}

  void add(std::uint32_t file, std::uint64_t file_offset, std::uint64_t size, std::uint32_t rank,
           std::uint64_t dest_offset, std::uint32_t reader, bool to_scratch) {
    while (size > 0) {
      if (_reads.empty() || !continues(file, file_offset, reader))
        _reads.push_back({file, file_offset, 0, reader, {}});
      FanoutRead& r = _reads.back();
      const std::uint64_t n = std::min(size, _chunk - r.size);
      r.copies.push_back({rank, dest_offset, r.size, n, to_scratch});
      r.size += n;
      file_offset += n;
      dest_offset += n;
      size -= n;
    }
  }
  std::vector<FanoutRead> take() { return std::exchange(_reads, {}); }

 private:
  bool continues(std::uint32_t file, std::uint64_t file_offset, std::uint32_t reader) const {
    const FanoutRead& r = _reads.back();
    return r.file_index == file && r.reader == reader && r.file_offset + r.size == file_offset &&
           r.size < _chunk;
  }
  std::uint64_t _chunk;
  std::vector<FanoutRead> _reads;
};

// Takes reads from each reader's queue in turn, so that a batch keeps every link busy.
std::vector<FanoutRead> interleave(std::vector<std::vector<FanoutRead>>& queues) {
  std::vector<FanoutRead> out;
  std::vector<std::size_t> next(queues.size(), 0);
  for (bool any = true; any;) {
    any = false;
    for (std::size_t q = 0; q < queues.size(); ++q)
      if (next[q] < queues[q].size()) {
        out.push_back(std::move(queues[q][next[q]++]));
        any = true;
      }
  }
  for (auto& q : queues) q.clear();
  return out;
}

std::vector<const TensorInfo*> select(std::span<const TensorInfo> tensors,
                                      std::span<const std::string> names) {
  std::vector<const TensorInfo*> selected;
  if (names.empty()) {
    for (const auto& t : tensors) selected.push_back(&t);
  } else {
    std::unordered_map<std::string_view, const TensorInfo*> by_name;
    for (const auto& t : tensors) by_name.emplace(t.name, &t);
    std::unordered_set<const TensorInfo*> wanted;
    for (const auto& name : names) {
      auto it = by_name.find(name);
      FERRY_EXPECT(it != by_name.end(), std::invalid_argument, "no tensor named \"", name, "\"");
      wanted.insert(it->second);
    }
    for (const auto& t : tensors)
      if (wanted.count(&t)) selected.push_back(&t);
  }
  // Read order: by file, then offset (formats list tensors so already; the sort makes it sure).
  std::stable_sort(selected.begin(), selected.end(), [](const auto* a, const auto* b) {
    return std::tie(a->file_index, a->offset) < std::tie(b->file_index, b->offset);
  });
  return selected;
}

struct Planner {
  unsigned ranks;
  const FanoutPlanOptions& options;
  FanoutPlan plan;

  void layout_replicated(const std::vector<const TensorInfo*>& replicated,
                         std::vector<std::uint64_t>& offsets) {
    std::uint64_t end = 0;
    for (const TensorInfo* t : replicated) {
      offsets.push_back(align_up(end, options.alignment));
      end = offsets.back() + t->size;
    }
    // Rounds of ranks x round_bytes; the last one as small as its bytes allow.
    const std::uint64_t share = align_up(options.round_bytes, options.alignment);
    std::uint64_t at = 0;
    while (at < end) {
      const std::uint64_t left = end - at;
      const std::uint64_t per_rank =
          left >= share * ranks ? share : align_up((left + ranks - 1) / ranks, options.alignment);
      plan.rounds.push_back({{}, {}, at, per_rank});
      at += per_rank * ranks;
    }
    plan.replicated_bytes = at;
  }

  // Rank r reads its part of each round into its own memory; the all-gather does the rest.
  void read_replicated(const std::vector<const TensorInfo*>& replicated,
                       const std::vector<std::uint64_t>& offsets) {
    std::size_t first = 0;  // the first tensor that may still reach into the current share
    for (FanoutRound& round : plan.rounds) {
      std::vector<std::vector<FanoutRead>> queues(ranks);
      for (unsigned r = 0; r < ranks; ++r) {
        const std::uint64_t lo = round.gather_offset + r * round.gather_bytes_per_rank;
        const std::uint64_t hi = lo + round.gather_bytes_per_rank;
        ReadBuilder builder(options.chunk_bytes);
        while (first < replicated.size() && offsets[first] + replicated[first]->size <= lo) ++first;
        for (std::size_t i = first; i < replicated.size() && offsets[i] < hi; ++i) {
          const TensorInfo& t = *replicated[i];
          const std::uint64_t from = std::max(lo, offsets[i]);
          const std::uint64_t to = std::min(hi, offsets[i] + t.size);
          if (from >= to) continue;
          builder.add(t.file_index, t.offset + (from - offsets[i]), to - from, r, from, r, false);
        }
        queues[r] = builder.take();
      }
      round.reads = interleave(queues);
    }
  }

  // Sliced tensors: a split of the outermost dimension is one run per rank, read by that rank;
  // an inner split is read whole by the rank whose link carries least so far, into its scratch,
  // and cut from there.
  void read_sliced(
      const std::vector<std::pair<const TensorInfo*, std::vector<ShardPiece*>>>& sliced) {
    std::vector<std::uint64_t> link(ranks, 0);  // what each link carries so far
    for (const FanoutRound& round : plan.rounds)
      for (const FanoutRead& read : round.reads) link[read.reader] += read.size;
    plan.scratch_bank_bytes.assign(ranks, 0);
    std::vector<std::vector<FanoutRead>> queues(ranks);
    std::vector<FanoutScatter> scatters;
    std::vector<std::uint64_t> scratch(ranks, 0);  // used in the current round, per rank
    std::uint64_t queued = 0;
    auto flush = [&] {
      FanoutRound round;
      round.reads = interleave(queues);
      round.scatters = std::move(scatters);
      scatters.clear();
      if (round.reads.empty()) return;
      plan.rounds.push_back(std::move(round));
      queued = 0;
      scratch.assign(ranks, 0);
    };
    // Scratch offsets are within the round's bank; fixed up once the bank sizes are known.
    for (const auto& [t, pieces] : sliced) {
      const int dim = pieces.front()->dim;
      const SplitGeometry g = geometry(*t, dim);
      if (g.outer == 1) {
        for (unsigned r = 0; r < ranks; ++r) {
          const ShardPiece& p = *pieces[r];
          ReadBuilder builder(options.chunk_bytes);
          builder.add(t->file_index, t->offset + p.begin * g.unit, p.bytes, r, p.dest_offset, r,
                      false);
          for (auto& read : builder.take()) queues[r].push_back(std::move(read));
          link[r] += p.bytes;
        }
      } else if (t->size > 0) {
        const auto reader =
            static_cast<std::uint32_t>(std::min_element(link.begin(), link.end()) - link.begin());
        const std::uint64_t at = align_up(scratch[reader], options.alignment);
        scratch[reader] = at + t->size;
        ReadBuilder builder(options.chunk_bytes);
        builder.add(t->file_index, t->offset, t->size, reader, at, reader, true);
        for (auto& read : builder.take()) queues[reader].push_back(std::move(read));
        link[reader] += t->size;
        FanoutScatter sc{t, reader, at, g.outer, g.length * g.unit, {}};
        for (unsigned r = 0; r < ranks; ++r) {
          const ShardPiece& p = *pieces[r];
          if (p.bytes > 0)
            sc.parts.push_back({r, p.dest_offset, p.begin * g.unit, (p.end - p.begin) * g.unit});
        }
        scatters.push_back(std::move(sc));
      }
      queued += t->size;
      const std::size_t bank = plan.rounds.size() % 2;  // the index the round will have
      scratch_banks[bank].resize(ranks, 0);
      for (unsigned r = 0; r < ranks; ++r)
        scratch_banks[bank][r] = std::max(scratch_banks[bank][r], scratch[r]);
      if (queued >= options.round_bytes * ranks) flush();
    }
    flush();
    // Both banks take the larger one's size; every copy and scatter of an odd round moves to
    // the second bank.
    for (auto& bank : scratch_banks) bank.resize(ranks, 0);
    for (unsigned r = 0; r < ranks; ++r)
      plan.scratch_bank_bytes[r] =
          align_up(std::max(scratch_banks[0][r], scratch_banks[1][r]), options.alignment);
    for (std::size_t k = 1; k < plan.rounds.size(); k += 2) {
      FanoutRound& round = plan.rounds[k];
      for (FanoutRead& read : round.reads)
        for (FanoutCopy& c : read.copies)
          if (c.to_scratch) c.dest_offset += plan.scratch_bank_bytes[c.rank];
      for (FanoutScatter& sc : round.scatters)
        sc.scratch_offset += plan.scratch_bank_bytes[sc.reader];
    }
  }

  std::vector<std::uint64_t> scratch_banks[2];
};

}  // namespace

ShardSpec replicate_all(const TensorInfo&) { return ShardSpec::replicate(); }

FanoutPlan plan_fanout(std::span<const TensorInfo> tensors, unsigned ranks, const ShardRule& rule,
                       std::span<const std::string> names, const FanoutPlanOptions& options) {
  FERRY_EXPECT(ranks > 0, std::invalid_argument, "a multi-device load needs at least one device");
  FERRY_EXPECT(options.chunk_bytes > 0 && options.round_bytes > 0, std::invalid_argument,
               "multi-device load: chunk and round sizes must be positive");
  FERRY_EXPECT(options.alignment > 0 && (options.alignment & (options.alignment - 1)) == 0,
               std::invalid_argument, "multi-device load: alignment ", options.alignment,
               " is not a power of two");
  Planner planner{ranks, options, {}, {}};
  FanoutPlan& plan = planner.plan;
  plan.ranks = ranks;
  plan.layouts.resize(ranks);
  const std::vector<const TensorInfo*> selected = select(tensors, names);

  // Specs first (every error before any work), then the replicated region, then the slices.
  std::vector<ShardSpec> specs;
  std::vector<const TensorInfo*> replicated;
  for (const TensorInfo* t : selected) {
    specs.push_back(rule ? rule(*t) : ShardSpec::replicate());
    if (specs.back().replicated()) replicated.push_back(t);
  }
  std::vector<std::uint64_t> replicated_offsets;
  planner.layout_replicated(replicated, replicated_offsets);
  std::unordered_map<const TensorInfo*, std::uint64_t> region_offset;
  for (std::size_t i = 0; i < replicated.size(); ++i)
    region_offset.emplace(replicated[i], replicated_offsets[i]);

  std::vector<std::uint64_t> ends(ranks, plan.replicated_bytes);
  for (std::size_t i = 0; i < selected.size(); ++i) {
    const TensorInfo& t = *selected[i];
    const ShardSpec& spec = specs[i];
    if (spec.replicated()) {
      for (unsigned r = 0; r < ranks; ++r)
        plan.layouts[r].pieces.push_back({&t, -1, 0, 0, t.shape, t.size, region_offset.at(&t)});
      continue;
    }
    const SplitGeometry g = geometry(t, spec.dim);
    const auto bounds = ranges(t, spec, g, ranks);
    for (unsigned r = 0; r < ranks; ++r) {
      ShardPiece p{&t, spec.dim, bounds[r].first, bounds[r].second, t.shape, 0, 0};
      p.shape[spec.dim] = p.end - p.begin;
      p.bytes = g.outer * (p.end - p.begin) * g.unit;
      p.dest_offset = align_up(ends[r], options.alignment);
      ends[r] = p.dest_offset + p.bytes;
      plan.layouts[r].pieces.push_back(std::move(p));
    }
  }
  for (unsigned r = 0; r < ranks; ++r) {
    RankLayout& l = plan.layouts[r];
    l.dest_bytes = ends[r];
    for (const auto& p : l.pieces) l.tensor_bytes += p.bytes;
  }

  // The pieces now have their final addresses: plan the reads.
  planner.read_replicated(replicated, replicated_offsets);
  std::vector<std::pair<const TensorInfo*, std::vector<ShardPiece*>>> sliced;
  for (std::size_t i = 0; i < selected.size(); ++i) {
    if (specs[i].replicated()) continue;
    std::vector<ShardPiece*> pieces;
    for (unsigned r = 0; r < ranks; ++r) pieces.push_back(&plan.layouts[r].pieces[i]);
    sliced.emplace_back(selected[i], std::move(pieces));
  }
  planner.read_sliced(sliced);

  plan.link_bytes.assign(ranks, 0);
  plan.peer_bytes.assign(ranks, 0);
  for (const FanoutRound& round : plan.rounds) {
    for (const FanoutRead& read : round.reads) {
      plan.read_bytes += read.size;
      for (const FanoutCopy& c : read.copies) plan.link_bytes[c.rank] += c.size;
    }
    for (const FanoutScatter& sc : round.scatters)
      for (const ScatterPart& part : sc.parts)
        if (part.rank != sc.reader) plan.peer_bytes[part.rank] += part.width * sc.rows;
    if (ranks > 1)
      for (unsigned r = 0; r < ranks; ++r)
        plan.peer_bytes[r] += round.gather_bytes_per_rank * (ranks - 1);
  }
  return plan;
}

FanoutPlan plan_fanout(const Checkpoint& checkpoint, unsigned ranks, const ShardRule& rule,
                       std::span<const std::string> names, const FanoutPlanOptions& options) {
  try {
    return plan_fanout(checkpoint.tensors(), ranks, rule, names, options);
  } catch (const std::invalid_argument& e) {
    detail::fail<std::invalid_argument>(checkpoint.path().string(), ": ", e.what());
  }
}

}  // namespace ferry
