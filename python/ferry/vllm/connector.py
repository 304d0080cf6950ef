"""FerryOffloadingConnector: vLLM's OffloadingConnector whose failed loads become load errors
(get_block_ids_with_load_errors), which vLLM recomputes under kv_load_failure_policy
"recompute", instead of failed jobs, which vLLM's connector does not accept."""
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector


class FerryOffloadingConnector(OffloadingConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.connector_worker is not None:
            self.connector_worker.spec.reports_load_errors = True

    def get_block_ids_with_load_errors(self) -> set:
        worker = self.connector_worker.worker if self.connector_worker is not None else None
        take = getattr(worker, "take_load_errors", None)
        return take() if take is not None else set()
