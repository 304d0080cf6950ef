#include "fanout/direct_reads.hpp"

#include <algorithm>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "services/page_cache_registry.hpp"

namespace ferry::detail {

MapSources staged_sources_only() {
  return [](const Checkpoint& checkpoint, const std::vector<bool>&, std::span<const Device>,
            const LoadOptions&) { return std::vector<MappedSource>(checkpoint.files().size()); };
}

MapSources page_cache_sources() {
  return [](const Checkpoint& checkpoint, const std::vector<bool>& used,
            std::span<const Device> devices, const LoadOptions& options) {
    std::vector<MappedSource> out(checkpoint.files().size());
    const std::uint64_t budget = options.page_cache_pin_bytes;
    if (budget == 0) return out;
    PageCacheRegistry& registry = page_cache_registry();
    for (const Device& d : devices)
      if (!registry.serves(d)) {
        for (MappedSource& s : out)
          s.reason = "no page-cache DMA: " + registry.registrar_name() +
                     " registrations do not serve " + d.to_string();
        return out;
      }
    const FileSet& files = checkpoint.file_set();
    for (std::uint32_t i = 0; i < out.size(); ++i) {
      if (!used[i]) continue;
      PageCacheRegistry::Acquired got = registry.acquire(*files.acquire(i, false), budget);
      if (!got.lease) {
        out[i].reason = "no page-cache DMA: " + got.why_not;
        continue;
      }
      auto lease = std::make_shared<PageCacheRegistry::Lease>(std::move(got.lease));
      out[i] = {lease->data(), lease->size(), lease,
                got.registered_now ? "straight from the page cache (registered by this load)"
                                   : "straight from the page cache (registered by an earlier load)",
                got.registered_now ? got.register_seconds : 0.0};
    }
    return out;
  };
}

RoundReads split_round(const FanoutRound& round, std::span<const MappedSource> sources,
                       std::span<const std::uintptr_t> bases,
                       std::span<const std::uintptr_t> scratch, unsigned ranks,
                       std::vector<std::uint64_t>& file_bytes) {
  RoundReads out;
  out.direct.resize(ranks);
  out.direct_to_scratch.assign(ranks, false);
  for (const FanoutRead& read : round.reads) {
    const MappedSource* source =
        read.file_index < sources.size() ? &sources[read.file_index] : nullptr;
    if (!source || !source->data) {
      out.staged.push_back(read);
      for (const FanoutCopy& c : read.copies) out.staged_to_scratch |= c.to_scratch;
      continue;
    }
    FERRY_EXPECT(read.file_offset <= source->size && read.size <= source->size - read.file_offset,
                 std::invalid_argument, "multi-device load: bytes ", read.file_offset, "..",
                 read.file_offset + read.size, " of file ", read.file_index,
                 " lie outside its mapping of ", source->size, " bytes");
    for (const FanoutCopy& c : read.copies) {
      const std::uintptr_t dst = (c.to_scratch ? scratch : bases)[c.rank] + c.dest_offset;
      const std::byte* src = source->data + read.file_offset + c.chunk_offset;
      std::vector<DirectCopy>& queue = out.direct[c.rank];
      if (!queue.empty() && queue.back().dst + queue.back().size == dst &&
          queue.back().src + queue.back().size == src) {
        queue.back().size += c.size;
      } else {
        queue.push_back({dst, src, c.size});
      }
      out.direct_to_scratch[c.rank] = out.direct_to_scratch[c.rank] || c.to_scratch;
      out.direct_bytes += c.size;
      file_bytes[read.file_index] += c.size;
    }
  }
  return out;
}

DirectCopies::DirectCopies(std::span<const Device> devices, unsigned streams,
                           std::uint64_t min_part_bytes)
    : _min_part(std::max<std::uint64_t>(1, min_part_bytes)) {
  for (const Device& d : devices) {
    auto& mine = _copiers.emplace_back();
    for (unsigned s = 0; s < std::max(1u, streams); ++s) mine.push_back(make_copier(d, 1));
  }
}

DirectCopies::~DirectCopies() {
  drain();
  _marks.clear();
  // Last made, first gone: each copier restores the capture mode it found on this thread.
  while (!_copiers.empty()) {
    while (!_copiers.back().empty()) _copiers.back().pop_back();
    _copiers.pop_back();
  }
}

std::vector<void*> DirectCopies::queue(unsigned rank, std::span<const DirectCopy> copies) {
  std::vector<std::unique_ptr<Copier>>& streams = _copiers[rank];
  std::uint64_t total = 0;
  for (const DirectCopy& c : copies) total += c.size;
  const std::uint64_t parts = std::clamp<std::uint64_t>(total / _min_part, 1, streams.size());
  const std::uint64_t share = (total + parts - 1) / parts;
  // Stream s takes bytes [s * share, (s + 1) * share) of the round's copies, in order.
  std::uint64_t at = 0;
  for (const DirectCopy& c : copies)
    for (std::uint64_t done = 0; done < c.size;) {
      const std::uint64_t s = at / share;
      const std::uint64_t n = std::min(c.size - done, (s + 1) * share - at);
      streams[s]->put(c.dst + done, c.src + done, n);
      done += n;
      at += n;
    }
  std::vector<void*> ends;
  for (std::uint64_t s = 0; s < parts; ++s) {
    PooledEvent end = streams[s]->mark_end();
    if (!end) continue;
    _marks.push_back(std::move(end));
    ends.push_back(_marks.back()->get());
  }
  return ends;
}

void DirectCopies::after(unsigned rank, void* cu_event) {
  if (!cu_event) return;
  for (auto& c : _copiers[rank]) c->after(cu_event);
}

void DirectCopies::drain() noexcept {
  for (auto& rank : _copiers)
    for (auto& c : rank) c->drain();
}

}  // namespace ferry::detail
