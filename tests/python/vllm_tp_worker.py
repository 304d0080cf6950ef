"""One rank of test_vllm_tp: vLLM's tensor-parallel group of `ranks` processes over gloo on the
CPU, each model built with TP through load_format "safetensors" and through "ferry" in every
tp_mode; prints one line "RESULT {json}" with, per model and mode, whether every parameter is
equal bit for bit, the bytes this rank read, the collectives it issued on vLLM's device group,
or the error raised.

    python vllm_tp_worker.py RANK RANKS PORT FOLDER [FOLDER...]
"""
import json
import sys

import vllm_helpers  # noqa: F401  (VLLM_TARGET_DEVICE=cpu)
import torch

MODES = ("process_group", "slices", "group_slices", "each_rank_reads_all", "auto")
# Each mode's model_loader_extra_config, and the defaults: no tp_mode, then with an engine option.
# The communicators: torch's named, vLLM's (none on the CPU), one that is not; auto (the default)
# takes vLLM's where it exists, so torch's here. auto_cold: auto after the checkpoint left the
# page cache (the group reads each byte once either way).
EVICT = "evict (the test's own key)"
CONFIGS = {**{mode: {"tp_mode": mode} for mode in MODES},
           "default": {}, "default_with_threads": {"threads": 2},
           "torch_communicator": {"tp_mode": "process_group", "tp_communicator": "torch"},
           "vllm_communicator": {"tp_mode": "process_group", "tp_communicator": "vllm"},
           "no_such_communicator": {"tp_mode": "process_group", "tp_communicator": "mpi"},
           # The checkpoint dropped from the page cache on this rank first (see evicted).
           "auto_cold": {"tp_mode": "auto", EVICT: True}}


def build(folder, load_format, extra=None, ranks=1):
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.utils.torch_utils import set_default_torch_dtype
    config = VllmConfig(model_config=ModelConfig(model=folder, dtype="bfloat16",
                                                 skip_tokenizer_init=True),
                        load_config=LoadConfig(load_format=load_format,
                                               model_loader_extra_config=extra or {}),
                        device_config=DeviceConfig("cpu"),
                        parallel_config=ParallelConfig(tensor_parallel_size=ranks))
    with set_current_vllm_config(config):
        loader = get_model_loader(config.load_config)
        with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
            model = loader.create_model(vllm_config=config, model_config=config.model_config)
        loader.load_weights(model, config.model_config)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return params, getattr(loader, "last_load", {})


def evicted(folder) -> float:
    """Drops the folder's checkpoint files from the page cache (clean pages: synced first);
    returns the fraction of their bytes still there after (near 1 where the file system keeps
    them, tmpfs)."""
    import glob
    import os

    import ferry
    total = cached = 0
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        size = os.path.getsize(path)
        total += size
        cached += ferry.page_cache_fraction(path) * size
    return cached / total


def watch_device_group():
    """A list the names of torch.distributed collectives issued on vLLM's tensor-parallel
    device group are appended to (with NCCL, the first makes torch start a communicator there,
    whose buffers stay on the GPU)."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state
    device_group = parallel_state.get_tp_group().device_group
    calls = []
    for name in ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                 "reduce_scatter_tensor", "all_to_all_single", "barrier", "gather", "scatter"):
        original = getattr(dist, name)

        def watched(*args, _original=original, _name=name, **kwargs):
            if kwargs.get("group") is device_group or any(a is device_group for a in args):
                calls.append(_name)
            return _original(*args, **kwargs)
        setattr(dist, name, watched)
    return calls


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and
        torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a)


def main() -> None:
    rank, ranks, port = (int(x) for x in sys.argv[1:4])
    import logging
    vllm_log = logging.getLogger("vllm")  # as vLLM's engine configures it
    vllm_log.addHandler(logging.StreamHandler(sys.stdout))
    vllm_log.setLevel(logging.INFO)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(ranks, rank, f"tcp://127.0.0.1:{port}", rank,
                                                    "gloo")
        parallel_state.initialize_model_parallel(ranks, 1)
    import ferry.vllm
    ferry.vllm.register()
    device_group_calls = watch_device_group()
    out = {}
    for folder in sys.argv[4:]:
        reference, _ = build(folder, "safetensors", ranks=ranks)
        shards = {n: list(p.shape) for n, p in reference.items()}
        rows = {"shapes": shards}
        for mode, extra in CONFIGS.items():
            try:
                device_group_calls.clear()
                left = evicted(folder) if extra.get(EVICT) else None
                extra = {k: v for k, v in extra.items() if k != EVICT}
                params, last = build(folder, "ferry", {**extra, "group_bytes": 32 << 10},
                                     ranks)
                rows[mode] = {"equal": same(params, reference), "bytes_read": last["bytes_read"],
                              "tp_mode": last["tp_mode"],
                              "tp_communicator": last.get("tp_communicator"),
                              "slices_bytes_read": last.get("slices_bytes_read"),
                              "device_group_calls": list(device_group_calls),
                              "cached_after_eviction": left,
                              "settings_source": last.get("settings_source")}
            except Exception as e:  # noqa: BLE001 - reported to the test
                rows[mode] = {"error": f"{type(e).__name__}: {e}"}
        out[folder] = rows
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
