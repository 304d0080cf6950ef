#include "ferry/tensor_reader.hpp"

#include <atomic>
#include <cerrno>
#include <mutex>
#include <optional>

#include "ferry/error.hpp"
#include "platform/file_descriptor.hpp"
#include "io/source_file.hpp"

namespace ferry {

struct TensorReader::Files {
  std::vector<detail::FileDescriptor> fds;  // one per Checkpoint::files() entry
  std::atomic<std::uint64_t> bytes_read{0};
  // Per file, the I/O path of submissions, chosen at the first one from the file's residency
  // (sampled once for the reader's life: the engine measures again each second, and a
  // measurement of a large file costs more than a small read).
  std::mutex io_mutex;
  std::vector<std::optional<IoMode>> io;
};

namespace {

void expect_inside(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length) {
  FERRY_EXPECT(begin <= tensor.size && length <= tensor.size - begin, std::out_of_range,
               "tensor \"", tensor.name, "\": bytes [", begin, ", ", begin + length,
               ") are outside its ", tensor.size, " bytes");
}

}  // namespace

TensorReader::TensorReader(std::shared_ptr<const Checkpoint> checkpoint)
    : _checkpoint(std::move(checkpoint)), _files(std::make_unique<Files>()) {
  FERRY_EXPECT(_checkpoint != nullptr, std::invalid_argument, "TensorReader needs a checkpoint");
  for (const auto& file : _checkpoint->files()) {
    auto fd = detail::open_for_reading(file.path);
    const std::uint64_t size = detail::file_size(fd, file.path);
    FERRY_FORMAT_EXPECT(size == file.size, file.path.string(), ": file is ", size,
                        " bytes now but was ", file.size, " when its header was read");
    _files->fds.push_back(std::move(fd));
  }
  _files->io.resize(_files->fds.size());
}

TensorReader::TensorReader(TensorReader&&) noexcept = default;
TensorReader& TensorReader::operator=(TensorReader&&) noexcept = default;
TensorReader::~TensorReader() = default;

void TensorReader::read(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length,
                        void* host) const {
  expect_inside(tensor, begin, length);
  FERRY_EXPECT(tensor.file_index < _files->fds.size(), std::out_of_range, "tensor \"", tensor.name,
               "\" names file ", tensor.file_index, " of ", _files->fds.size());
  if (length == 0) return;
  const auto& path = _checkpoint->files()[tensor.file_index].path;
  const auto& fd = _files->fds[tensor.file_index];
  // read_up_to stops only at the end of the file: a short count means it was truncated.
  const std::size_t got = detail::read_up_to(fd, host, length, tensor.offset + begin, path);
  _files->bytes_read.fetch_add(got, std::memory_order_relaxed);
  FERRY_FORMAT_EXPECT(got == length, path.string(), ": tensor \"", tensor.name,
                      "\": the file ends inside its data (truncated after it was opened)");
}

void TensorReader::read_ranges(const TensorInfo& tensor, std::span<const Range> ranges,
                               void* host) const {
  for (const Range& r : ranges) {
    FERRY_EXPECT(r.begin <= r.end, std::out_of_range, "tensor \"", tensor.name, "\": byte range [",
                 r.begin, ", ", r.end, ") is reversed");
    expect_inside(tensor, r.begin, r.end - r.begin);
  }
  auto* out = static_cast<std::byte*>(host);
  for (std::size_t i = 0; i < ranges.size();) {
    // Ranges that touch in the file are also back to back in `host`: one read.
    std::uint64_t begin = ranges[i].begin, end = ranges[i].end;
    for (++i; i < ranges.size() && ranges[i].begin == end; ++i) end = ranges[i].end;
    read(tensor, begin, end - begin, out);
    out += end - begin;
  }
}

Ticket TensorReader::submit(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length,
                            void* to, const Device& device, void* after_event) const {
  const Range range{begin, begin + length};
  expect_inside(tensor, begin, length);
  return submit_ranges(tensor, std::span(&range, 1), to, device, after_event);
}

Ticket TensorReader::submit_ranges(const TensorInfo& tensor, std::span<const Range> ranges,
                                   void* to, const Device& device, void* after_event) const {
  for (const Range& r : ranges) {
    FERRY_EXPECT(r.begin <= r.end, std::out_of_range, "tensor \"", tensor.name, "\": byte range [",
                 r.begin, ", ", r.end, ") is reversed");
    expect_inside(tensor, r.begin, r.end - r.begin);
  }
  std::vector<Extent> extents;
  auto* out = static_cast<std::byte*>(to);
  for (std::size_t i = 0; i < ranges.size();) {
    std::uint64_t begin = ranges[i].begin, end = ranges[i].end;
    for (++i; i < ranges.size() && ranges[i].begin == end; ++i) end = ranges[i].end;
    if (end > begin)
      extents.push_back({tensor.file_index, tensor.offset + begin, {{device, out, end - begin}}});
    out += end - begin;
  }
  TransferOptions options;
  options.stop_at_first_error = true;
  options.io = io_mode(tensor.file_index);
  options.after_event = after_event;
  return ferry::submit(_checkpoint->shared_file_set(), Direction::FileToMemory, std::move(extents),
                       options);
}

Ticket TensorReader::submit_tensors(std::span<const Whole> tensors, const Device& device,
                                    void* after_event) const {
  std::vector<Extent> extents;
  extents.reserve(tensors.size());
  std::optional<IoMode> io;
  for (const Whole& w : tensors) {
    FERRY_EXPECT(w.tensor != nullptr, std::invalid_argument, "submit_tensors: a null tensor");
    const TensorInfo& t = *w.tensor;
    if (t.size == 0) continue;
    FERRY_EXPECT(w.to != nullptr, std::invalid_argument, "submit_tensors: tensor \"", t.name,
                 "\" has no memory to go to");
    FERRY_EXPECT(t.file_index < _files->fds.size(), std::out_of_range, "tensor \"", t.name,
                 "\" names file ", t.file_index, " of ", _files->fds.size());
    // One I/O path per ticket: the files' own where they agree, else through the page cache
    // (which every file system serves).
    const IoMode mode = io_mode(t.file_index);
    io = !io || *io == mode ? mode : IoMode::Buffered;
    extents.push_back({t.file_index, t.offset, {{device, w.to, t.size}}});
  }
  TransferOptions options;
  options.stop_at_first_error = true;
  options.io = io.value_or(IoMode::Buffered);
  options.after_event = after_event;
  return ferry::submit(_checkpoint->shared_file_set(), Direction::FileToMemory, std::move(extents),
                       options);
}

bool TensorReader::through_page_cache(const TensorInfo& tensor) const {
  return io_mode(tensor.file_index) == IoMode::Buffered;
}

IoMode TensorReader::io_mode(std::uint32_t file) const {
  FERRY_EXPECT(file < _files->fds.size(), std::out_of_range, "file ", file, " of ",
               _files->fds.size());
  std::lock_guard lock(_files->io_mutex);
  auto& mode = _files->io[file];
  if (!mode) {
    // Mostly cached: through the page cache. Otherwise O_DIRECT where the file system allows.
    const auto& entry = _checkpoint->files()[file];
    const bool cached = detail::page_cache_fraction(_files->fds[file], entry.size) >= 0.5;
    mode = cached || !detail::try_open_direct(entry.path) ? IoMode::Buffered : IoMode::Direct;
  }
  return *mode;
}

void TensorReader::wait(const Ticket& ticket) const {
  ticket.wait();
  ticket.rethrow_if_failed();
  _files->bytes_read.fetch_add(ticket.stats().bytes_moved, std::memory_order_relaxed);
}

std::uint64_t TensorReader::bytes_read() const noexcept {
  return _files->bytes_read.load(std::memory_order_relaxed);
}

}  // namespace ferry
