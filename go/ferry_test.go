package ferry

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cliDigests runs `ferry load PATH --device cpu --hash` (FERRY_BIN) and returns its digests by
// tensor name: lines "name<TAB>type<TAB>[dims]<TAB>digest".
func cliDigests(t *testing.T, path string) map[string]string {
	t.Helper()
	bin := os.Getenv("FERRY_BIN")
	if bin == "" {
		t.Skip("FERRY_BIN (the ferry CLI) is not set")
	}
	out, err := exec.Command(bin, "load", path, "--device", "cpu", "--hash").Output()
	if err != nil {
		t.Fatalf("%s load %s --hash: %v", bin, path, err)
	}
	digests := map[string]string{}
	for _, line := range strings.Split(strings.ReplaceAll(string(out), "\r", ""), "\n") {
		if line == "" {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 4 {
			t.Fatalf("unexpected --hash line %q", line)
		}
		digests[fields[0]] = fields[3]
	}
	return digests
}

// openTiny writes the test tensors as a GGUF file in a temporary folder and opens it; the
// checkpoint is closed when the test ends.
func openTiny(t *testing.T) (string, *Checkpoint) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	writeGGUF(t, path, testTensors())
	checkpoint, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkpoint.Close() })
	return path, checkpoint
}

func TestVersion(t *testing.T) {
	v, err := Version()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(v, ".") != 2 {
		t.Fatalf("version %q is not MAJOR.MINOR.PATCH", v)
	}
}

func TestGGUFTensorsAndDigestsMatchCLI(t *testing.T) {
	written := testTensors()
	path, checkpoint := openTiny(t)
	tensors := checkpoint.Tensors()
	if len(tensors) != len(written) {
		t.Fatalf("%d tensors listed, %d written", len(tensors), len(written))
	}
	for i, info := range tensors {
		w := written[i]
		if info.Name != w.name || info.Bytes != uint64(len(w.data)) || len(info.Shape) != len(w.dims) {
			t.Fatalf("tensor %d: %+v, wrote %s with %d bytes, dims %v", i, info, w.name, len(w.data), w.dims)
		}
		for d := range w.dims { // GGUF states ne[0] first; ferry's shape is outermost first
			if info.Shape[d] != w.dims[len(w.dims)-1-d] {
				t.Fatalf("%s: shape %v, GGUF dims %v", info.Name, info.Shape, w.dims)
			}
		}
	}
	if got := tensors[0].DType; got != "F32" {
		t.Fatalf("%s: dtype %s, want F32", tensors[0].Name, got)
	}

	loaded, err := checkpoint.Load("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	want := cliDigests(t, path)
	if len(want) != len(tensors) {
		t.Fatalf("the CLI hashed %d tensors, the checkpoint has %d", len(want), len(tensors))
	}
	seen := map[uint64]bool{}
	for _, info := range tensors {
		digest, err := loaded.Digest(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%016x", digest); got != want[info.Name] {
			t.Errorf("%s: digest %s through Go, %s from ferry load --hash", info.Name, got, want[info.Name])
		}
		seen[digest] = true
	}
	if len(seen) != len(tensors) {
		t.Fatalf("distinct tensors share a digest: %v", seen)
	}
}

func TestOpenMissingFileNamesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-model.gguf")
	_, err := Open(path)
	if err == nil {
		t.Fatal("opening a missing file succeeded")
	}
	var ferryErr *Error
	if !errors.As(err, &ferryErr) || ferryErr.Status != StatusNotFound {
		t.Fatalf("want a NOT_FOUND *ferry.Error, got %#v", err)
	}
	if !strings.Contains(err.Error(), "no-such-model.gguf") {
		t.Fatalf("the error does not name the file: %v", err)
	}
}

func TestDigestOfUnknownTensorFails(t *testing.T) {
	_, checkpoint := openTiny(t)
	loaded, err := checkpoint.Load("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	_, err = loaded.Digest("not.a.tensor")
	var ferryErr *Error
	if !errors.As(err, &ferryErr) || ferryErr.Status != StatusInvalidArgument ||
		!strings.Contains(err.Error(), "not.a.tensor") {
		t.Fatalf("want INVALID_ARGUMENT naming the tensor, got %v", err)
	}
}

// A GPU load must give the host load's digests; skipped where there is no usable GPU.
func TestCUDADigestsEqualHost(t *testing.T) {
	_, checkpoint := openTiny(t)
	gpu, err := checkpoint.Load("cuda:0")
	var ferryErr *Error
	if errors.As(err, &ferryErr) && ferryErr.Status == StatusCUDAError {
		t.Skipf("no usable GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.Close()
	host, err := checkpoint.Load("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	for _, info := range checkpoint.Tensors() {
		g, err := gpu.Digest(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		h, err := host.Digest(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		if g != h {
			t.Errorf("%s: cuda:0 digest %016x, cpu %016x", info.Name, g, h)
		}
	}
}

func TestPreparedLoadMatchesCLI(t *testing.T) {
	path, checkpoint := openTiny(t)
	preparation, err := Prepare("cpu")
	if err != nil {
		t.Fatal(err)
	}
	staging, err := preparation.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if staging == 0 {
		t.Fatal("the preparation made no staging")
	}
	preparation.Close()
	preparation.Close() // twice: nothing
	if _, err := preparation.Wait(); err == nil {
		t.Fatal("a released preparation waited")
	}
	loaded, err := checkpoint.Load("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	for name, want := range cliDigests(t, path) {
		got, err := loaded.Digest(name)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprintf("%016x", got) != want {
			t.Errorf("%s: digest %016x, the CLI's %s", name, got, want)
		}
	}
}

func TestPrepareRefusesABadDevice(t *testing.T) {
	if _, err := Prepare("tpu:0"); err == nil {
		t.Fatal("tpu:0 was taken")
	}
	if _, err := Prepare("cu\x00da"); err == nil {
		t.Fatal("a device with a NUL byte was taken")
	}
}
