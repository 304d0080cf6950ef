#include "kv/slab_files.hpp"

#include <algorithm>
#include <cerrno>
#include <map>

#include "ferry/error.hpp"
#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"

namespace ferry::detail::kv {

SlabFiles::SlabFiles(const std::filesystem::path& directory, unsigned count,
                     std::uint64_t slab_bytes, bool writable) {
  for (unsigned i = 0; i < count; ++i) {
    auto file = std::make_unique<File>();
    file->path = directory / ("slab-" + std::to_string(i) + ".dat");
    file->name = file->path.string();
    file->buffered = writable ? open_or_create(file->path, 0600) : open_existing(file->path, false);
    if (!file->buffered) FERRY_SYSCALL_FAIL(file->name, ": cannot open slab file");
    const std::uint64_t size = file_size(file->buffered, file->path);  // a regular file
    FERRY_EXPECT(size <= slab_bytes, std::invalid_argument, file->name, ": slab file is ", size,
                 " bytes, the store's slabs are ", slab_bytes);
    if (size < slab_bytes) {
      FERRY_EXPECT(writable, std::invalid_argument, file->name, ": slab file is ", size,
                   " bytes, the store's slabs are ", slab_bytes);
      const int error = preallocate(file->buffered.get(), slab_bytes);
      if (error != 0)
        detail::fail_errno(error, file->name, ": cannot preallocate ", slab_bytes, " bytes");
      if (!sync_all(file->buffered.get())) FERRY_SYSCALL_FAIL(file->name, ": fsync");
    }
    // O_DIRECT where allowed (tmpfs and some others refuse it with EINVAL).
    file->direct = open_existing(file->path, writable, true);
    file->use_direct = bool(file->direct);
    _files.push_back(std::move(file));
  }
}

NativeDescriptor SlabFiles::fd(int slab) const {
  const File& file = *_files[slab];
  return file.use_direct.load() ? file.direct.get() : file.buffered.get();
}

bool SlabFiles::cached(int slab, std::uint64_t offset, std::uint64_t length) const {
  return range_resident(_files[slab]->buffered.get(), offset, length);
}

namespace {

// The span each slab's ranges cover.
struct Span {
  std::uint64_t first = UINT64_MAX, end = 0, bytes = 0;
};

std::map<int, Span> spans_of(std::span<const SlabFiles::Range> ranges) {
  std::map<int, Span> spans;
  for (const SlabFiles::Range& r : ranges) {
    Span& s = spans[r.slab];
    s.first = std::min(s.first, r.offset);
    s.end = std::max(s.end, r.offset + r.length);
    s.bytes += r.length;
  }
  return spans;
}

// A span much larger than its blocks (slots scattered over the slab) is not worth one probe.
bool worth_one_probe(const Span& s) { return s.end - s.first <= 4 * s.bytes; }

}  // namespace

std::vector<bool> SlabFiles::cached(std::span<const Range> ranges) const {
  std::map<int, bool> whole;  // slabs whose span is resident
  for (const auto& [slab, s] : spans_of(ranges))
    whole[slab] = worth_one_probe(s) && cached(slab, s.first, s.end - s.first);
  std::vector<bool> out(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i)
    out[i] = whole[ranges[i].slab] || cached(ranges[i].slab, ranges[i].offset, ranges[i].length);
  return out;
}

bool SlabFiles::all_cached(std::span<const Range> ranges) const {
  // Sampled: probing every page of a 256 MiB batch costs about a millisecond, a fifth of moving
  // it at pinned H2D speed. A page missed costs a buffered read of it, never a wrong byte.
  constexpr unsigned kSpanWindows = 64, kRangeWindows = 8;
  const auto sampled = [&](int slab, std::uint64_t offset, std::uint64_t length, unsigned windows) {
    return range_resident_sampled(_files[slab]->buffered.get(), offset, length, windows);
  };
  std::map<int, bool> whole;
  for (const auto& [slab, s] : spans_of(ranges)) {
    if (!worth_one_probe(s)) continue;
    if (!sampled(slab, s.first, s.end - s.first, kSpanWindows)) return false;
    whole[slab] = true;
  }
  for (const Range& r : ranges)
    if (!whole[r.slab] && !sampled(r.slab, r.offset, r.length, kRangeWindows)) return false;
  return true;
}

}  // namespace ferry::detail::kv
