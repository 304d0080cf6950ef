"""bench/kv/kv_vs_fs_tier.py end to end on the CPU: ferry.KVStore beside the fs-tier equivalent on
a few small blocks, whole and in pieces, ferry's calls one at a time and several at once. The
script checks every block read back against the one written (and exits non-zero where one
differs); timing is not checked, the rows are."""
import os
import pathlib
import subprocess
import sys

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

pytest.importorskip("torch")

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "kv" / "kv_vs_fs_tier.py"
ROWS = ("ferry put", "fs put", "fs put+fdatasync", "ferry get cold", "fs get cold",
        "ferry get warm", "fs get warm")


@pytest.mark.parametrize("pieces,inflight", [(1, 1), (4, 3)])
def test_both_stores_round_trip_and_report_every_row(tmp_path, pieces, inflight):
    done = subprocess.run([sys.executable, str(BENCH), "--dir", str(tmp_path), "--blocks", "12",
                           "--block-mib", "0.25", "--batch", "5", "--rounds", "1",
                           "--pieces", str(pieces), "--inflight", str(inflight)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"5 blocks per call, {inflight} at once" in done.stdout, done.stdout
    for row in ROWS:
        assert any(line.strip().startswith(row + " ") for line in done.stdout.splitlines()), \
            (row, done.stdout)
    assert "ferry / fs tier: put" in done.stdout
