"""The loaders the benchmark compares, as a user of each would call it to get every tensor of a
checkpoint onto one GPU. Each takes (checkpoint, device) and returns (tensors, path): the loaded
tensors, kept alive until the clock stops, and the data path it took, in words.

Peers are imported inside their loader, so a missing one fails only its own rows.
"""
import json
import os
import struct

from common import shard_files  # noqa: F401  (loaders.shard_files for the scripts that import it)


def cufile_mode():
    """cuFile runs real GPUDirect Storage only with the nvidia-fs driver; otherwise it runs in
    compatibility mode (POSIX reads inside cuFile)."""
    return "cufile-gds" if os.path.exists("/proc/driver/nvidia-fs") else "cufile-compat (no nvidia-fs)"


def ferry_torch(path, device):
    import ferry.torch
    tensors, stats = ferry.torch.load_with_stats(path, device=device)
    return tensors, "ferry " + ",".join(sorted({f["io_path"] for f in stats["files"]}))


def safetensors_load_file(path, device):
    from safetensors.torch import load_file
    out = {}
    for f in shard_files(path):
        out.update(load_file(f, device=device))
    return out, "mmap"


def safetensors_safe_open(path, device):
    from safetensors import safe_open
    out = {}
    for f in shard_files(path):
        with safe_open(f, framework="pt", device=device) as handle:
            for name in handle.keys():
                out[name] = handle.get_tensor(name)
    return out, "mmap, one tensor at a time"


def _fastsafetensors(path, device, nogds):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), device, nogds=nogds)
    # The copier that really runs: asked for GDS without nvidia-fs, fastsafetensors falls back.
    ran = getattr(getattr(loader, "copier_class", None), "__name__", "unknown copier")
    try:
        loader.add_filenames({0: shard_files(path)})
        buffers = loader.copy_files_to_device()
        out = {name: buffers.get_tensor(name) for name in buffers.key_to_rank_lidx}
        buffers.close()
    finally:
        loader.close()
    return out, f"{'nogds' if nogds else 'gds'} asked, {ran} ran"


def fastsafetensors_nogds(path, device):
    return _fastsafetensors(path, device, nogds=True)


def fastsafetensors_gds(path, device):
    return _fastsafetensors(path, device, nogds=False)


def runai_model_streamer(path, device):
    from runai_model_streamer import SafetensorsStreamer
    out = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(shard_files(path))
        for name, tensor in streamer.get_tensors():
            out[name] = tensor.to(device)
    return out, "streamer threads into host memory, then .to(device)"


def _safetensors_layout(file):
    """(name, dtype, shape, absolute offset, bytes) of each tensor of a safetensors file."""
    with open(file, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    for name, info in header.items():
        begin, end = info["data_offsets"]
        yield name, info["dtype"], info["shape"], 8 + length + begin, end - begin


_TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                 "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64",
                 "BOOL": "bool"}


def torch_cuda_gds(path, device):
    """torch.cuda.gds.GdsFile.load_storage per tensor, into tensors allocated by torch."""
    import torch
    from torch.cuda.gds import GdsFile
    out = {}
    for file in shard_files(path):
        handle = GdsFile(file, os.O_RDONLY | os.O_DIRECT)
        for name, dtype, shape, offset, size in _safetensors_layout(file):
            raw = torch.empty(size, dtype=torch.uint8, device=device)
            handle.load_storage(raw.untyped_storage(), offset)
            out[name] = raw.view(getattr(torch, _TORCH_DTYPES[dtype])).view(shape)
        del handle
    return out, cufile_mode()


LOADERS = {
    "ferry.torch": ferry_torch,
    "safetensors load_file": safetensors_load_file,
    "safetensors safe_open": safetensors_safe_open,
    "fastsafetensors nogds": fastsafetensors_nogds,
    "fastsafetensors gds": fastsafetensors_gds,
    "runai-model-streamer": runai_model_streamer,
    "torch.cuda.gds": torch_cuda_gds,
}
