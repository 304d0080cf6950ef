package ferry

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"testing"
)

// ggufTensor is one tensor of a test GGUF file: dims as GGUF states them (ne[0] first).
type ggufTensor struct {
	name     string
	ggmlType uint32 // 0 F32, 1 F16, 24 I8
	dims     []uint64
	data     []byte
}

// writeGGUF writes a GGUF v3 file with one metadata key and the tensors, data aligned to 32.
func writeGGUF(t *testing.T, path string, tensors []ggufTensor) {
	t.Helper()
	var b bytes.Buffer
	le := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	le(uint32(3))
	le(uint64(len(tensors)))
	le(uint64(1))
	str("general.architecture")
	le(uint32(8)) // STRING
	str("llama")
	var offset uint64
	for _, tensor := range tensors {
		str(tensor.name)
		le(uint32(len(tensor.dims)))
		for _, d := range tensor.dims {
			le(d)
		}
		le(tensor.ggmlType)
		le(offset)
		offset += (uint64(len(tensor.data)) + 31) / 32 * 32
	}
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	for _, tensor := range tensors {
		b.Write(tensor.data)
		for b.Len()%32 != 0 {
			b.WriteByte(0)
		}
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testTensors returns a few tensors whose bytes differ from each other.
func testTensors() []ggufTensor {
	f32 := make([]byte, 0, 4*5*3)
	for i := 0; i < 5*3; i++ {
		f32 = binary.LittleEndian.AppendUint32(f32, math.Float32bits(float32(i)*0.5-3))
	}
	f16 := make([]byte, 2*40)
	for i := range f16 {
		f16[i] = byte(i*7 + 1)
	}
	i8 := []byte{13, 10, 26, 10, 13, 13, 10, 26, 0, 255, 128}
	return []ggufTensor{
		{"blk.0.attn_q.weight", 0, []uint64{5, 3}, f32},
		{"token_embd.weight", 1, []uint64{8, 5}, f16},
		{"output_norm.weight", 24, []uint64{uint64(len(i8))}, i8},
	}
}
