// ferry's one error mechanism: C++ code throws std:: exception types through the FERRY_*
// macros below, which build the message only on failure. Bindings map the types naturally:
// FormatError -> ValueError, std::system_error(ENOENT) -> FileNotFoundError.
#pragma once

#include <cerrno>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace ferry {

// A file that is not what its format says it is (bad header, offsets, dtype...).
class FormatError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A KV store's own file (manifest, journal, checkpoint) that is not what its format says; the
// message names the file. Python: ferry.KVFormatError (not a SafetensorError).
class KVFormatError : public FormatError {
 public:
  using FormatError::FormatError;
};

// The CUDA driver or a GPU refused an operation, or none is usable for what was asked.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Work stopped because its caller asked (a cancelled transfer, an interrupted load).
class Cancelled : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Memory ran out for what a file asked for: unlike std::bad_alloc, it names the file.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message)
      : _message(std::make_shared<const std::string>(std::move(message))) {}
  const char* what() const noexcept override { return _message->c_str(); }

 private:
  std::shared_ptr<const std::string> _message;  // shared: copying an exception must not throw
};

namespace detail {

// The errno for "the file changed underneath ferry" (replaced or removed since it was opened):
// ESTALE, which Windows' C runtime lacks (EIO there; the message says what happened).
#ifdef ESTALE
inline constexpr int kFileChangedErrno = ESTALE;
#else
inline constexpr int kFileChangedErrno = EIO;
#endif

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <class Exception, class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Exception(concat(std::forward<Parts>(parts)...));
}

template <class... Parts>
[[noreturn]] void fail_errno(int error, Parts&&... parts) {
  throw std::system_error(error, std::generic_category(), concat(std::forward<Parts>(parts)...));
}

}  // namespace detail
}  // namespace ferry

// Throws Exception with the concatenated parts when cond is false.
#define FERRY_EXPECT(cond, Exception, ...)                  \
  do {                                                      \
    if (!(cond)) [[unlikely]]                               \
      ::ferry::detail::fail<Exception>(__VA_ARGS__);        \
  } while (0)

// Throws FormatError naming the offending file; for parsers of untrusted input.
#define FERRY_FORMAT_EXPECT(cond, ...) FERRY_EXPECT(cond, ::ferry::FormatError, __VA_ARGS__)

// Throws std::system_error from errno for a failed system call. errno is read before the
// message is built: building it may allocate, and allocation may change errno.
#define FERRY_SYSCALL_FAIL(...)                           \
  do {                                                    \
    const int ferry_saved_errno_ = errno;                 \
    ::ferry::detail::fail_errno(ferry_saved_errno_, __VA_ARGS__); \
  } while (0)

// An internal invariant; a failure is a bug in ferry, so the message carries file:line.
#define FERRY_ASSERT(cond) \
  FERRY_EXPECT(cond, std::logic_error, "internal error: ", #cond, " at ", __FILE__, ":", __LINE__)
