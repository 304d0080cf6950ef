"""The one place that knows which vLLM is installed: 0.33's interfaces (TransferJob with
chunk_ids, LookupResult, CanonicalKVCaches, OffloadKey bytes, the expedited flag, backpressure
detectors) and 0.26's where they differ (JobMetadata, no backpressure detector). Everything else in
ferry.vllm imports vLLM's names from here."""
import inspect
import logging

import vllm
from vllm.model_executor.model_loader import register_model_loader as _register_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader  # noqa: F401

VERSION = vllm.__version__


# Under vLLM's "vllm" logger, which vLLM configures (in 0.33 only once its engine starts): ferry's
# INFO lines then go where vLLM's go, in its format, and follow its level. ferry.vllm's modules
# log through children of this one.
logger = logging.getLogger("vllm.ferry")

try:  # 0.33
    from vllm.model_executor.model_loader.weight_utils import enable_tqdm
except ImportError:  # pragma: no cover - older releases
    def enable_tqdm(use_tqdm_on_load: bool) -> bool:
        import torch.distributed as dist
        return use_tqdm_on_load and (not dist.is_initialized() or dist.get_rank() == 0)

from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf  # noqa: E402

# KV offloading: a vLLM without these interfaces still gets the load format.
try:
    from vllm.v1.kv_offload.base import (  # noqa: F401
        GPULoadStoreSpec, LoadStoreSpec, LookupResult, OffloadingManager, OffloadingSpec,
        PrepareStoreOutput, TransferResult)
    HAS_OFFLOADING = True
except ImportError as e:  # pragma: no cover - depends on the vLLM release
    HAS_OFFLOADING, OFFLOADING_MISSING = False, str(e)
    GPULoadStoreSpec = LoadStoreSpec = LookupResult = OffloadingManager = None
    OffloadingSpec = PrepareStoreOutput = TransferResult = None

try:
    from vllm.v1.kv_offload.base import OffloadingWorker  # 0.33
except ImportError:  # pragma: no cover
    OffloadingWorker = None

try:
    from vllm.v1.kv_offload.base import RequestOffloadingContext  # 0.33
except ImportError:  # pragma: no cover
    RequestOffloadingContext = None

try:
    from vllm.v1.kv_offload.tiering import base as _tiering
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    HAS_TIERING = HAS_OFFLOADING
except ImportError:  # pragma: no cover
    _tiering, SecondaryTierFactory, HAS_TIERING = None, None, False

if HAS_TIERING:
    SecondaryTierManager = _tiering.SecondaryTierManager
    JobResult = _tiering.JobResult
    # 0.33: TransferJob; 0.26: JobMetadata (the same role).
    TransferJob = getattr(_tiering, "TransferJob", None) or getattr(_tiering, "JobMetadata")
    TIER_TAKES_BACKPRESSURE = "backpressure_detector" in inspect.signature(
        SecondaryTierManager.__init__).parameters
else:  # pragma: no cover
    SecondaryTierManager = object
    JobResult = TransferJob = None
    TIER_TAKES_BACKPRESSURE = False


def job_result(job_id, success, successful_keys=None, transfer_bytes=None):
    """A tier's JobResult: 0.33 takes the keys of a partial promotion and the bytes moved; 0.26
    takes neither (a partial promotion then fails whole, and vLLM recomputes every key)."""
    import dataclasses
    fields = {f.name for f in dataclasses.fields(JobResult)}
    extra = {}
    if "successful_keys" in fields and successful_keys is not None:
        extra["successful_keys"] = successful_keys
    if "transfer_bytes" in fields and transfer_bytes is not None:
        extra["transfer_bytes"] = transfer_bytes
    return JobResult(job_id=job_id, success=success, **extra)


def job_chunk_ids(job):
    """The primary tier's slots of a tier job (0.33: chunk_ids; earlier: block_ids)."""
    ids = getattr(job, "chunk_ids", None)
    if ids is None:
        ids = getattr(job, "block_ids")
    return [int(i) for i in ids]


def tier_base_init(tier, offloading_spec, primary_kv_view, tier_type, backpressure_detector):
    if TIER_TAKES_BACKPRESSURE:
        SecondaryTierManager.__init__(tier, offloading_spec, primary_kv_view, tier_type,
                                      backpressure_detector)
    else:  # pragma: no cover - 0.26
        if backpressure_detector is not None:
            raise ValueError("this vLLM has no backpressure detectors for secondary tiers")
        SecondaryTierManager.__init__(tier, offloading_spec, primary_kv_view, tier_type)


def ranks_on_machine(parallel_config) -> int:
    """The ranks that load at once on this machine: the instance's local world (tensor x
    pipeline parallel ranks per node; 0.33's local_world_size, else world_size / nnodes) times
    its data-parallel replicas on this node."""
    local = getattr(parallel_config, "local_world_size", None)
    if local is None:
        local = parallel_config.world_size // max(1, getattr(parallel_config, "nnodes", 1) or 1)
    replicas = getattr(parallel_config, "data_parallel_size_local", 1) or 1
    return max(1, int(local) * int(replicas))


def register_model_loader(name: str, cls) -> None:
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER as table
    if table.get(name) is not cls:
        _register_loader(name)(cls)


def _registered(factory, name: str) -> bool:
    return name in getattr(factory, "_registry", {})


def register_tier(name: str, module: str, cls: str) -> None:
    if not HAS_TIERING:
        logger.info("vLLM %s has no secondary KV tiers; the ferry tier is not registered",
                    VERSION)
    elif not _registered(SecondaryTierFactory, name):
        SecondaryTierFactory.register_tier(name, module, cls)


def register_spec(name: str, module: str, cls: str) -> None:
    if not (HAS_OFFLOADING and OffloadingWorker is not None):
        logger.info("vLLM %s lacks the offloading interfaces %s needs; not registered",
                    VERSION, name)
        return
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    if not _registered(OffloadingSpecFactory, name):
        OffloadingSpecFactory.register_spec(name, module, cls)


def register_connector(name: str, module: str, cls: str) -> None:
    if not (HAS_OFFLOADING and OffloadingWorker is not None):
        return
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    if not _registered(KVConnectorFactory, name):
        KVConnectorFactory.register_connector(name, module, cls)
