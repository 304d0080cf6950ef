#include "transfer/staged/staged_page_cache.hpp"

#include <cstdio>

#include "platform/file_mapping.hpp"

namespace ferry::detail {

std::unique_ptr<PageCacheFile[]> lease_page_cache(const TicketState& t) {
  if (t.options.page_cache_pin_bytes == 0 || t.direction != Direction::FileToMemory) return nullptr;
  PageCacheRegistry& registry = page_cache_registry();
  const std::size_t n = t.files->size();
  auto files = std::make_unique<PageCacheFile[]>(n);
  std::unique_ptr<bool[]> named = std::make_unique<bool[]>(n);
  std::unique_ptr<bool[]> served = std::make_unique<bool[]>(n);
  for (const Extent& x : t.extents) {
    named[x.file] = true;
    for (const MemorySpan& s : x.spans)
      if (s.data && registry.serves(s.device)) served[x.file] = true;
  }
  for (std::uint32_t f = 0; f < n; ++f) {
    PageCacheFile& pc = files[f];
    if (!named[f]) continue;
    if (!file_mapping_supported()) {
      pc.why_not = "not supported on this platform";
      continue;
    }
    if (!served[f]) {
      pc.why_not = "its destination is host memory (page-cache DMA serves GPU memory)";
      continue;
    }
    try {
      auto got = registry.acquire(*t.files->acquire(f, false), t.options.page_cache_pin_bytes);
      pc.lease = std::move(got.lease);
      pc.why_not = std::move(got.why_not);
      pc.registered_now = got.registered_now;
      pc.register_seconds = got.register_seconds;
    } catch (const std::exception& e) {
      pc.why_not = e.what();  // the file could not be opened again: the staged path says more
    }
  }
  return files;
}

bool all_from_page_cache(const TicketState& t, const PageCacheFile* files) {
  if (files == nullptr) return false;
  for (const Extent& x : t.extents) {
    std::uint64_t size = 0;
    for (const MemorySpan& s : x.spans) size += s.size;
    if (!from_page_cache(files, x.file, x.file_offset, size)) return false;
  }
  return true;
}

void add_copy_runs(const Extent& x, const Piece& p, std::uint32_t piece, const std::byte* source,
                   std::vector<CopyRun>& runs) {
  for_spans(
      x, p,
      [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece, std::uint64_t n) {
        if (!s.data) return;  // a hole
        const auto memory = reinterpret_cast<std::uintptr_t>(s.data) + in_span;
        if (!runs.empty()) {
          CopyRun& r = runs.back();
          if (r.device == s.device && r.memory + r.size == memory &&
              r.source + r.size == source + in_piece) {
            r.size += n;
            r.last_piece = piece;
            return;
          }
        }
        runs.push_back({s.device, memory, source + in_piece, n, piece, piece});
      });
}

FileLoadStats page_cache_file_stats(const PageCacheFile& f, const std::filesystem::path& path) {
  std::string reason = "copied from its read-only page-cache mapping, ";
  if (f.registered_now) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f ms", f.register_seconds * 1e3);
    reason += std::string("registered by this transfer in ") + ms;
  } else {
    reason += "registered by an earlier transfer and kept";
  }
  return {path, IoPath::PageCacheDma, std::move(reason), f.bytes.load()};
}

}  // namespace ferry::detail
