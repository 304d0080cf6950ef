"""What the test_vllm_* tests share: vLLM's offloading config for a small KV cache, and vLLM's
own model classes built on the CPU through a given load format."""
import os

import numpy as np

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _as_on_a_cpu_without_amx() -> None:
    """PyPI's vLLM wheel has no CPU kernels (vllm._C). On a CPU with AMX (Sapphire Rapids and
    later) vLLM's post-processing of loaded weights packs small GEMMs' weights with one of them
    (convert_weight_packed) and fails; elsewhere it keeps them as loaded. These tests compare
    the weights the loaders leave, so vLLM runs here as on a CPU without AMX, whatever this
    machine has."""
    import torch
    torch.cpu._is_amx_tile_supported = lambda: False


_as_on_a_cpu_without_amx()


def offloading_config(extra, page_bytes, layers=2, engine_id="ferry-test", rank=0, world=1):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingGroupConfig, OffloadingModelConfig,
                                           OffloadingParallelConfig)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=tuple(
            f"model.layers.{i}.self_attn.attn" for i in range(layers)), group_id=0),),
        worker_kv_bytes_per_block=page_bytes * layers, enable_kv_cache_events=False,
        extra_config=extra, engine_id=engine_id,
        model=OffloadingModelConfig(name="test-model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=world, tp_size=world, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False))


def offload_key(i: int, group: int = 0) -> bytes:
    from vllm.v1.kv_offload.base import make_offload_key
    return make_offload_key(i.to_bytes(8, "little") * 4, group)


def chunk_rows(view) -> np.ndarray:
    """The primary tier's memoryview as (num_chunks, chunk bytes) uint8."""
    arr = np.asarray(view)
    return arr.view(np.uint8).reshape(arr.shape[0], -1)
