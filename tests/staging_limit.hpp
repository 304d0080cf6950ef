// A test's guard on the process's staging bound (tests that change global settings restore
// them): lowered for one test, idle staging freed and the high-water mark started again, so the
// test measures its own peak; the old bound comes back when the guard goes.
#pragma once

#include <cstdint>

#include "ferry/transfer.hpp"
#include "services/pinned_pool.hpp"

namespace ferry::test {

class StagingLimit {
 public:
  explicit StagingLimit(std::uint64_t bytes) : _old(staging_limit()) {
    set_staging_limit(bytes);
    detail::staging_pool().release_idle();
    detail::staging_pool().reset_high_water();
  }
  ~StagingLimit() { set_staging_limit(_old); }
  StagingLimit(const StagingLimit&) = delete;
  StagingLimit& operator=(const StagingLimit&) = delete;

 private:
  std::uint64_t _old;
};

}  // namespace ferry::test
