"""Ctrl-C during a load (issue 12 item 10): the load stops between chunks, KeyboardInterrupt is
raised in its place, and everything is released (the next load in the same process works)."""
import os
import subprocess
import sys
import textwrap

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the Python package's tests are skipped in this run", allow_module_level=True)
pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    import ferry.torch
    from safetensors.torch import save_file

    path = sys.argv[1]
    save_file({"w": torch.arange(64 << 20, dtype=torch.int32)}, path)  # 256 MiB
    seen = []

    def progress(done, total):
        if not seen:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would, once the load is under way
        seen.append((done, total))

    try:
        # 4 KiB reads on one thread: some 65,000 chunks, far more than one wait's worth.
        ferry.torch.load_with_stats(path, progress=progress, chunk_bytes=4096, threads=1)
        print("finished without an interrupt")
        sys.exit(1)
    except KeyboardInterrupt:
        done, total = seen[-1]
        print(f"interrupted at {done} of {total} bytes")
        if done >= total:
            sys.exit(2)
    tensors, stats = ferry.torch.load_with_stats(path)
    assert torch.equal(tensors["w"], torch.arange(64 << 20, dtype=torch.int32))
    print("the next load works")
""")


def test_ctrl_c_stops_a_load_between_chunks_and_releases_it(tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "big.safetensors")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "interrupted at" in result.stdout
    assert "the next load works" in result.stdout


def test_ctrl_c_stops_the_cli_with_status_130(tmp_path, ferry_bin):
    import signal
    import torch
    from safetensors.torch import save_file
    path = tmp_path / "big.safetensors"
    save_file({"w": torch.zeros(64 << 20, dtype=torch.int32)}, str(path))
    process = subprocess.Popen([str(ferry_bin), "load", str(path), "--device", "cpu",
                                "--threads", "1", "--chunk-mib", "0.00390625", "--repeat", "1000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A thousand loads of 256 MiB in 4 KiB reads cannot end before the signal; the first progress
    # line (stderr, unbuffered) says the loads are under way and the handler is in place.
    first = process.stderr.readline()
    assert first.startswith("loading"), first + process.stderr.read()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 130, err
    assert "interrupted" in err
