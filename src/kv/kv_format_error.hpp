// In the KV store's readers of its own files, a malformed file is a KVFormatError (still a
// FormatError: the C ABI's FERRY_STATUS_FORMAT_ERROR), so that a broken KV store is not reported
// as a broken checkpoint (Python's SafetensorError). Include it last, after ferry/error.hpp.
#pragma once

#include "ferry/error.hpp"

#undef FERRY_FORMAT_EXPECT
#define FERRY_FORMAT_EXPECT(cond, ...) FERRY_EXPECT(cond, ::ferry::KVFormatError, __VA_ARGS__)
