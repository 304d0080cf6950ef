"""The ferry CLI on bad input: a clean non-zero exit (never a signal), and a message on stderr
that starts with "ferry: error:" and names the file and the problem."""

import json
import struct

import pytest

from conftest import write_safetensors


def raw(header, data=b""):
    text = header if isinstance(header, bytes) else header.encode()
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def valid_file():
    return raw(json.dumps({"w": entry("F32", [4], 0, 16)}), bytes(16))


# name -> (file bytes, a word the message must hold)
MALFORMED = {
    "too_short": (b"\x10\0\0", "too short"),
    "truncated_header": (valid_file()[:30], "runs past the end"),
    "truncated_data": (valid_file()[:-1], "run past"),
    "header_length_huge": (b"\xff" * 8 + b"{}", "exceeds the limit"),
    "empty_header": (struct.pack("<Q", 0), "header is empty"),
    "invalid_json": (raw('{"w": {"dtype": "F32",'), "not valid JSON"),
    "not_an_object": (raw("[1, 2, 3]"), "not an object"),
    "unknown_dtype": (raw(json.dumps({"w": entry("F128", [1], 0, 16)}), bytes(16)), "F128"),
    "size_mismatch": (raw(json.dumps({"w": entry("F32", [3], 0, 16)}), bytes(16)), "needs 12"),
    "out_of_bounds": (raw(json.dumps({"w": entry("U8", [64], 0, 64)}), bytes(16)), "run past"),
    "reversed_offsets": (raw(json.dumps({"w": entry("U8", [4], 8, 4)}), bytes(16)), "reversed"),
    "overlapping": (
        raw(json.dumps({"a": entry("U8", [8], 0, 8), "b": entry("U8", [8], 4, 12)}), bytes(12)),
        "overlap",
    ),
    "non_string_metadata": (raw(json.dumps({"__metadata__": {"epoch": 3}})), "not a string"),
    "duplicate_name": (
        raw('{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},'
            ' "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}', b"ab"),
        "twice",
    ),
    "f4_odd_count": (raw(json.dumps({"w": entry("F4", [3], 0, 2)}), bytes(2)), "whole bytes"),
}

COMMANDS = {
    "load": ["load", "{path}", "--device", "cpu"],
    "load_hash": ["load", "{path}", "--device", "cpu", "--hash"],
    "inspect": ["inspect", "{path}"],
    "inspect_json": ["inspect", "{path}", "--json"],
}


def command(name, path):
    return [str(path) if a == "{path}" else a for a in COMMANDS[name]]


def expect_clean_error(result, *words):
    assert result.returncode > 0, f"exit {result.returncode} (negative: killed by a signal)"
    assert result.stderr.startswith("ferry: error:"), result.stderr
    assert result.stdout == "", "nothing is printed before the error"
    for word in words:
        assert str(word).lower() in result.stderr.lower(), result.stderr
    assert "terminate called" not in result.stderr
    assert "Sanitizer" not in result.stderr


@pytest.fixture
def good(tmp_path):
    return write_safetensors(tmp_path / "good.safetensors", {"w": ("float32", [3, 7])})


@pytest.mark.parametrize("cmd", list(COMMANDS))
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file(run_ferry, tmp_path, case, cmd):
    data, word = MALFORMED[case]
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(data)
    expect_clean_error(run_ferry(*command(cmd, path)), path, word)


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_malformed_shard_in_a_directory(run_ferry, tmp_path, good, cmd):
    bad = tmp_path / "zz.safetensors"
    bad.write_bytes(MALFORMED["overlapping"][0])
    expect_clean_error(run_ferry(*command(cmd, tmp_path)), bad, "overlap")


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_missing_path(run_ferry, tmp_path, cmd):
    path = tmp_path / "does-not-exist.safetensors"
    expect_clean_error(run_ferry(*command(cmd, path)), path, "no such file")


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_empty_directory(run_ferry, tmp_path, cmd):
    expect_clean_error(run_ferry(*command(cmd, tmp_path)), tmp_path, "no .safetensors files")


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_index_listing_a_missing_tensor(run_ferry, tmp_path, good, cmd):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": good.name, "ghost": good.name}}))
    expect_clean_error(run_ferry(*command(cmd, tmp_path)), index, "ghost")


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_index_not_json(run_ferry, tmp_path, good, cmd):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("{weight_map")
    expect_clean_error(run_ferry(*command(cmd, index)), index, "not valid JSON")


def test_bad_device(run_ferry, good):
    expect_clean_error(run_ferry("load", good, "--device", "gpu7"), "gpu7")


def test_bad_device_index(run_ferry, good):
    expect_clean_error(run_ferry("load", good, "--device", "cuda:x"), "cuda:x")


def test_unknown_tensor_name(run_ferry, good):
    result = run_ferry("load", good, "--device", "cpu", "--tensor", "no.such.tensor")
    expect_clean_error(result, good, "no.such.tensor")


def test_unknown_tensor_name_among_known_ones(run_ferry, good):
    result = run_ferry("load", good, "--device", "cpu", "--hash", "--tensor", "w", "--tensor",
                       "missing")
    expect_clean_error(result, good, "missing")


def test_bad_io_mode(run_ferry, good):
    expect_clean_error(run_ferry("load", good, "--device", "cpu", "--io", "sideways"), "sideways")


@pytest.mark.parametrize(
    "args",
    [
        ["load"],  # no path
        ["inspect"],
        ["load", "{good}", "--chunk-mib", "-1"],
        ["load", "{good}", "--staging-mib", "0"],
        ["load", "{good}", "--threads", "many"],
        ["load", "{good}", "--repeat", "0"],
        ["load", "{good}", "--no-such-option"],
        ["frobnicate", "{good}"],
        [],  # no subcommand
    ],
    ids=lambda a: "_".join(a) or "nothing",
)
def test_argument_errors(run_ferry, good, args):
    result = run_ferry(*[str(good) if a == "{good}" else a for a in args])
    assert result.returncode > 0, f"exit {result.returncode}"
    assert result.stderr.strip() != ""
    assert result.stdout == "" or "Usage" in result.stdout


@pytest.mark.parametrize(
    "flag,value,words",
    [
        ("--staging-mib", "nan", "staging_bytes"),
        ("--staging-mib", "1e30", "staging_bytes"),
        ("--chunk-mib", "inf", "chunk_bytes"),
        ("--chunk-mib", "18446744073709551615", "at most"),
        ("--threads", "4294967295", "at most 256"),
        ("--threads", "-3", "threads"),
        ("--slots", "1.5", "whole number"),
    ],
)
def test_engine_settings_out_of_range_are_named(run_ferry, good, flag, value, words):
    result = run_ferry("load", good, "--device", "cpu", flag, value)
    expect_clean_error(result, value, words)


def test_staging_too_small_for_the_chunk_size(run_ferry, good):
    result = run_ferry("load", good, "--device", "cpu", "--chunk-mib", "4", "--staging-mib", "1")
    expect_clean_error(result, "staging")


def test_deeply_nested_shape_is_refused_cleanly(run_ferry, tmp_path):
    depth = 1_000_000
    header = ('{"w": {"dtype": "U8", "shape": [' + "[" * depth + "]" * depth +
              '], "data_offsets": [0, 1]}}')
    path = tmp_path / "nested.safetensors"
    path.write_bytes(raw(header, b"x"))
    expect_clean_error(run_ferry("inspect", path), path, "shape")


def test_doctor_tune_needs_a_checkpoint(run_ferry):
    r = run_ferry("doctor", "--tune")
    assert r.returncode == 1 and "ferry: error:" in r.stderr and "needs a checkpoint PATH" in r.stderr


def test_doctor_tune_writes_the_file_later_loads_use(run_ferry, tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_TUNING_FILE", str(tmp_path / "tuning.json"))
    path = write_safetensors(tmp_path / "m.safetensors", {"w": ("uint8", [40 << 20])})
    tuned = run_ferry("doctor", path, "--tune", "--json", "--read-limit-gib", "0.01", timeout=300)
    assert tuned.returncode == 0, tuned.stderr
    chosen = json.loads((tmp_path / "tuning.json").read_text())
    engine = json.loads(tuned.stdout)["engine"]
    assert engine["reader_threads"] == chosen["reader_threads"]
    assert "measured by ferry doctor --tune" in engine["settings_source"]
    stats = json.loads(run_ferry("load", path, "--json").stdout)[0]
    # (a load with few chunks may run fewer threads and slots than chosen; never larger reads)
    assert stats["chunk_bytes"] == chosen["chunk_bytes"]
    assert stats["settings_source"] == engine["settings_source"]
    (tmp_path / "tuning.json").write_text("{broken")
    broken = run_ferry("load", path)  # never stops a load: the defaults, and the reason
    assert broken.returncode == 0, broken.stderr
    assert "settings: built-in defaults (" + str(tmp_path / "tuning.json") in broken.stdout
    assert "not a usable ferry tuning file" in broken.stdout and "--tune" in broken.stdout
