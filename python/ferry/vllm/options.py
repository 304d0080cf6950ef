"""ferry's options as vLLM takes them (model_loader_extra_config; the KV tier's and the spec's
config keys): every key checked, an unknown one refused with the list of those known."""
from typing import Any, Dict, Mapping

# Engine options of ferry.torch's loaders (see ferry.torch.load_with_stats).
LOADER_OPTIONS = {
    "threads": int, "slots": int, "copy_streams": int, "staging_bytes": (int, str),
    "chunk_bytes": (int, str), "page_cache_pin": (int, str), "io": str, "backend": str,
    "allow_compat": bool, "cache_device_memory": bool,
    # how much the loader reads ahead of model.load_weights (bytes; group_slices: what a rank holds)
    "group_bytes": int,
    "tp_mode": str,  # auto (default), process_group, slices, group_slices, each_rank_reads_all
    "tp_communicator": str,  # auto (default), vllm or torch: what process_group's exchanges run on
}

# ferry.KVStore's options (the KV tier and spec add root and capacity_bytes).
STORE_OPTIONS = {
    "gpu_path": str, "allow_compat": bool, "slab_count": int, "checkpoint_every": int,
    "page_cache_pin": (int, str),
    "fleet_writers": int,  # engines sharing one root: each writer its share (docs/kv_fleet.md)
}


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def check(config: Mapping[str, Any], known: Dict[str, Any], what: str) -> Dict[str, Any]:
    """`config` with every key known and of its type; else ValueError naming the key."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{what} must be a dict, not {type(config).__name__}")
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; ferry takes {sorted(known)}")
    out = {}
    for key, value in config.items():
        kind = known[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        else:
            ok = isinstance(value, kinds)
        if not ok and int in kinds and isinstance(value, float) and value.is_integer():
            value, ok = int(value), True  # JSON on the command line: 1e12
        if not ok:
            raise ValueError(f"{what}: {key} must be {_type_name(kind)}, not {value!r}")
        if kinds == (int,) and value <= 0:
            raise ValueError(f"{what}: {key} must be positive, not {value}")
        out[key] = value
    return out


def capacity(value: Any, what: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what}: capacity_bytes must be a positive number of bytes, not "
                         f"{value!r}")
    return value
