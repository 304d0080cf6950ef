"""ferry.gguf against the gguf package's own reader: tensors, types and metadata."""
import os

import numpy as np
import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
gguf = pytest.importorskip("gguf")
import torch  # noqa: E402

import ferry.gguf  # noqa: E402


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 500000.0)
    writer.add_string("general.name", "ferry-test")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    rng = np.random.default_rng(3)
    writer.add_tensor("f32", rng.standard_normal((4, 8)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((3, 64)).astype(np.float16))
    q8 = rng.integers(0, 256, size=(2, 2 * 34), dtype=np.uint8)  # 2 rows of 64 Q8_0 values
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_tensors_types_and_metadata_equal_the_gguf_reader(model):
    reader = gguf.GGUFReader(str(model))
    ours = ferry.gguf.load_file(model)
    types = ferry.gguf.tensor_types(model)
    for t in reader.tensors:
        mine = ours[t.name]
        assert mine.contiguous().view(-1).view(torch.uint8).numpy().tobytes() == np.asarray(t.data).tobytes(), t.name
        assert types[t.name] == (t.tensor_type.name, [int(d) for d in t.shape])
    assert ours["f32"].dtype == torch.float32 and list(ours["f32"].shape) == [4, 8]
    assert ours["q8"].dtype == torch.uint8 and list(ours["q8"].shape) == [2, 68]
    meta = ferry.gguf.metadata(model)
    assert meta["llama.block_count"] == {"type": "UINT32", "value": 2}
    assert meta["general.name"]["value"] == "ferry-test"
    assert meta["tokenizer.ggml.tokens"]["value"] == ["a", "b", "c"]
    arrays = ferry.gguf.load_numpy(model)
    assert arrays["f16"].dtype == np.float16 and arrays["f16"].tobytes() == ours["f16"].numpy().tobytes()


def test_a_safetensors_file_is_not_gguf(tmp_path):
    from conftest import write_safetensors

    path = write_safetensors(tmp_path / "x.safetensors", {"a": ("uint8", [4])})
    with pytest.raises(ValueError, match="not a GGUF file"):
        ferry.gguf.load_file(path)
