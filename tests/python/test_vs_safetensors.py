"""ferry against Hugging Face's safetensors: every tensor ferry loads must have the dtype, shape
and bytes (XXH3-64) that safetensors itself reads from the same file, whatever the I/O path,
chunk size or thread count."""

import json
import pathlib

import pytest
import safetensors

from conftest import (
    DTYPES,
    PACKED_X2,
    o_direct_supported,
    parse_hash_lines,
    raw_header,
    reference,
    write_safetensors,
)

# Odd sizes on purpose: nothing here is a multiple of a page or of a chunk.
SHAPES = [[3, 7], [1], [0], [17, 33], [2, 0, 5], [5, 1, 3]]

SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
          "model-00003-of-00003.safetensors"]


def shard_contents():
    """Three shards of varied dtypes; one tensor (~1 MB) spans many 64 KiB chunks."""
    return [
        {"embed.weight": ("bfloat16", [513, 1001]), "norm.weight": ("float32", [1001])},
        {
            "layers.0.attn.q": ("float16", [64, 65]),
            "layers.0.attn.k": ("float8_e4m3fn", [65, 64]),
            "layers.0.scale": ("float8_e8m0fnu", [3]),
            "layers.0.bias": ("int64", [0]),
        },
        {"lm_head.weight": ("float4_e2m1fn_x2", [300, 257]), "lm_head.bias": ("float64", [7])},
    ]


# ---------------------------------------------------------------------------------------------
# Checkpoints, written once per module


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One file holding every dtype plus a few tensors larger than the small chunk size."""
    tensors = {}
    for dtype in DTYPES:
        for i, shape in enumerate(SHAPES[:4]):
            tensors[f"{dtype}.{i}"] = (dtype, shape)
    tensors["big.f32"] = ("float32", [300, 257])
    tensors["big.bf16"] = ("bfloat16", [513, 1001])
    tensors["big.u8"] = ("uint8", [65537])
    path = tmp_path_factory.mktemp("mixed") / "model.safetensors"
    return write_safetensors(path, tensors, {"format": "pt", "note": "mixed dtypes"}, seed=1)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Three shards and a model.safetensors.index.json in Hugging Face's layout."""
    directory = tmp_path_factory.mktemp("sharded")
    weight_map = {}
    for i, (name, tensors) in enumerate(zip(SHARDS, shard_contents())):
        write_safetensors(directory / name, tensors, {"format": "pt", "shard": str(i)}, seed=10 + i)
        weight_map.update({t: name for t in tensors})
    total = sum(v[3] for v in reference(*(directory / s for s in SHARDS)).values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory


@pytest.fixture(scope="module")
def shards_without_index(tmp_path_factory):
    directory = tmp_path_factory.mktemp("noindex")
    for i, (name, tensors) in enumerate(zip(SHARDS, shard_contents())):
        write_safetensors(directory / name, tensors, None, seed=20 + i)
    return directory


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """300 small tensors of varied dtypes and sizes, zero-sized ones included."""
    dtypes = list(DTYPES)
    tensors = {}
    for i in range(300):
        dtype = dtypes[i % len(dtypes)]
        shape = [(i * 37) % 23, (i * 11) % 19 + 1] if i % 7 else [i % 5]
        tensors[f"blk.{i:03d}.{dtype}"] = (dtype, shape)
    path = tmp_path_factory.mktemp("many") / "many.safetensors"
    return write_safetensors(path, tensors, {"tensors": "300"}, seed=4)


def shard_files(path: pathlib.Path):
    if path.is_dir():
        return sorted(path.glob("*.safetensors"))
    if path.suffix == ".json":
        return sorted(path.parent.glob("*.safetensors"))
    return [path]


def checkpoint_path(request, which):
    if which == "sharded_index_json":
        return request.getfixturevalue("sharded") / "model.safetensors.index.json"
    return request.getfixturevalue(which)


# ---------------------------------------------------------------------------------------------
# Helpers


def expected_rows(ref, names=None):
    names = sorted(ref) if names is None else sorted(names)
    return [(n, ref[n][0], ref[n][1], ref[n][2]) for n in names]


def load_and_compare(run_ferry, path, ref, *options, names=None):
    result = run_ferry("load", path, "--device", "cpu", "--hash", *options)
    assert result.returncode == 0, result.stderr
    rows = parse_hash_lines(result.stdout)
    printed = [r[0] for r in rows]
    assert printed == sorted(printed), "ferry prints tensors sorted by name"
    assert rows == expected_rows(ref, names)
    return result


# ---------------------------------------------------------------------------------------------
# Loads


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_dtype_matches_safetensors(run_ferry, tmp_path, dtype):
    shapes = list(SHAPES)
    if dtype not in PACKED_X2:
        shapes.append([])  # a scalar
    tensors = {f"t{i}": (dtype, shape) for i, shape in enumerate(shapes)}
    path = write_safetensors(tmp_path / f"{dtype}.safetensors", tensors, seed=len(dtype))
    ref = reference(path)
    assert {v[0] for v in ref.values()} == {DTYPES[dtype][0]}
    load_and_compare(run_ferry, path, ref)


VARIANTS = {
    "default": [],
    "buffered": ["--io", "buffered"],
    "direct": ["--io", "direct"],
    "small_chunks": ["--chunk-mib", "0.0625", "--staging-mib", "1"],
    "threads3": ["--threads", "3"],
    "small_chunks_threads3_direct": [
        "--chunk-mib", "0.0625", "--staging-mib", "1", "--threads", "3", "--io", "direct"],
    "small_chunks_threads3_buffered": [
        "--chunk-mib", "0.0625", "--staging-mib", "1", "--threads", "3", "--io", "buffered"],
}

CHECKPOINTS = ["mixed", "sharded", "sharded_index_json", "shards_without_index", "many"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("which", CHECKPOINTS)
def test_load_matches_safetensors(request, run_ferry, which, variant):
    path = checkpoint_path(request, which)
    options = VARIANTS[variant]
    if "direct" in options and not o_direct_supported(shard_files(path)[0].parent):
        pytest.skip("the temporary directory's file system refuses O_DIRECT")
    ref = reference(*shard_files(path))
    load_and_compare(run_ferry, path, ref, *options)


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_requested_io_path_is_the_one_taken(run_ferry, mixed, sharded, io):
    # Statistics go to stderr as JSON when --hash holds stdout; a forced mode never falls back.
    for path in (mixed, sharded):
        if io == "direct" and not o_direct_supported(shard_files(path)[0].parent):
            pytest.skip("the temporary directory's file system refuses O_DIRECT")
        ref = reference(*shard_files(path))
        result = load_and_compare(run_ferry, path, ref, "--io", io, "--json",
                                  "--chunk-mib", "0.0625", "--staging-mib", "1")
        (stats,) = json.loads(result.stderr)
        assert stats["device"] == "cpu"
        assert stats["tensor_bytes"] == sum(v[3] for v in ref.values())
        assert stats["bytes_read"] >= stats["tensor_bytes"]
        assert stats["chunk_bytes"] <= 64 * 1024
        assert sorted(pathlib.Path(f["path"]) for f in stats["files"]) == shard_files(path)
        want = "odirect" if io == "direct" else "buffered"
        assert {f["io_path"] for f in stats["files"]} == {want}


@pytest.mark.parametrize("which", ["mixed", "sharded", "many"])
def test_tensor_filter_loads_exactly_those(request, run_ferry, which):
    path = checkpoint_path(request, which)
    ref = reference(*shard_files(path))
    names = sorted(ref)
    chosen = [names[0], names[len(names) // 2], names[-1]]
    if which == "sharded":
        chosen = ["embed.weight", "layers.0.bias", "lm_head.weight"]  # one per shard
    options = [arg for name in chosen for arg in ("--tensor", name)]
    load_and_compare(run_ferry, path, ref, *options, names=chosen)
    load_and_compare(run_ferry, path, ref, *options, "--chunk-mib", "0.0625", "--staging-mib",
                     "1", names=chosen)


def test_single_tensor_filter(run_ferry, mixed):
    ref = reference(mixed)
    load_and_compare(run_ferry, mixed, ref, "--tensor", "big.bf16", names=["big.bf16"])


def test_tensor_option_before_the_path(run_ferry, mixed):
    ref = reference(mixed)
    result = run_ferry("load", "--tensor", "big.u8", mixed, "--device", "cpu", "--hash")
    assert result.returncode == 0, result.stderr
    assert parse_hash_lines(result.stdout) == expected_rows(ref, ["big.u8"])


# ---------------------------------------------------------------------------------------------
# Inspect


@pytest.mark.parametrize("which", CHECKPOINTS)
def test_inspect_json_matches_safetensors(request, run_ferry, which):
    path = checkpoint_path(request, which)
    files = shard_files(path)
    ref = reference(*files)

    result = run_ferry("inspect", path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)

    assert pathlib.Path(report["path"]) == path
    assert sorted(pathlib.Path(f["path"]) for f in report["files"]) == files
    for f in report["files"]:
        with safetensors.safe_open(f["path"], framework="numpy") as handle:
            assert f["metadata"] == (handle.metadata() or {})
        assert f["size"] == pathlib.Path(f["path"]).stat().st_size

    tensors = {t["name"]: t for t in report["tensors"]}
    assert len(tensors) == len(report["tensors"]), "a tensor listed twice"
    assert sorted(tensors) == sorted(ref)
    for name, (dtype, shape, _, size) in ref.items():
        assert (tensors[name]["dtype"], tensors[name]["shape"], tensors[name]["bytes"]) == (
            dtype, shape, size), name
    assert report["total_bytes"] == sum(v[3] for v in ref.values())

    # Offsets are absolute: the header's relative ones plus 8 + N.
    for f in files:
        data_start, header = raw_header(f)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            assert pathlib.Path(tensors[name]["file"]) == f
            assert tensors[name]["offset"] == data_start + entry["data_offsets"][0]

    # Read order: by file (as listed), then by offset.
    order = [f["path"] for f in report["files"]]
    keys = [(order.index(t["file"]), t["offset"]) for t in report["tensors"]]
    assert keys == sorted(keys)


def test_inspect_text_lists_every_tensor(run_ferry, many):
    ref = reference(many)
    result = run_ferry("inspect", many)
    assert result.returncode == 0, result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            rows[parts[0]] = (parts[1], json.loads(parts[2]), int(parts[3]))
    assert rows == {n: (v[0], v[1], v[3]) for n, v in ref.items()}
    assert "metadata: tensors = 300" in result.stdout
