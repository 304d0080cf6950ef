"""ferry: load checkpoints into GPU or host memory at the speed of the hardware.

A drop-in for safetensors' loading API, with the same signatures and semantics:

    ferry.safe_open(path, framework="pt", device=..., backend=...) -> keys(), offset_keys(),
        metadata(), get_tensor(), get_slice(), get_tensors()
    ferry.torch.load_file(path, device="cuda:0"), ferry.torch.load(bytes),
        ferry.torch.load_model(model, path)
    ferry.numpy.load_file(path), ferry.numpy.load(bytes)
    ferry.SafetensorError (a ValueError) for malformed files and closed handles

    ferry.KVStore(root, model=..., dtype=..., capacity_bytes=..., block_bytes=...): the KV
        block store (put/get/lookup, sync and async; see ferry.kv; in vLLM: ferry.vllm)

Wherever a filename is taken, a shard directory or an index works too. Tensors from load_file
are views of the memory ferry loaded into (no copies); that memory is freed when the last tensor
that refers to it is gone.
"""
from ._ferry import (Checkpoint, KVFormatError, Loaded, LoadPreparation, SafetensorError,
                     __version__, cuda_available, page_cache_fraction, prepare_load,
                     release_cached_device_memory, release_page_cache_registrations,
                     release_staging_memory)
from ._open import _safe_open_handle, safe_open
from .kv import KVPages, KVResult, KVStore, KVTicket, kv_key

__all__ = ["Checkpoint", "KVFormatError", "KVPages", "KVResult", "KVStore", "KVTicket", "Loaded",
           "LoadPreparation", "SafetensorError", "cuda_available", "kv_key", "page_cache_fraction",
           "prepare_load",
           "release_cached_device_memory",
           "release_page_cache_registrations",
           "release_staging_memory", "safe_open"]
