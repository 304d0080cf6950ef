// Compiled only where the real nccl.h exists: proves at compile time that every entry point
// declared in nccl.hpp has exactly nccl.h's signature once ferry's type names are mapped to
// NCCL's. A mismatch is a build error, never a corrupted call at run time.
#include <cuda.h>
#include <nccl.h>

#include <type_traits>

#include "shim/nccl.hpp"

namespace ferry::shim {
namespace {

template <class T>
struct Ours {
  using type = T;
};
template <class T>
struct Ours<T*> {
  using type = typename Ours<T>::type*;
};
template <class T>
struct Ours<const T> {
  using type = const typename Ours<T>::type;
};
template <class R, class... A>
struct Ours<R (*)(A...)> {
  using type = typename Ours<R>::type (*)(typename Ours<A>::type...);
};
template <>
struct Ours<ncclResult_t> {
  using type = nccl::Result;
};
template <>
struct Ours<ncclComm_t> {
  using type = nccl::Comm;
};
template <>
struct Ours<ncclDataType_t> {
  using type = int;
};
template <>
struct Ours<cudaStream_t> {
  using type = cu::Stream;
};
static_assert(sizeof(ncclResult_t) == sizeof(nccl::Result));
static_assert(sizeof(ncclDataType_t) == sizeof(int));
static_assert(ncclSuccess == nccl::kSuccess);
static_assert(ncclInProgress == nccl::kInProgress);
static_assert(ncclUint8 == nccl::kUint8);

template <class Real, class Declared>
constexpr bool same_abi = std::is_same_v<typename Ours<Real>::type, Declared>;

#define FERRY_CHECK_ABI(name)                                             \
  static_assert(same_abi<decltype(&::name), decltype(NcclLibrary::name)>, \
                #name " in nccl.hpp disagrees with nccl.h")

FERRY_CHECK_ABI(ncclGetVersion);
FERRY_CHECK_ABI(ncclGetErrorString);
FERRY_CHECK_ABI(ncclCommInitAll);
FERRY_CHECK_ABI(ncclCommDestroy);
FERRY_CHECK_ABI(ncclCommAbort);
FERRY_CHECK_ABI(ncclCommGetAsyncError);
FERRY_CHECK_ABI(ncclAllGather);
FERRY_CHECK_ABI(ncclGroupStart);
FERRY_CHECK_ABI(ncclGroupEnd);

}  // namespace
}  // namespace ferry::shim
