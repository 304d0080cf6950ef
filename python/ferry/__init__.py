"""ferry: load checkpoints into GPU or host memory at the speed of the hardware.

Tensors are views of the memory ferry loaded into (no copies); that memory is freed when the last
tensor that refers to it is gone. Drop-in shapes of the safetensors API:

    ferry.torch.load_file(path, device="cuda:0")     -> dict[str, torch.Tensor]
    ferry.safe_open(path, framework="pt", device=...) -> keys(), metadata(), get_tensor(), get_slice()
    ferry.numpy.load_file(path)                       -> dict[str, numpy.ndarray]
"""
from ._ferry import Checkpoint, Loaded, __version__, cuda_available, release_staging_memory
from ._open import safe_open

__all__ = ["Checkpoint", "Loaded", "cuda_available", "release_staging_memory", "safe_open"]
