//go:build !windows

package ferry

// The header comes from the repository's include/; libferry from CGO_LDFLAGS's -L or the
// repository's build/ at link time, and from the loader's path (LD_LIBRARY_PATH) at run time.

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#cgo LDFLAGS: -L${SRCDIR}/../build -lferry
#include <stdlib.h>
#include "ferry/ferry.h"
*/
import "C"

import "unsafe"

type checkpointRef = *C.ferry_checkpoint
type loadedRef = *C.ferry_loaded
type preparationRef = *C.ferry_load_preparation

// The zero handles: no checkpoint, no loaded result.
var (
	nilCheckpoint  checkpointRef
	nilLoaded      loadedRef
	nilPreparation preparationRef
)

// available: the loader resolved libferry before main.
func available() error {
	return nil
}

func version() string {
	return C.GoString(C.ferry_version())
}

func lastError() string {
	return C.GoString(C.ferry_last_error())
}

func openCheckpoint(path string) (checkpointRef, Status) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var out *C.ferry_checkpoint
	s := C.ferry_checkpoint_open(cpath, &out)
	return out, Status(s)
}

func freeCheckpoint(ref checkpointRef) {
	C.ferry_checkpoint_free(ref)
}

func tensorCount(ref checkpointRef) int {
	return int(C.ferry_checkpoint_tensor_count(ref))
}

func tensorInfo(ref checkpointRef, index int) (TensorInfo, Status) {
	var info C.ferry_tensor_info
	if s := Status(C.ferry_checkpoint_tensor_info(ref, C.size_t(index), &info)); s != statusOK {
		return TensorInfo{}, s
	}
	shape := make([]uint64, int(info.rank))
	if info.rank > 0 {
		dims := unsafe.Slice((*uint64)(unsafe.Pointer(info.shape)), int(info.rank))
		copy(shape, dims)
	}
	return TensorInfo{
		Name:  C.GoString(info.name),
		DType: C.GoString(info.dtype),
		Shape: shape,
		Bytes: uint64(info.bytes),
	}, statusOK
}

// deviceOptions returns ferry's default load options onto device, and the function that frees
// the device's C string once the call that reads them returned.
func deviceOptions(device string) (C.ferry_load_options, func()) {
	cdevice := C.CString(device)
	var options C.ferry_load_options
	C.ferry_load_options_init(&options)
	options.device = cdevice
	return options, func() { C.free(unsafe.Pointer(cdevice)) }
}

func loadCheckpoint(ref checkpointRef, device string) (loadedRef, Status) {
	options, free := deviceOptions(device)
	defer free()
	var out *C.ferry_loaded
	s := C.ferry_checkpoint_load(ref, &options, &out)
	return out, Status(s)
}

func freeLoaded(ref loadedRef) {
	C.ferry_loaded_free(ref)
}

func tensorDigest(ref loadedRef, name string) (uint64, Status) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var digest C.uint64_t
	s := C.ferry_loaded_tensor_digest(ref, cname, &digest)
	return uint64(digest), Status(s)
}

func prepareLoad(device string) (preparationRef, Status) {
	options, free := deviceOptions(device)
	defer free()
	var out *C.ferry_load_preparation
	s := C.ferry_load_prepare(&options, &out)
	return out, Status(s)
}

func waitPreparation(ref preparationRef) (uint64, Status) {
	var staging C.uint64_t
	s := C.ferry_load_preparation_wait(ref, &staging)
	return uint64(staging), Status(s)
}

func freePreparation(ref preparationRef) {
	C.ferry_load_preparation_free(ref)
}
