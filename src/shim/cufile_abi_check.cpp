// Compiled only where cufile.h exists: ferry's cuFile declarations must equal the header's.
#include <cufile.h>

#include <cstddef>
#include <type_traits>

#include "shim/cufile.hpp"

namespace ferry::shim {
namespace {

namespace cf = cufile;

static_assert(sizeof(CUfileError_t) == sizeof(cf::Error));
static_assert(offsetof(CUfileError_t, cu_err) == offsetof(cf::Error, cu_err));
static_assert(sizeof(CUfileDescr_t) == sizeof(cf::Descriptor));
static_assert(offsetof(CUfileDescr_t, handle) == offsetof(cf::Descriptor, handle));
static_assert(offsetof(CUfileDescr_t, fs_ops) == offsetof(cf::Descriptor, fs_ops));
static_assert(sizeof(CUfileDrvProps_t) == sizeof(cf::DriverProperties));
static_assert(offsetof(CUfileDrvProps_t, nvfs.dstatusflags) ==
              offsetof(cf::DriverProperties, nvfs.dstatusflags));
static_assert(offsetof(CUfileDrvProps_t, max_device_pinned_mem_size) ==
              offsetof(cf::DriverProperties, max_device_pinned_mem_size));
static_assert(std::is_same_v<CUfileHandle_t, cf::Handle>);
static_assert(CU_FILE_SUCCESS == cf::kSuccess);
static_assert(CU_FILE_DRIVER_NOT_INITIALIZED == cf::kDriverNotInitialized);
static_assert(CU_FILE_HANDLE_TYPE_OPAQUE_FD == cf::kHandleTypeOpaqueFd);
static_assert(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE == cf::kParamAllowCompatMode);
static_assert(CUFILE_PARAM_FORCE_COMPAT_MODE == cf::kParamForceCompatMode);
static_assert(CU_FILE_NVME_SUPPORTED == cf::kNvmeSupportedBit);

// Function signatures, with cuFile's types replaced by ferry's.
template <class T> struct Ours { using type = T; };
template <class T> struct Ours<T*> { using type = typename Ours<T>::type*; };
template <class T> struct Ours<const T> { using type = const typename Ours<T>::type; };
template <class R, class... A> struct Ours<R (*)(A...)> {
  using type = typename Ours<R>::type (*)(typename Ours<A>::type...);
};
template <> struct Ours<CUfileError_t> { using type = cf::Error; };
template <> struct Ours<CUfileDescr_t> { using type = cf::Descriptor; };
template <> struct Ours<CUfileDrvProps_t> { using type = cf::DriverProperties; };
template <> struct Ours<CUFileBoolConfigParameter_t> { using type = int; };

#define FERRY_CHECK_CUFILE(fn) \
  static_assert(std::is_same_v<Ours<decltype(&::fn)>::type, decltype(CuFileLibrary::fn)>, \
                #fn " in shim/cufile.hpp disagrees with cufile.h")

FERRY_CHECK_CUFILE(cuFileDriverOpen);
FERRY_CHECK_CUFILE(cuFileDriverGetProperties);
FERRY_CHECK_CUFILE(cuFileGetParameterBool);
FERRY_CHECK_CUFILE(cuFileHandleRegister);
FERRY_CHECK_CUFILE(cuFileHandleDeregister);
FERRY_CHECK_CUFILE(cuFileBufRegister);
FERRY_CHECK_CUFILE(cuFileBufDeregister);
FERRY_CHECK_CUFILE(cuFileRead);
FERRY_CHECK_CUFILE(cuFileWrite);
FERRY_CHECK_CUFILE(cuFileGetVersion);

}  // namespace
}  // namespace ferry::shim
