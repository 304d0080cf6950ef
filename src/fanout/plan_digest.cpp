// The digest ranks compare before exchanging bytes (fanout_plan_digest).
#include <xxhash.h>

#include <memory>
#include <new>

#include "ferry/fanout_load.hpp"

namespace ferry {
namespace {

struct Digest {
  XXH3_state_t* state = XXH3_createState();
  Digest() {
    if (state == nullptr || XXH3_64bits_reset(state) != XXH_OK) throw std::bad_alloc();
  }
  ~Digest() { XXH3_freeState(state); }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void add(std::uint64_t value) { XXH3_64bits_update(state, &value, sizeof value); }
  void add(const std::string& text) {
    add(text.size());
    XXH3_64bits_update(state, text.data(), text.size());
  }
};

}  // namespace

std::uint64_t fanout_plan_digest(const FanoutPlan& plan) {
  Digest d;
  d.add(plan.ranks);
  for (const RankLayout& layout : plan.layouts) {
    d.add(layout.dest_bytes);
    for (const ShardPiece& p : layout.pieces) {
      d.add(p.info->name);
      d.add(static_cast<std::uint64_t>(p.info->dtype));
      d.add(p.info->file_index);
      d.add(p.info->offset);
      d.add(p.info->size);
      d.add(static_cast<std::uint64_t>(p.dim + 1));
      d.add(p.begin);
      d.add(p.end);
      d.add(p.dest_offset);
    }
  }
  for (std::uint64_t bytes : plan.scratch_bank_bytes) d.add(bytes);
  for (const FanoutRound& round : plan.rounds) {
    d.add(round.reads.size());
    for (const FanoutRead& read : round.reads) {
      d.add(read.file_index);
      d.add(read.file_offset);
      d.add(read.size);
      d.add(read.reader);
    }
    for (const FanoutScatter& sc : round.scatters) {
      d.add(sc.reader);
      d.add(sc.scratch_offset);
      d.add(sc.rows);
      d.add(sc.row_bytes);
      for (const ScatterPart& part : sc.parts) {
        d.add(part.rank);
        d.add(part.dest_offset);
        d.add(part.row_begin);
        d.add(part.width);
      }
    }
    d.add(round.gather_offset);
    d.add(round.gather_bytes_per_rank);
  }
  return XXH3_64bits_digest(d.state);
}

}  // namespace ferry
