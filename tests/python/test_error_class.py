"""ferry.SafetensorError where code written for safetensors catches safetensors' own error: with
safetensors installed, ferry's class derives from it (and from ValueError); without it, from
ValueError alone."""
import os
import pathlib
import subprocess
import sys

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
import safetensors

import ferry


def test_ferrys_error_is_safetensors_error_and_a_value_error(tmp_path):
    assert issubclass(ferry.SafetensorError, safetensors.SafetensorError)
    assert issubclass(ferry.SafetensorError, ValueError)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\0\0")
    with pytest.raises(safetensors.SafetensorError, match="too short"):
        ferry.safe_open(str(bad), framework="pt")


def test_without_safetensors_it_is_a_value_error():
    package_root = pathlib.Path(ferry.__file__).resolve().parents[1]
    code = ("import sys; sys.modules['safetensors'] = None\n"
            "import ferry\n"
            "assert ferry.SafetensorError.__mro__[1] is ValueError, ferry.SafetensorError.__mro__\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
