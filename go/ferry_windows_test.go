//go:build windows

package ferry

import (
	"testing"
	"unsafe"
)

// The mirror of ferry_load_options must match the header ferry.dll was built from: a field added
// to the C struct and not here is a field Go cannot set (and init once wrote past it).
func TestLoadOptionsMirrorMatchesTheLibrary(t *testing.T) {
	var scratch [initScratchWords]uint64
	invoke("ferry_load_options_init", uintptr(unsafe.Pointer(&scratch[0])))
	written := (*loadOptions)(unsafe.Pointer(&scratch[0])).structSize
	if mirror := unsafe.Sizeof(loadOptions{}); uintptr(written) != mirror {
		t.Fatalf("ferry.dll's ferry_load_options is %d bytes, go/ferry_windows.go mirrors %d",
			written, mirror)
	}
	options := defaultLoadOptions()
	device := goString(uintptr(unsafe.Pointer(options.device)))
	if options.structSize != uint32(unsafe.Sizeof(options)) || options.ioMode != 0 || device != "cpu" {
		t.Fatalf("defaults: struct_size %d, io_mode %d, device %q", options.structSize,
			options.ioMode, device)
	}
}
