// Per-key reads: one tensor's bytes (or a byte range of them) read straight into host memory the
// caller owns, for safe_open's get_tensor and get_slice. No plan, no staging, no threads: the
// cost of a call is one positioned read, so that taking keys one by one runs at the speed of
// the medium. Every file of the checkpoint is opened once, when the reader is made, and held
// until it is destroyed: a path replaced or deleted afterwards does not change what it reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ferry/checkpoint.hpp"

namespace ferry {

class TensorReader {
 public:
  // Opens every file of `checkpoint`; throws std::system_error naming a file that cannot be
  // opened and FormatError where one no longer has the size its header was read at.
  explicit TensorReader(std::shared_ptr<const Checkpoint> checkpoint);
  TensorReader(TensorReader&&) noexcept;
  TensorReader& operator=(TensorReader&&) noexcept;
  ~TensorReader();

  const Checkpoint& checkpoint() const noexcept { return *_checkpoint; }

  // Reads bytes [begin, begin + length) of the tensor's data into `host`. Throws
  // std::out_of_range where the range leaves the tensor and FormatError naming the file where
  // the file ends early (it was truncated after opening).
  void read(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length, void* host) const;

 private:
  struct Files;
  std::shared_ptr<const Checkpoint> _checkpoint;
  std::unique_ptr<Files> _files;
};

}  // namespace ferry
