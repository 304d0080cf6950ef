#include "save/span_writer.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "ferry/transfer.hpp"

namespace ferry::detail {

SpanWriteStats write_spans(OutputFile& file, std::span<const MemorySpan> spans,
                           const SpanWriteOptions& options) {
  SpanWriteStats stats;
  Extent whole{0, 0, {}};
  std::map<int, std::unique_ptr<PrimaryContext>> contexts;
  for (const auto& s : spans) {
    if (s.size == 0) continue;
    stats.bytes += s.size;
    const Device device = s.cuda_device >= 0 ? Device::cuda(s.cuda_device) : Device::cpu();
    whole.spans.push_back({device, const_cast<std::byte*>(s.data), s.size});
    if (s.cuda_device >= 0 && !contexts.count(s.cuda_device))
      contexts.emplace(s.cuda_device, std::make_unique<PrimaryContext>(s.cuda_device));
  }
  if (stats.bytes == 0) return stats;
  // The transfer core copies on streams of its own: what the device's default stream still has
  // queued (a kernel writing a tensor) lands first, as a synchronous copy would have waited.
  for (auto& [device, context] : contexts) {
    context->make_current();
    FERRY_CU(cuStreamSynchronize, nullptr);
  }

  auto set = FileSet::create(1);
  set->add(file.temporary_path(), FileAccess::ReadWrite);
  TransferOptions t;
  t.backend = Backend::Posix;
  t.io = options.direct ? IoMode::Auto : IoMode::Buffered;
  t.threads = std::max(1u, options.writer_threads);
  t.chunk_bytes = std::max<std::uint64_t>(options.piece_bytes, 1);
  t.slots_per_thread = 2;  // the copy of the next piece runs while this one is written
  // Room for one piece in flight (a slot holds a piece and an unaligned head) however small the
  // staging asked for.
  const std::uint64_t piece =
      (t.chunk_bytes + kWriteAlignment - 1) / kWriteAlignment * kWriteAlignment;
  t.staging_bytes = std::max(options.staging_bytes, 2 * piece);
  t.stop_at_first_error = true;
  Ticket ticket = submit(std::move(set), Direction::MemoryToFile, {std::move(whole)}, t);
  ticket.wait();
  try {
    ticket.rethrow_if_failed();
  } catch (const std::system_error& e) {
    // Named by the final path, not the temporary one the user never sees (its code kept).
    std::string what = e.what();
    const std::string suffix = ": " + e.code().message();
    if (what.size() > suffix.size() && what.ends_with(suffix))
      what.resize(what.size() - suffix.size());
    fail_errno(e.code().value(), file.path().string(), " (writing ", what, ")");
  }
  const TransferStats& ts = ticket.stats();
  stats.staging_bytes = ts.staging_bytes;
  stats.pinned = ts.staging_pinned;
  if (!ts.files.empty()) {
    stats.direct = ts.files.front().io_path == IoPath::Direct;
    stats.io_reason = ts.files.front().reason;
  }
  stats.fill_seconds = ts.queue_thread_seconds;
  stats.wait_seconds = ts.wait_thread_seconds;
  stats.write_seconds = ts.read_thread_seconds;
  return stats;
}

}  // namespace ferry::detail
