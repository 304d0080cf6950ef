"""ferry against the gguf package (llama.cpp's own Python reader and writer): files written by
GGUFWriter must show in `ferry inspect --json` the metadata, types, dims, sizes and offsets that
GGUFReader reads, and `ferry load --hash` must give each tensor the bytes (XXH3-64) that
GGUFReader maps; malformed files must fail cleanly through the CLI."""

import json
import struct

import gguf
import numpy as np
import pytest
import xxhash

from conftest import o_direct_supported, parse_hash_lines
from test_cli_errors import COMMANDS, command, expect_clean_error

Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType

PLAIN = {  # numpy dtype -> ggml type the writer picks for it
    np.float32: Q.F32,
    np.float16: Q.F16,
    np.float64: Q.F64,
    np.int8: Q.I8,
    np.int16: Q.I16,
    np.int32: Q.I32,
    np.int64: Q.I64,
}
QUANTIZED = [t for t, (block, _) in gguf.GGML_QUANT_SIZES.items() if block > 1]
FERRY_DTYPE = {Q.F32: "F32", Q.F16: "F16", Q.F64: "F64", Q.I8: "I8", Q.I16: "I16", Q.I32: "I32",
               Q.I64: "I64", Q.BF16: "BF16"}  # quantized types are "U8": rows of bytes
ELEMENT_BYTES = {"F32": 4, "F16": 2, "F64": 8, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "BF16": 2,
                 "U8": 1}

# Scalars of every value type, typed arrays of every element type, strings, nested arrays.
SCALARS = {
    "t.u8": (V.UINT8, 255), "t.i8": (V.INT8, -128), "t.u16": (V.UINT16, 65535),
    "t.i16": (V.INT16, -32768), "t.u32": (V.UINT32, 4_000_000_000), "t.i32": (V.INT32, -7),
    "t.f32": (V.FLOAT32, 1e-5), "t.bool": (V.BOOL, True), "t.str": (V.STRING, "ünï \"q\"\n"),
    "t.u64": (V.UINT64, 2**64 - 1), "t.i64": (V.INT64, -(2**63)), "t.f64": (V.FLOAT64, -2.5e300),
}
ARRAY_VALUES = {
    V.UINT8: [0, 255], V.INT8: [-128, 127], V.UINT16: [1, 65535], V.INT16: [-32768, 5],
    V.UINT32: [2**32 - 1], V.INT32: [-1, 0, 1], V.FLOAT32: [0.5, -1e-3], V.BOOL: [True, False],
    V.STRING: ["<s>", "", "ü", "a b"], V.UINT64: [2**64 - 1, 0], V.INT64: [-(2**63)],
    V.FLOAT64: [1e-300, 3.0],
}


def random_bytes(rng, shape):
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def write_model(path, seed=0, alignment=None, split_max_tensors=0, vocab=0):
    """A GGUF of every metadata type and every tensor type the gguf package knows."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (vtype, value) in SCALARS.items():
        w.add_key_value(key, value, vtype)
    for vtype, values in ARRAY_VALUES.items():
        w.add_key_value(f"arr.{vtype.name.lower()}", values, V.ARRAY, sub_type=vtype)
    w.add_array("arr.nested", [[1, 2], [3]])
    if vocab:
        w.add_token_list([f"tok{i}" for i in range(vocab)])
    for i, (np_dtype, _) in enumerate(PLAIN.items()):
        shape = [(3, 7), (17,), (2, 3, 5), (0, 4)][i % 4]
        data = rng.integers(-100, 100, size=shape).astype(np_dtype)
        w.add_tensor(f"plain.{np.dtype(np_dtype).name}", data)
    w.add_tensor("plain.bf16", random_bytes(rng, (5, 2 * 9)), raw_dtype=Q.BF16)
    w.add_tensor("big.f32", rng.standard_normal((300, 257)).astype(np.float32))
    for i, qtype in enumerate(QUANTIZED):
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        rows = (2, 3) if i % 2 else (3,)
        w.add_tensor(f"q.{qtype.name}", random_bytes(rng, (*rows, 2 * type_size)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("gguf") / "model.gguf", seed=1, vocab=3000)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("aligned") / "model.gguf", seed=2, alignment=256)


@pytest.fixture(scope="module")
def unaligned(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("unaligned") / "model.gguf", seed=3, alignment=1)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    directory = tmp_path_factory.mktemp("split")
    write_model(directory / "model.gguf", seed=4, split_max_tensors=12)
    return directory


def gguf_files(path):
    return sorted(path.glob("*.gguf")) if path.is_dir() else [path]


def reference(*files):
    """What GGUFReader reads: {name: (type name, dims, xxh3-64 hex, tensor)}."""
    out = {}
    for f in files:
        for t in gguf.GGUFReader(f).tensors:
            assert t.name not in out
            out[t.name] = (t.tensor_type.name, [int(d) for d in t.shape],
                           xxhash.xxh3_64_hexdigest(t.data.tobytes()), t)
    return out


def flatten(node):
    """A ferry metadata node as GGUFReader's contents() gives it (nested arrays flattened)."""
    if node["type"] != "ARRAY":
        return node["value"]
    if node["element_type"] == "ARRAY":
        return [x for inner in node["value"] for x in flatten(inner)]
    return node["value"]


def same_values(got, want, type_name):
    if type_name in ("FLOAT32", "FLOAT64"):
        width = np.float32 if type_name == "FLOAT32" else np.float64
        return np.array_equal(np.asarray(got, dtype=width), np.asarray(want, dtype=width))
    return got == want


def check_metadata(file_report, reader):
    meta = file_report["gguf_metadata"]
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert sorted(meta) == sorted(fields)
    for key, field in fields.items():
        node = meta[key]
        assert node["type"] == field.types[0].name, key
        element = field.types[-1].name
        if node["type"] == "ARRAY":
            assert node["element_type"] == field.types[1].name, key
        assert same_values(flatten(node), field.contents(), element), key
        if node["type"] != "ARRAY":
            assert key in file_report["metadata"], key
        else:
            assert key not in file_report["metadata"], key


@pytest.mark.parametrize("which", ["model", "aligned", "unaligned", "split"])
def test_inspect_json_matches_gguf_reader(request, run_ferry, which):
    path = request.getfixturevalue(which)
    result = run_ferry("inspect", path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["format"] == "gguf"
    files = gguf_files(path)
    assert [f["path"] for f in report["files"]] == [str(f) for f in files]
    for f, file_path in zip(report["files"], files):
        reader = gguf.GGUFReader(file_path)
        assert f["format"] == "gguf"
        assert f["gguf_version"] == reader.fields["GGUF.version"].contents()
        assert f["alignment"] == reader.alignment
        assert f["data_start"] == reader.data_offset
        assert f["size"] == file_path.stat().st_size
        check_metadata(f, reader)

    ref = reference(*files)
    tensors = {t["name"]: t for t in report["tensors"]}
    assert sorted(tensors) == sorted(ref)
    for name, (type_name, dims, _, t) in ref.items():
        got = tensors[name]
        assert got["ggml_type"] == type_name, name
        assert got["ggml_type_id"] == int(t.tensor_type), name
        assert got["ggml_dims"] == dims, name
        assert got["bytes"] == t.n_bytes == t.data.nbytes, name
        assert got["offset"] == t.data_offset, name
        assert got["dtype"] == FERRY_DTYPE.get(t.tensor_type, "U8"), name
        if t.tensor_type != Q.BF16:  # the reader maps BF16 as bytes; ferry keeps its elements
            assert got["shape"] == list(t.data.shape), name
        else:
            assert got["shape"] == dims[::-1], name
        assert int(np.prod(got["shape"])) * ELEMENT_BYTES[got["dtype"]] == got["bytes"], name


def test_every_type_and_value_type_is_covered(model):
    reader = gguf.GGUFReader(model)
    assert {t.tensor_type for t in reader.tensors} == set(Q)
    assert {f.types[0] for f in reader.fields.values()} == set(V)


@pytest.mark.parametrize("which", ["model", "aligned", "unaligned", "split"])
@pytest.mark.parametrize("chunk_mib", [None, "0.0625"])
def test_load_hash_matches_gguf_reader(request, run_ferry, which, chunk_mib):
    path = request.getfixturevalue(which)
    args = ["--chunk-mib", chunk_mib] if chunk_mib else []
    result = run_ferry("load", path, "--device", "cpu", "--hash", *args)
    assert result.returncode == 0, result.stderr
    rows = parse_hash_lines(result.stdout)
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    ref = reference(*gguf_files(path))
    assert {r[0]: r[1:] for r in rows} == {n: v[:3] for n, v in ref.items()}


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_load_io_paths(run_ferry, model, io):
    if io == "direct" and not o_direct_supported(model.parent):
        pytest.skip("no O_DIRECT on this file system")
    result = run_ferry("load", model, "--device", "cpu", "--hash", "--io", io, "--threads", "3")
    assert result.returncode == 0, result.stderr
    ref = reference(model)
    assert {r[0]: r[3] for r in parse_hash_lines(result.stdout)} == \
        {n: v[2] for n, v in ref.items()}


def test_load_selected_tensors(run_ferry, model):
    names = ["q.Q4_K", "plain.bf16", "big.f32"]
    args = [a for n in names for a in ("--tensor", n)]
    result = run_ferry("load", model, "--device", "cpu", "--hash", *args)
    assert result.returncode == 0, result.stderr
    ref = reference(model)
    assert parse_hash_lines(result.stdout) == [(n, *ref[n][:3]) for n in sorted(names)]


def test_inspect_text_summarizes_arrays(run_ferry, model):
    result = run_ferry("inspect", model)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "format: gguf" in out
    assert "metadata: tokenizer.ggml.tokens (ARRAY) = [3000 items of STRING]" in out
    assert "metadata: t.u64 (UINT64) = 18446744073709551615" in out
    assert "metadata: t.str (STRING) = ünï \"q\"\\n" in out
    assert "tok2999" not in out, "text mode summarizes arrays"
    rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
    ref = reference(model)
    assert {r[0]: (r[1], json.loads(r[2]), int(r[3]), int(r[4])) for r in rows} == {
        n: (v[0], v[1], v[3].n_bytes, v[3].data_offset) for n, v in ref.items()}


def test_blob_without_extension_is_gguf(run_ferry, model, tmp_path):
    blob = tmp_path / "sha256-0f1e2d"
    blob.write_bytes(model.read_bytes())
    result = run_ferry("load", blob, "--device", "cpu", "--hash")
    assert result.returncode == 0, result.stderr
    assert {r[0]: r[3] for r in parse_hash_lines(result.stdout)} == \
        {n: v[2] for n, v in reference(model).items()}


# ---------------------------------------------------------------------------------------------
# Malformed files, made by hand


def gstr(text):
    data = text if isinstance(text, bytes) else text.encode()
    return struct.pack("<Q", len(data)) + data


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name, dims, ggml_type, offset):
    return (gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))


def gguf_bytes(kvs=(), tensors=(), data=b"", version=3, magic=b"GGUF", counts=None, align=32):
    n_tensors, n_kvs = counts or (len(tensors), len(kvs))
    out = magic + struct.pack("<IQQ", version, n_tensors, n_kvs) + b"".join(kvs) + b"".join(tensors)
    return out + b"\0" * (-len(out) % align) + data


ARCH = kv("general.architecture", V.STRING, gstr("llama"))


def one(dims=(4,), ggml_type=0, offset=0, data=16, extra=()):
    return gguf_bytes([ARCH, *extra], [tinfo("w", dims, ggml_type, offset)], b"\x5a" * data)


# name -> (file bytes, a word the message must hold)
MALFORMED = {
    "bad_magic": (one()[:3] + b"X" + one()[4:], "bad magic"),
    "version_1": (gguf_bytes([ARCH], version=1), "version 1"),
    "version_4": (gguf_bytes([ARCH], version=4), "unknown GGUF version 4"),
    "big_endian": (gguf_bytes([ARCH], version=3 << 24), "big-endian"),
    "truncated_data": (one()[:-1], "run past"),
    "truncated_header": (one()[:40], "end of the 40-byte file"),
    "kv_count_huge": (gguf_bytes([ARCH], counts=(0, 2**63)), "cannot fit"),
    "tensor_count_huge": (gguf_bytes([ARCH], counts=(2**64 - 1, 1)), "cannot fit"),
    "string_past_end": (gguf_bytes([kv("k", V.STRING, struct.pack("<Q", 10**6) + b"abc")]),
                        "past the end"),
    "array_huge": (gguf_bytes([kv("k", V.ARRAY, struct.pack("<IQ", V.UINT32, 2**62))]),
                   "cannot fit"),
    "unknown_value_type": (gguf_bytes([kv("k", 13, b"\0" * 8)]), "unknown value type 13"),
    "duplicate_key": (gguf_bytes([ARCH, ARCH]), "appears twice"),
    "bad_alignment": (one(extra=[kv("general.alignment", V.UINT32, struct.pack("<I", 48))]),
                      "power of two"),
    "unknown_ggml_type": (one(ggml_type=4), "unknown ggml type 4"),
    "n_dims_5": (one(dims=(1, 1, 1, 1, 4)), "n_dims is 5"),
    "dims_overflow": (one(dims=(2**32, 2**32)), "2^63 - 1 elements"),
    "block_multiple": (one(dims=(33,), ggml_type=Q.Q4_0, data=64), "not a multiple of its block"),
    "misaligned": (one(offset=16, data=64), "not a multiple of the alignment"),
    "out_of_bounds": (one(offset=32), "run past"),
    "overlap": (gguf_bytes([ARCH], [tinfo("a", (8,), 0, 0), tinfo("b", (8,), 0, 0)], b"\0" * 64),
                "overlap"),
    "duplicate_tensor": (gguf_bytes([ARCH], [tinfo("a", (4,), 0, 0), tinfo("a", (4,), 0, 32)],
                                    b"\0" * 64), "appears twice"),
}


@pytest.mark.parametrize("cmd", list(COMMANDS))
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_gguf(run_ferry, tmp_path, case, cmd):
    data, word = MALFORMED[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    expect_clean_error(run_ferry(*command(cmd, path)), path, word)


@pytest.mark.parametrize("case", ["version_4", "unknown_ggml_type", "truncated_data"])
def test_malformed_blob_without_extension(run_ferry, tmp_path, case):
    data, word = MALFORMED[case]
    path = tmp_path / "sha256-abcdef"
    path.write_bytes(data)
    expect_clean_error(run_ferry("load", path, "--device", "cpu", "--hash"), path, word)


def test_hand_made_file_is_valid(run_ferry, tmp_path):
    """The malformed cases start from files that are fine: the defect is the only one."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(one(extra=[kv("general.alignment", V.UINT32, struct.pack("<I", 32))]))
    result = run_ferry("load", path, "--device", "cpu", "--hash")
    assert result.returncode == 0, result.stderr
    assert parse_hash_lines(result.stdout) == [
        ("w", "F32", [4], xxhash.xxh3_64_hexdigest(b"\x5a" * 16))]


def test_names_that_are_not_utf8(run_ferry, tmp_path):
    """GGUF does not check its UTF-8; ferry reads such files and writes valid JSON about them."""
    path = tmp_path / "latin1.gguf"
    path.write_bytes(gguf_bytes([kv(b"k\xe9y", V.STRING, gstr(b"caf\xe9"))],
                                [tinfo("w\udcff".encode("utf-8", "surrogateescape"), (4,), 0, 0)],
                                b"\0" * 16))
    result = run_ferry("inspect", path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["files"][0]["gguf_metadata"] == {"k\ufffdy": {"type": "STRING",
                                                                "value": "caf\ufffd"}}
    assert report["tensors"][0]["name"] == "w\ufffd"


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_directory_mixing_formats(run_ferry, tmp_path, model, cmd):
    (tmp_path / "model.gguf").write_bytes(model.read_bytes())
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    expect_clean_error(run_ferry(*command(cmd, tmp_path)), tmp_path, "mixes")


def test_malformed_split_file_is_named(run_ferry, tmp_path, split):
    for f in gguf_files(split):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    bad = gguf_files(tmp_path)[-1]
    data = bytearray(bad.read_bytes())
    data[4:8] = struct.pack("<I", 4)
    bad.write_bytes(bytes(data))
    expect_clean_error(run_ferry("load", tmp_path, "--device", "cpu"), bad, "version 4")
