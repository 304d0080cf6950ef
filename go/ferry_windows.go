//go:build windows

package ferry

// ferry.dll is loaded at the first call, from the directories Windows searches (the program's
// own first); every entry point takes plain C types in the x64 calling convention, so
// syscall's Call reaches it without cgo. Strings go in as NUL-terminated UTF-8 bytes.

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"
)

type checkpointRef = uintptr
type loadedRef = uintptr
type preparationRef = uintptr

// The zero handles: no checkpoint, no loaded result.
const (
	nilCheckpoint  checkpointRef  = 0
	nilLoaded      loadedRef      = 0
	nilPreparation preparationRef = 0
)

var (
	dllOnce sync.Once
	dll     *syscall.DLL
	dllErr  error
)

// proc finds an exported function of ferry.dll.
func proc(name string) (*syscall.Proc, error) {
	dllOnce.Do(func() { dll, dllErr = syscall.LoadDLL("ferry.dll") })
	if dllErr != nil {
		return nil, fmt.Errorf("ferry: loading ferry.dll: %w", dllErr)
	}
	return dll.FindProc(name)
}

// invoke calls an entry point; a missing DLL or function panics, as a missing shared library
// stops a cgo program before main.
func invoke(name string, args ...uintptr) uintptr {
	p, err := proc(name)
	if err != nil {
		panic(err)
	}
	r, _, _ := p.Call(args...)
	return r
}

// cString copies text into a NUL-terminated byte array (callers refuse embedded NULs first).
func cString(text string) *byte {
	b := make([]byte, len(text)+1)
	copy(b, text)
	return &b[0]
}

// goString copies the NUL-terminated bytes at p, which ferry owns.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Pointer(p + uintptr(n))) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(p)), n))
}

// available reports whether ferry.dll and its entry points can be found.
func available() error {
	_, err := proc("ferry_checkpoint_open")
	return err
}

func version() string {
	return goString(invoke("ferry_version"))
}

func lastError() string {
	return goString(invoke("ferry_last_error"))
}

func openCheckpoint(path string) (checkpointRef, Status) {
	var out uintptr
	s := invoke("ferry_checkpoint_open", uintptr(unsafe.Pointer(cString(path))),
		uintptr(unsafe.Pointer(&out)))
	return out, Status(int32(s))
}

func freeCheckpoint(ref checkpointRef) {
	invoke("ferry_checkpoint_free", ref)
}

func tensorCount(ref checkpointRef) int {
	return int(invoke("ferry_checkpoint_tensor_count", ref))
}

// tensorInfo mirrors ferry_tensor_info on x64 (every field 8 bytes wide); the pointers are
// ferry's, valid while the checkpoint lives.
type tensorInfoC struct {
	name, dtype, shape, rank uintptr
	bytes                    uint64
	file                     uintptr
	fileOffset               uint64
	ggmlType, ggmlDims       uintptr
	ggmlRank                 uintptr
}

func tensorInfo(ref checkpointRef, index int) (TensorInfo, Status) {
	var info tensorInfoC
	s := Status(int32(invoke("ferry_checkpoint_tensor_info", ref, uintptr(index),
		uintptr(unsafe.Pointer(&info)))))
	if s != statusOK {
		return TensorInfo{}, s
	}
	shape := make([]uint64, int(info.rank))
	if info.rank > 0 {
		copy(shape, unsafe.Slice((*uint64)(unsafe.Pointer(info.shape)), int(info.rank)))
	}
	return TensorInfo{Name: goString(info.name), DType: goString(info.dtype), Shape: shape,
		Bytes: info.bytes}, statusOK
}

// loadOptions mirrors ferry_load_options on x64; Go lays out and pads the fields as C does.
type loadOptions struct {
	structSize        uint32
	device            *byte
	names             uintptr
	nameCount         uintptr
	ioMode            int32
	stagingBytes      uint64
	chunkBytes        uint64
	readerThreads     uint32
	backend           *byte
	allowCompat       int32
	slotsPerThread    uint32
	pageCachePinBytes uint64
	cacheDeviceMemory int32
}

// initScratchWords bounds the struct a newer ferry.dll's init may write: it fills the struct as
// its own header lays it out, which may be longer than loadOptions.
const initScratchWords = 64

// defaultLoadOptions takes ferry's defaults through ferry_load_options_init, written into
// scratch space (a DLL newer than this package writes a longer struct), and keeps the fields
// this package knows; struct_size then tells ferry to read no further.
func defaultLoadOptions() loadOptions {
	var scratch [initScratchWords]uint64
	invoke("ferry_load_options_init", uintptr(unsafe.Pointer(&scratch[0])))
	options := *(*loadOptions)(unsafe.Pointer(&scratch[0]))
	if int(options.structSize) > len(scratch)*8 {
		panic(fmt.Sprintf("ferry: ferry.dll wrote a %d-byte ferry_load_options into %d bytes",
			options.structSize, len(scratch)*8))
	}
	options.structSize = uint32(unsafe.Sizeof(options))
	return options
}

func loadCheckpoint(ref checkpointRef, device string) (loadedRef, Status) {
	options := defaultLoadOptions()
	options.device = cString(device)
	var out uintptr
	s := invoke("ferry_checkpoint_load", ref, uintptr(unsafe.Pointer(&options)),
		uintptr(unsafe.Pointer(&out)))
	return out, Status(int32(s))
}

func freeLoaded(ref loadedRef) {
	invoke("ferry_loaded_free", ref)
}

func tensorDigest(ref loadedRef, name string) (uint64, Status) {
	var digest uint64
	s := invoke("ferry_loaded_tensor_digest", ref, uintptr(unsafe.Pointer(cString(name))),
		uintptr(unsafe.Pointer(&digest)))
	return digest, Status(int32(s))
}

func prepareLoad(device string) (preparationRef, Status) {
	options := defaultLoadOptions()
	options.device = cString(device)
	var out uintptr
	s := invoke("ferry_load_prepare", uintptr(unsafe.Pointer(&options)),
		uintptr(unsafe.Pointer(&out)))
	return out, Status(int32(s))
}

func waitPreparation(ref preparationRef) (uint64, Status) {
	var staging uint64
	s := invoke("ferry_load_preparation_wait", ref, uintptr(unsafe.Pointer(&staging)))
	return staging, Status(int32(s))
}

func freePreparation(ref preparationRef) {
	invoke("ferry_load_preparation_free", ref)
}
