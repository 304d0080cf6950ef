"""safetensors' own Python tests, run with every loading call routed to ferry.

The tests ship in the safetensors 0.8.0 sdist on PyPI (bindings/python/tests/). They are
downloaded at test time from the package index (the file's sha256 checked against the index and
against the hash pinned here), cached, extracted to a temporary directory and run by pytest in a
subprocess whose conftest replaces safetensors' loading entry points with ferry's before any test
module imports them. Saving stays with safetensors. Nothing of safetensors is kept in ferry's
tree. Skipped, saying why, when the index cannot be reached and nothing is cached."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

import ferry

SDIST = "safetensors-0.8.0.tar.gz"
SDIST_SHA256 = "fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d"
INDEX = "https://pypi.org/simple/safetensors/"

# Test files run; the others need frameworks not installed here (tensorflow, flax/jax, paddle,
# mlx) and are not run.
TEST_FILES = ["test_simple.py", "test_pt_comparison.py", "test_pt_model.py", "test_handle.py",
              "test_pread_backend.py", "test_multithreaded.py", "test_threadable.py"]

# Deselected, each a test of saving alone:
DESELECTED = {
    # Whether serialize_file releases the GIL, judged by timing four concurrent writers.
    "test_threadable.py::TestCase::test_serialize_file_releases_gil",
}

ROUTING = '''
import safetensors, safetensors.numpy, safetensors.torch
import ferry, ferry.numpy, ferry.torch

# Loading goes to ferry; saving (serialize, save_file, save_model...) stays with safetensors.
safetensors.safe_open = ferry.safe_open
safetensors._safe_open_handle = ferry._safe_open_handle
# safetensors.SafetensorError stays its own: ferry's derives from it, so the tests' checks for
# it hold for errors ferry raises.
assert issubclass(ferry.SafetensorError, safetensors.SafetensorError)
for module in (safetensors.torch, safetensors.numpy):
    module.safe_open = ferry.safe_open
safetensors.torch.load_file = ferry.torch.load_file
safetensors.torch.load = ferry.torch.load
safetensors.torch.load_model = ferry.torch.load_model
safetensors.numpy.load_file = ferry.numpy.load_file
safetensors.numpy.load = ferry.numpy.load


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line("safetensors loading routed to ferry " + ferry.__version__ + " at "
                                + ferry.__file__)
'''


def cache_dir() -> pathlib.Path:
    root = os.environ.get("FERRY_TEST_CACHE") or os.path.join(tempfile.gettempdir(), "ferry-test-cache")
    path = pathlib.Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def index_entry() -> dict:
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    return next(f for f in files if f["filename"] == SDIST)


def sdist() -> pathlib.Path:
    """The verified sdist: from the cache when its hash is right, else downloaded."""
    cached = cache_dir() / SDIST
    if cached.is_file() and hashlib.sha256(cached.read_bytes()).hexdigest() == SDIST_SHA256:
        return cached
    try:
        entry = index_entry()
        with urllib.request.urlopen(entry["url"], timeout=120) as response:
            data = response.read()
    except OSError as e:
        pytest.skip(f"PyPI is unreachable and {SDIST} is not cached in {cache_dir()}: {e}")
    digest = hashlib.sha256(data).hexdigest()
    assert entry["hashes"]["sha256"] == SDIST_SHA256, "the index lists another hash for " + SDIST
    assert digest == SDIST_SHA256, f"{SDIST} downloaded with sha256 {digest}, index says {SDIST_SHA256}"
    partial = cached.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(cached)
    return cached


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> pathlib.Path:
    """bindings/python of the sdist, holding tests/ and ferry's routing conftest.py."""
    root = tmp_path_factory.mktemp("safetensors_suite")
    prefix = "safetensors-0.8.0/bindings/python/tests/"
    with tarfile.open(sdist()) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        assert members, f"{SDIST} has no {prefix}"
        tar.extractall(root, members=members)
    base = root / "safetensors-0.8.0" / "bindings" / "python"
    (base / "tests" / "conftest.py").write_text(ROUTING)
    return base


def test_safetensors_loading_tests_pass_on_ferry(suite):
    package_root = pathlib.Path(ferry.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o",
            "addopts=", *(f"tests/{name}" for name in TEST_FILES),
            *(arg for test in sorted(DESELECTED) for arg in ("--deselect", f"tests/{test}"))]
    done = subprocess.run(args, cwd=suite, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert "safetensors loading routed to ferry" in output, output[-4000:]
    assert done.returncode == 0, output[-12000:]
    assert " passed" in output and " failed" not in output, output[-4000:]
