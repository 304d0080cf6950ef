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
logger = logging.getLogger("ferry.vllm")

try:  # 0.33
    from vllm.model_executor.model_loader.weight_utils import enable_tqdm
except ImportError:  # pragma: no cover - older releases
    def enable_tqdm(use_tqdm_on_load: bool) -> bool:
        import torch.distributed as dist
        return use_tqdm_on_load and (not dist.is_initialized() or dist.get_rank() == 0)

from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf  # noqa: E402

# KV offloading: present from 0.2x on; the tiering layer came later than the spec API.
from vllm.v1.kv_offload.base import (  # noqa: E402,F401
    GPULoadStoreSpec, LoadStoreSpec, LookupResult, OffloadingManager, OffloadingSpec,
    PrepareStoreOutput, TransferResult)

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
    HAS_TIERING = True
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


def register_model_loader(name: str, cls) -> None:
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER as table
    if table.get(name) is not cls:
        _register_loader(name)(cls)


def _registered(factory, name: str) -> bool:
    return name in getattr(factory, "_registry", {})


def register_tier(name: str, module: str, cls: str) -> None:
    if HAS_TIERING and not _registered(SecondaryTierFactory, name):
        SecondaryTierFactory.register_tier(name, module, cls)


def register_spec(name: str, module: str, cls: str) -> None:
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    if not _registered(OffloadingSpecFactory, name):
        OffloadingSpecFactory.register_spec(name, module, cls)


def register_connector(name: str, module: str, cls: str) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    if not _registered(KVConnectorFactory, name):
        KVConnectorFactory.register_connector(name, module, cls)
