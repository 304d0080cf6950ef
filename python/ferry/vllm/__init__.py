"""ferry as a vLLM plugin (entry point `vllm.general_plugins` -> ferry.vllm:register).

    vllm serve MODEL --load-format ferry [--model-loader-extra-config '{"threads": 16}']
    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 8589934592,
            "secondary_tiers": [{"type": "ferry", "root": "/nvme/kv", "capacity_bytes": 1e12}]}}'
    --kv-transfer-config '{"kv_connector": "FerryOffloadingConnector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"spec_name": "FerryOffloadingSpec", "root": "/nvme/kv",
                                      "capacity_bytes": 1e12}}'

register() runs in every vLLM process and may run more than once: it registers the load format
"ferry", the secondary KV tier "ferry", the offloading spec "FerryOffloadingSpec" and the KV
connector "FerryOffloadingConnector" (the spec's route with failed loads recomputed). See
docs/vllm.md.
"""
from ._compat import VERSION

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    from . import _compat
    from .loader import FerryModelLoader

    _compat.register_model_loader("ferry", FerryModelLoader)
    _compat.register_tier("ferry", "ferry.vllm.tier", "FerryTierManager")
    _compat.register_spec("FerryOffloadingSpec", "ferry.vllm.spec", "FerryOffloadingSpec")
    _compat.register_connector("FerryOffloadingConnector", "ferry.vllm.connector",
                               "FerryOffloadingConnector")
    _registered = True


__all__ = ["register", "VERSION"]
