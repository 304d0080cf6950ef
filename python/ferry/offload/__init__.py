"""Weight offloading for PyTorch models (ferry.torch re-exports the public names):

- layers (_layers.py, with _ops.py and _order.py): offload() streams some of a model's repeated
  blocks into static GPU slots just before they run;
- experts (_experts.py): offload_experts() keeps a few experts of each MoE block in a GPU cache;
- plan (_plan.py): plan_offload() simulates a setting before it runs;
- _shared.py: the device, slot memory, the host arena and checkpoint entries they share."""
from ._experts import ExpertOffload, find_fused_experts, find_moe_blocks, offload_experts
from ._layers import Offload, choose_layers, find_blocks, offload
from ._plan import plan_offload

__all__ = ["ExpertOffload", "Offload", "choose_layers", "find_blocks", "find_fused_experts",
           "find_moe_blocks", "offload", "offload_experts", "plan_offload"]
