"""The CLI where the environment or the input is hostile or unlucky: output that cannot be
written, numbers out of range, escape sequences in names, paths that are not UTF-8, memory
that runs out (issue 12)."""

import json
import os
import re
import resource
import struct
import subprocess

import pytest

from conftest import write_safetensors


def raw(header, data=b""):
    text = header if isinstance(header, bytes) else header.encode()
    return struct.pack("<Q", len(text)) + text + data


def run_bytes(ferry_bin, *args, stdout=subprocess.PIPE, **kwargs):
    """Runs ferry with byte output (names and paths need not be UTF-8)."""
    return subprocess.run([str(ferry_bin), *args], stdout=stdout, stderr=subprocess.PIPE,
                          timeout=60, **kwargs)


def skip_if_sanitized(ferry_bin):
    """AddressSanitizer reserves terabytes of address space: RLIMIT_AS tests cannot run there."""
    if b"__asan_init" in ferry_bin.read_bytes():
        pytest.skip("address-space limits cannot be tested under AddressSanitizer")


@pytest.fixture
def good(tmp_path):
    return write_safetensors(tmp_path / "good.safetensors", {"w": ("float32", [3, 7])})


# --- item 4: output that never arrived is a failure ---------------------------------------------

@pytest.mark.parametrize("args", [["load", "--device", "cpu", "--hash"], ["inspect", "--json"],
                                  ["inspect"], ["load", "--device", "cpu", "--json"]],
                         ids=lambda a: "_".join(a).replace("-", ""))
def test_write_errors_on_stdout_fail_the_command(ferry_bin, good, args):
    with open("/dev/full", "wb") as full:
        r = run_bytes(ferry_bin, args[0], str(good), *args[1:], stdout=full)
    assert r.returncode == 1, r.stderr
    assert b"ferry: error: cannot write to standard output" in r.stderr
    assert b"No space left on device" in r.stderr


# --- item 13: numbers checked, messages that say what is wrong -----------------------------------

# flag -> what the message names (engine settings go through set_load_option, named by key)
NAMED = {"--staging-mib": "staging_bytes", "--chunk-mib": "chunk_bytes", "--threads": "threads",
         "--slots": "slots", "--repeat": "--repeat"}


@pytest.mark.parametrize("args", [
    ["--staging-mib", "1e30"], ["--staging-mib", "nan"], ["--staging-mib", "inf"],
    ["--chunk-mib", "nan"], ["--chunk-mib", "18446744073709551615"], ["--chunk-mib", "-1"],
    ["--threads", "4294967295"], ["--threads", "-1"], ["--slots", "1000"],
    ["--repeat", "0"], ["--repeat", "4294967296"],
], ids=lambda a: "_".join(a).replace("-", ""))
def test_numbers_out_of_range_are_refused_naming_the_flag(run_ferry, good, args):
    r = run_ferry("load", good, "--device", "cpu", *args)
    assert r.returncode > 0
    assert NAMED[args[0]] in r.stderr, r.stderr
    assert "staging of 0 bytes" not in r.stderr and "must be positive" not in r.stderr
    assert "loaded" not in r.stdout


def test_doctor_read_limit_nan_is_refused(run_ferry, good):
    r = run_ferry("doctor", good, "--read-limit-gib", "nan")
    assert r.returncode > 0 and "--read-limit-gib" in r.stderr, r.stderr


def test_doctor_on_a_device_says_what_it_is(run_ferry):
    r = run_ferry("doctor", "/dev/zero", "--read-limit-gib", "0.001")
    assert r.returncode == 1
    assert "/dev/zero: not a regular file or a directory" in r.stderr, r.stderr
    assert "no such file" not in r.stderr.lower()


def test_doctor_storage_facts_are_a_value_and_a_reason(run_ferry, good):
    r = run_ferry("doctor", good, "--json", "--read-limit-gib", "0.001")
    assert r.returncode == 0, r.stderr
    path = json.loads(r.stdout)["path"]
    assert re.fullmatch(r"(yes|no|unknown): .+", path["storage"]["nvme"]), path["storage"]
    assert "bypass_io" not in path["storage"]  # Windows alone has BypassIO
    assert path["odirect"]["flag"] == "O_DIRECT"
    assert 0 <= path["page_cache_fraction"] <= 1  # Linux measures it (mincore)
    text = run_ferry("doctor", good, "--read-limit-gib", "0.001").stdout
    assert "  NVMe: " + path["storage"]["nvme"] + "\n" in text, text


def test_doctor_on_a_missing_path_says_so(run_ferry, tmp_path):
    r = run_ferry("doctor", tmp_path / "missing", "--read-limit-gib", "0.001")
    assert r.returncode == 1 and "missing" in r.stderr and "No such file" in r.stderr, r.stderr


def test_running_out_of_memory_for_a_header_names_the_file(ferry_bin, tmp_path):
    skip_if_sanitized(ferry_bin)
    # A valid 90 MB header (one long metadata value); the address space is capped below what
    # reading and parsing it needs.
    header = json.dumps({"__metadata__": {"notes": "x" * (90 << 20)},
                         "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})
    path = tmp_path / "big_header.safetensors"
    path.write_bytes(raw(header, b"x"))

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (160 << 20, 160 << 20))

    r = run_bytes(ferry_bin, "inspect", str(path), preexec_fn=cap_memory)
    if r.returncode == 0:
        pytest.skip("the header fit in 160 MB of address space here")
    assert r.returncode == 1, r.stderr
    assert str(path).encode() + b": out of memory" in r.stderr, r.stderr
    assert b"std::bad_alloc" not in r.stderr


# --- item 14: nothing from a file reaches the terminal raw ---------------------------------------

ESCAPE = "\x1b]0;owned\x07\x1b[2J"


def test_escape_sequences_in_names_metadata_and_paths_are_escaped(ferry_bin, tmp_path):
    name = f"w{ESCAPE}\u009b31m"
    header = json.dumps({"__metadata__": {f"k{ESCAPE}": f"v{ESCAPE}"},
                         name: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})
    path = tmp_path / f"m{ESCAPE}.safetensors"
    path.write_bytes(raw(header, b"x"))
    for args in (["inspect", str(path)], ["load", str(path), "--device", "cpu", "--hash"],
                 ["load", str(path), "--device", "cpu"]):
        r = run_bytes(ferry_bin, *args)
        assert r.returncode == 0, r.stderr
        for out in (r.stdout, r.stderr):
            assert b"\x1b" not in out and b"\x07" not in out and "\u009b".encode() not in out
        assert b"\\x1b]0;owned\\x07\\x1b[2J" in r.stdout, r.stdout
    inspect = run_bytes(ferry_bin, "inspect", str(path)).stdout
    assert b"w\\x1b]0;owned\\x07\\x1b[2J\\xc2\\x9b31m\tU8" in inspect
    assert b"metadata: k\\x1b" in inspect and b"= v\\x1b" in inspect


def test_escape_sequences_in_error_messages_are_escaped(ferry_bin, tmp_path):
    header = json.dumps({f"w{ESCAPE}": {"dtype": "U8", "shape": [2], "data_offsets": [0, 1]}})
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw(header, b"x"))
    r = run_bytes(ferry_bin, "inspect", str(path))
    assert r.returncode == 1
    assert b"\x1b" not in r.stderr and b"w\\x1b]0;owned" in r.stderr, r.stderr


# --- item 12: paths that are not UTF-8 -----------------------------------------------------------

def test_shard_names_that_are_not_utf8_load_with_json(ferry_bin, tmp_path):
    shard = os.fsencode(tmp_path) + b"/caf\xe9.safetensors"
    write_safetensors(os.fsdecode(shard), {"w": ("float32", [3, 7])})
    for args in (["load", "--device", "cpu", "--json"], ["inspect", "--json"],
                 ["load", "--device", "cpu", "--json", "--hash"]):
        r = run_bytes(ferry_bin, args[0], str(tmp_path), *args[1:])
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stderr if "--hash" in args else r.stdout)
        paths = [f["path"] for f in (doc[0]["files"] if args[0] == "load" else doc["files"])]
        assert paths == [str(tmp_path) + "/caf\ufffd.safetensors"]
    r = run_bytes(ferry_bin, "load", str(tmp_path), "--device", "cpu")
    assert r.returncode == 0 and b"caf\\xe9.safetensors" in r.stdout, r.stdout


# --- item 9: an unusable tuning location never stops or hangs a load -----------------------------

@pytest.mark.parametrize("kind", ["fifo", "directory", "malformed"])
def test_unusable_tuning_file_means_the_defaults(run_ferry, good, tmp_path, monkeypatch, kind):
    cache = tmp_path / "cache"
    tuning = cache / "ferry" / "tuning.json"
    tuning.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(tuning)
    elif kind == "directory":
        tuning.mkdir()
    else:
        tuning.write_text('{"reader_threads": 4}')
    monkeypatch.delenv("FERRY_TUNING_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    r = run_ferry("load", good, "--device", "cpu", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    source = json.loads(r.stdout)[0]["settings_source"]
    assert source.startswith("built-in defaults (" + str(tuning)), source
    doctor = run_ferry("doctor", "--json", timeout=60)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["engine"]["settings_source"] == source


# --- item 11: a GGUF header's memory stays in proportion to it -----------------------------------

def test_a_large_gguf_metadata_array_does_not_cost_several_times_its_size(ferry_bin, tmp_path):
    skip_if_sanitized(ferry_bin)
    # 64 MiB of UINT8 metadata: kept as 64 MiB, never turned into JSON for a load (as JSON it
    # took 256 MiB and more while growing).
    size = 64 << 20
    key = b"big"
    header = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key +
              struct.pack("<IIQ", 9, 0, size) + os.urandom(size))
    path = tmp_path / "metadata.gguf"
    path.write_bytes(header + bytes(-len(header) % 32))

    def cap_memory():  # ferry itself needs < 30 MB here; the header is 64 MiB
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20))

    r = run_bytes(ferry_bin, "load", str(path), "--device", "cpu", "--staging-mib", "1",
                  "--threads", "1", preexec_fn=cap_memory)
    assert r.returncode == 0, r.stderr


# --- issue 29: output files that cannot be written, memory asked for that is not there ----------

BENCH = ["kv", "bench", "--sizes", "4K", "--bytes", "64K", "--rounds", "1"]


@pytest.mark.parametrize("target", ["a_directory", "/dev/full", "missing/x.json"])
def test_kv_bench_json_that_cannot_be_written_fails_naming_it(ferry_bin, tmp_path, target):
    (tmp_path / "a_directory").mkdir()
    path = target if target.startswith("/") else str(tmp_path / target)
    r = run_bytes(ferry_bin, *BENCH[:2], str(tmp_path / "root"), *BENCH[2:], "--json", path)
    assert r.returncode == 1, r.stderr
    assert b"ferry: error: " + path.encode() + b": cannot" in r.stderr, r.stderr
    assert not (tmp_path / "missing").exists()


def test_kv_bench_json_is_written(ferry_bin, tmp_path):
    out = tmp_path / "rows.json"
    r = run_bytes(ferry_bin, *BENCH[:2], str(tmp_path / "root"), *BENCH[2:], "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert rows and rows[0]["block_bytes"] == 4096


def test_kv_bench_blocks_too_large_for_memory_say_so(ferry_bin, tmp_path):
    skip_if_sanitized(ferry_bin)

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    r = run_bytes(ferry_bin, *BENCH[:2], str(tmp_path / "root"), "--sizes", "3G", "--bytes", "3G",
                  preexec_fn=cap_memory)
    assert r.returncode == 1, r.stderr
    assert b"ferry: error: out of memory" in r.stderr, r.stderr
    assert b"bad_alloc" not in r.stderr
