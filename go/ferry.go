// Package ferry loads safetensors and GGUF checkpoints into host or GPU memory through ferry's C
// ABI (include/ferry/ferry.h). On Linux and macOS it calls libferry through cgo; on Windows it
// loads ferry.dll with syscall.LoadDLL, so a Windows host needs no C compiler (as Ollama builds).
//
// Paths and tensor names are UTF-8 on every system.
package ferry

import (
	"fmt"
	"runtime"
	"strings"
)

// TensorInfo describes one tensor of a checkpoint.
type TensorInfo struct {
	Name  string
	DType string   // safetensors spelling ("F32", "BF16"; "U8" rows for quantized GGUF tensors)
	Shape []uint64 // outermost dimension first
	Bytes uint64
}

// Checkpoint is an open checkpoint: a .safetensors file, a shard directory, an index .json or a
// .gguf file. Close releases it; tensors already loaded keep what they need.
type Checkpoint struct {
	ref     checkpointRef
	tensors []TensorInfo
}

// Loaded holds the tensors of one load on one device until Close.
type Loaded struct {
	ref loadedRef
}

// Version returns the library's version, "MAJOR.MINOR.PATCH".
func Version() (string, error) {
	if err := available(); err != nil {
		return "", err
	}
	return version(), nil
}

// Open opens and validates the checkpoint at path and reads its tensor list.
func Open(path string) (*Checkpoint, error) {
	if err := available(); err != nil {
		return nil, err
	}
	if err := noNUL("path", path); err != nil {
		return nil, err
	}
	var ref checkpointRef
	if err := call("open", func() Status {
		var s Status
		ref, s = openCheckpoint(path)
		return s
	}); err != nil {
		return nil, err
	}
	c := &Checkpoint{ref: ref}
	n := tensorCount(ref)
	c.tensors = make([]TensorInfo, 0, n)
	for i := 0; i < n; i++ {
		var info TensorInfo
		if err := call("tensor info", func() Status {
			var s Status
			info, s = tensorInfo(ref, i)
			return s
		}); err != nil {
			c.Close()
			return nil, err
		}
		c.tensors = append(c.tensors, info)
	}
	return c, nil
}

// Tensors returns the checkpoint's tensors in read order.
func (c *Checkpoint) Tensors() []TensorInfo {
	return c.tensors
}

// Load loads every tensor into one new allocation on device: "cpu", "cuda" or "cuda:N".
func (c *Checkpoint) Load(device string) (*Loaded, error) {
	if c.ref == nilCheckpoint {
		return nil, fmt.Errorf("ferry: load: the checkpoint is closed")
	}
	if err := noNUL("device", device); err != nil {
		return nil, err
	}
	var ref loadedRef
	if err := call("load to "+device, func() Status {
		var s Status
		ref, s = loadCheckpoint(c.ref, device)
		return s
	}); err != nil {
		return nil, err
	}
	return &Loaded{ref: ref}, nil
}

// Close releases the checkpoint. Closing twice does nothing.
func (c *Checkpoint) Close() error {
	if c.ref != nilCheckpoint {
		freeCheckpoint(c.ref)
		c.ref = nilCheckpoint
	}
	return nil
}

// Digest returns the XXH3-64 of the named tensor's bytes as they are in device memory: the
// digest `ferry load --hash` prints (as 16 hex digits).
func (l *Loaded) Digest(name string) (uint64, error) {
	if l.ref == nilLoaded {
		return 0, fmt.Errorf("ferry: digest of %q: the loaded tensors are released", name)
	}
	if err := noNUL("tensor name", name); err != nil {
		return 0, err
	}
	var digest uint64
	err := call("digest of "+name, func() Status {
		var s Status
		digest, s = tensorDigest(l.ref, name)
		return s
	})
	return digest, err
}

// Close releases the loaded memory. Closing twice does nothing.
func (l *Loaded) Close() error {
	if l.ref != nilLoaded {
		freeLoaded(l.ref)
		l.ref = nilLoaded
	}
	return nil
}

// Preparation is a first load's set-up being made on a thread of ferry's own; see Prepare.
type Preparation struct {
	ref preparationRef
}

// Prepare starts making what the process's first load onto device ("cpu", "cuda" or "cuda:N")
// would set up while it reads: each reader's staging (pinned for a GPU), the reader threads and
// the copy streams. A server that calls it while it builds its model then loads at the speed of
// a later load; the load need not wait for it. Close releases it.
func Prepare(device string) (*Preparation, error) {
	if err := available(); err != nil {
		return nil, err
	}
	if err := noNUL("device", device); err != nil {
		return nil, err
	}
	var ref preparationRef
	if err := call("prepare a load to "+device, func() Status {
		var s Status
		ref, s = prepareLoad(device)
		return s
	}); err != nil {
		return nil, err
	}
	return &Preparation{ref: ref}, nil
}

// Wait waits for the preparation and returns the bytes of staging it made, or what it failed
// with (StatusCUDAError where the GPU cannot be used).
func (p *Preparation) Wait() (uint64, error) {
	if p.ref == nilPreparation {
		return 0, fmt.Errorf("ferry: wait: the preparation is released")
	}
	var staging uint64
	err := call("prepare a load", func() Status {
		var s Status
		staging, s = waitPreparation(p.ref)
		return s
	})
	return staging, err
}

// Close waits for the preparation's thread and releases it; what it made stays with the process.
// Closing twice does nothing.
func (p *Preparation) Close() error {
	if p.ref != nilPreparation {
		freePreparation(p.ref)
		p.ref = nilPreparation
	}
	return nil
}

// call runs one C ABI call and, on failure, reads ferry's message in the same OS thread: ferry
// keeps the last error per thread, and a goroutine may otherwise move between the two calls.
func call(op string, f func() Status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := f()
	if s == statusOK {
		return nil
	}
	return &Error{Op: op, Status: s, Message: lastError()}
}

// noNUL refuses strings that C would cut short at an embedded NUL.
func noNUL(what, text string) error {
	if strings.IndexByte(text, 0) >= 0 {
		return &Error{Op: what, Status: StatusInvalidArgument,
			Message: fmt.Sprintf("the %s %q holds a NUL byte", what, text)}
	}
	return nil
}
