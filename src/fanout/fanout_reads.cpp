#include "fanout/fanout_reads.hpp"

namespace ferry::detail {

std::vector<Extent> resolve(const std::vector<FanoutRead>& reads,
                            const std::vector<std::uintptr_t>& bases,
                            const std::vector<std::uintptr_t>& scratch,
                            const std::vector<Device>& devices) {
  std::vector<Extent> out;
  out.reserve(reads.size());
  for (const FanoutRead& read : reads) {
    Extent x{read.file_index, read.file_offset, {}};
    std::uint64_t at = 0;
    for (const FanoutCopy& c : read.copies) {
      if (c.chunk_offset > at) x.spans.push_back({Device::cpu(), nullptr, c.chunk_offset - at});
      const std::uintptr_t dst = (c.to_scratch ? scratch : bases)[c.rank] + c.dest_offset;
      MemorySpan* last = x.spans.empty() ? nullptr : &x.spans.back();
      if (last && last->data && c.chunk_offset == at && last->device == devices[c.rank] &&
          reinterpret_cast<std::uintptr_t>(last->data) + last->size == dst) {
        last->size += c.size;
      } else {
        x.spans.push_back({devices[c.rank], reinterpret_cast<void*>(dst), c.size});
      }
      at = c.chunk_offset + c.size;
    }
    if (read.size > at) x.spans.push_back({Device::cpu(), nullptr, read.size - at});
    out.push_back(std::move(x));
  }
  return out;
}

TransferOptions transfer_options(const LoadOptions& load, const EngineSettings& settings) {
  TransferOptions t;
  t.backend = Backend::Posix;
  t.io = load.io;
  t.threads = settings.threads;
  t.chunk_bytes = settings.chunk_bytes;
  t.slots_per_thread = settings.slots_per_thread;
  t.staging_bytes = load.staging_bytes;
  t.stop_at_first_error = true;
  return t;
}

}  // namespace ferry::detail
