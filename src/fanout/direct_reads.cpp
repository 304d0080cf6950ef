#include "fanout/direct_reads.hpp"

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "transfer/page_cache_registry.hpp"

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

DirectCopies::DirectCopies(std::span<const Device> devices) {
  for (const Device& d : devices) _copiers.push_back(make_copier(d, 1));
}

DirectCopies::~DirectCopies() {
  drain();
  _marks.clear();
  // Last made, first gone: each copier restores the capture mode it found on this thread.
  while (!_copiers.empty()) _copiers.pop_back();
}

void* DirectCopies::queue(unsigned rank, std::span<const DirectCopy> copies) {
  Copier& copier = *_copiers[rank];
  for (const DirectCopy& c : copies) copier.put(c.dst, c.src, c.size);
  PooledEvent end = copier.mark_end();
  if (!end) return nullptr;
  _marks.push_back(std::move(end));
  return _marks.back()->get();
}

void DirectCopies::after(unsigned rank, void* cu_event) {
  if (cu_event) _copiers[rank]->after(cu_event);
}

void DirectCopies::drain() noexcept {
  for (auto& c : _copiers) c->drain();
}

}  // namespace ferry::detail
