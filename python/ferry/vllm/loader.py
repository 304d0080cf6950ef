"""Load format "ferry": vLLM's model filled from safetensors files read by ferry's engine.

Every tensor is read by ferry straight into the memory of the device the model was built on
(pinned staging and asynchronous copies, or cuFile, as ferry.torch chooses), in groups of
about `group_bytes`, the next group loading while vLLM's `model.load_weights` consumes this one
(its weight loaders do the slicing for tensor parallelism, the fusing of q/k/v and gate/up, ...).
With tensor parallelism the ranks read each byte once between them and share it over vLLM's
process group (each rank receiving only its slices, checked; with "auto", the default: loaded
again whole where vLLM shards otherwise; or whole tensors), or each reads only its slices, or
each reads everything (`tp_mode`, see tp.py).
Never a silent fallback: a file ferry cannot read is an error.
"""
import glob
import logging
import os
import time
from typing import Iterator, List, Optional, Tuple

import torch
from tqdm.auto import tqdm

from ._compat import BaseModelLoader, download_weights_from_hf, enable_tqdm, ranks_on_machine
from .options import LOADER_OPTIONS, check
from .tp import (TP_COMMUNICATORS, TP_MODES, any_rank, check_slices_taken, choose_mode,
                 group_collectives, group_slice_weights, group_weights, slice_weights,
                 slices_not_taken, tp_group)

logger = logging.getLogger("vllm.ferry.loader")  # see _compat.logger

_INDEX = "model.safetensors.index.json"
_BAR = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}]\n"
_DEFAULT_GROUP_BYTES = 1 << 30
# group_slices: what a rank holds of a group by default. One round a group, read before the
# ranks agree: a rank that joins first reads its whole share while the others still build their
# models (an 8B model at TP 4 is one group).
_DEFAULT_RANK_GROUP_BYTES = 4 << 30
# The loader's options that shape a load's set-up (LOADER_OPTIONS has them all).
_PREPARE_OPTIONS = ("threads", "chunk_bytes", "slots", "staging_bytes", "copy_streams",
                    "page_cache_pin")


def checkpoint_path(folder: str) -> str:
    """The index, the one safetensors file, or the folder of shards ferry opens."""
    if os.path.isfile(folder):
        if folder.endswith(".gguf"):
            raise ValueError(f"{folder}: a GGUF file; this vLLM has no GGUF load format, and "
                             "load format ferry reads safetensors checkpoints")
        return folder
    index = os.path.join(folder, _INDEX)
    if os.path.isfile(index):
        return index
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if len(files) == 1:
        return files[0]
    if files:
        return folder
    if glob.glob(os.path.join(folder, "*.gguf")):
        raise ValueError(f"{folder}: holds GGUF files only; this vLLM has no GGUF load format, "
                         "and load format ferry reads safetensors checkpoints")
    raise RuntimeError(f"{folder}: no *.safetensors files (load format ferry reads "
                       "safetensors checkpoints; convert .bin/.pt ones first)")


class FerryModelLoader(BaseModelLoader):
    """vLLM's BaseModelLoader over ferry (registered as load format "ferry")."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.options = check(load_config.model_loader_extra_config or {}, LOADER_OPTIONS,
                             "model_loader_extra_config for load format ferry")
        self.group_bytes = self.options.pop("group_bytes", None)  # None: each mode's default
        self.tp_mode = self.options.pop("tp_mode", None)
        if self.tp_mode is not None and self.tp_mode not in TP_MODES:
            raise ValueError(f"model_loader_extra_config for load format ferry: tp_mode "
                             f"{self.tp_mode!r} is not one of {list(TP_MODES)}")
        self.tp_communicator = self.options.pop("tp_communicator", "auto")
        if self.tp_communicator not in TP_COMMUNICATORS:
            raise ValueError(f"model_loader_extra_config for load format ferry: tp_communicator "
                             f"{self.tp_communicator!r} is not one of {list(TP_COMMUNICATORS)}")
        if self.tp_mode is None:
            self.tp_mode = "auto"  # group_slices where they fit (docs/vllm.md)
        if self.tp_mode == "slices" and self.options:
            raise ValueError("model_loader_extra_config for load format ferry: tp_mode "
                             f"\"{self.tp_mode}\" reads slices with ferry's tensor reader, which "
                             f"takes none of {sorted(self.options)}")
        # What the last load did on this rank: its tp_mode and the file bytes it read.
        self.last_load = {}
        # The ranks loading on this machine at once (set by load_model; None: LOCAL_WORLD_SIZE).
        self.ranks_on_machine = None

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        """vLLM's load_model, with ferry's first-load set-up (pinned staging, reader threads,
        copy streams) made on a thread of its own while vLLM builds the model."""
        self.ranks_on_machine = ranks_on_machine(vllm_config.parallel_config)
        preparation = self._prepare(vllm_config, model_config)
        try:
            return super().load_model(vllm_config, model_config, prefix)
        finally:
            if preparation is not None:
                try:
                    report = preparation.wait()
                    logger.debug("ferry: load set-up made ahead: %s", report)
                except Exception as e:  # the load itself met and reported the same cause
                    logger.warning("ferry: the load's set-up made ahead failed: %s", e)

    def _prepare(self, vllm_config, model_config):
        device = self.load_config.device or vllm_config.device_config.device
        device = torch.device(device)
        if device.type != "cuda":
            return None
        import ferry.torch
        index = device.index if device.index is not None else torch.cuda.current_device()
        options = {k: v for k, v in self.options.items() if k in _PREPARE_OPTIONS}
        # With page_cache_pin, the checkpoint's files are registered meanwhile too (a model not
        # yet downloaded is not: the load registers what it reads).
        folder = model_config.model
        path = (checkpoint_path(folder) if "page_cache_pin" in options and os.path.isdir(folder)
                else None)
        return ferry.torch.prepare(f"cuda:{index}", path, **options)

    def _folder(self, model_config) -> str:
        model = model_config.model
        if os.path.exists(model):
            return model
        return download_weights_from_hf(model, self.load_config.download_dir,
                                        ["*.safetensors"], model_config.revision,
                                        ignore_patterns=self.load_config.ignore_patterns)

    def download_model(self, model_config) -> None:
        checkpoint_path(self._folder(model_config))

    def get_all_weights(self, model_config, model: torch.nn.Module,
                        device: Optional[str] = None,
                        tp_mode: Optional[str] = None) -> Iterator[Tuple[str, torch.Tensor]]:
        """(name, tensor) for every tensor of the checkpoint, read by ferry onto `device`
        (`tp_mode`: this load's mode instead of the configured one)."""
        import ferry.torch
        if getattr(model, "secondary_weights", ()):
            raise NotImplementedError(f"{type(model).__name__} takes weights from secondary "
                                      "sources, which load format ferry does not read")
        path = checkpoint_path(self._folder(model_config))
        if device is None:
            device = _model_device(model)
        checkpoint = ferry.Checkpoint.open(path)
        names = checkpoint.names()
        rank, ranks = tp_group()
        requested = tp_mode or self.tp_mode
        mode = choose_mode(requested, ranks, model_config.quantization is not None)
        self.last_load = {"tp_mode": mode, "rank": rank, "ranks": ranks, "bytes_read": 0}
        if mode in ("slices", "group_slices") and model_config.quantization is not None:
            raise ValueError(f"load format ferry: tp_mode \"{mode}\" reads unquantized "
                             f"checkpoints; this model is {model_config.quantization} (use "
                             "tp_mode \"process_group\")")
        if mode in ("process_group", "group_slices"):
            collectives, self.last_load["tp_communicator"] = group_collectives(
                self.tp_communicator, device)
        group_bytes = self.group_bytes or (_DEFAULT_RANK_GROUP_BYTES if mode == "group_slices"
                                           else _DEFAULT_GROUP_BYTES)
        if mode == "process_group":
            weights = group_weights(path, device, collectives,
                                    ferry.torch._groups(checkpoint, group_bytes),
                                    self.last_load, ranks_on_machine=self.ranks_on_machine,
                                    **self.options)
        elif mode == "group_slices":
            # A rank holds about 1 / ranks of a group: groups of ranks x group_bytes hold about
            # group_bytes each, in one round each, whose reads a rank starts before the others
            # have joined.
            weights = group_slice_weights(path, device, rank, ranks, collectives,
                                          ferry.torch._groups(checkpoint, group_bytes * ranks),
                                          self.last_load, round_bytes=group_bytes,
                                          ranks_on_machine=self.ranks_on_machine,
                                          **self.options)
        elif mode == "slices":
            weights = slice_weights(path, device, rank, ranks,
                                    ferry.torch._groups(checkpoint, group_bytes),
                                    self.last_load)
        else:
            self.last_load["bytes_read"] = checkpoint.total_bytes
            weights = ferry.torch.iterate_weights(path, device, group_bytes=group_bytes,
                                                  **self.options)
        bar = tqdm(weights, total=len(names), desc="Loading safetensors checkpoint (ferry)",
                   disable=not enable_tqdm(self.load_config.use_tqdm_on_load), bar_format=_BAR)
        yield from bar

    def load_weights(self, model: torch.nn.Module, model_config) -> None:
        started = time.perf_counter()
        loaded = model.load_weights(self.get_all_weights(model_config, model))
        if self.last_load.get("tp_mode") in ("slices", "group_slices"):
            if self.tp_mode == "auto":
                loaded = self._reload_unless_slices_fit(model, model_config, loaded)
            else:
                check_slices_taken(model, self.last_load["tp_mode"])
        logger.info("Loading weights took %.2f seconds (ferry)", time.perf_counter() - started)
        if self.last_load.get("ranks", 1) > 1:
            over = self.last_load.get("tp_communicator")
            threads = self.last_load.get("reader_threads")
            logger.info("ferry: tp_mode %s, rank %d of %d read %d bytes%s%s",
                        self.last_load["tp_mode"], self.last_load["rank"],
                        self.last_load["ranks"], self.last_load["bytes_read"],
                        f" (collectives on {over}'s communicator)" if over else "",
                        f" with {threads} reader threads a round "
                        f"({self.last_load.get('settings_source')})" if threads else "")
        if loaded is not None and model_config.quantization is None:
            missing = {name for name, _ in model.named_parameters()} - set(loaded)
            if missing:
                raise ValueError("Following weights were not initialized from checkpoint: "
                                 f"{sorted(missing)}")

    def _reload_unless_slices_fit(self, model: torch.nn.Module, model_config, loaded):
        """tp_mode "auto" after its group_slices load: where vLLM took elements a rank did not
        get, on any rank, every rank loads again through process_group (every parameter)."""
        bad = slices_not_taken(model)
        if not any_rank(bool(bad)):
            return loaded
        first = self.last_load
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        logger.warning("ferry: tp_mode auto: vLLM shards this model otherwise than ferry's "
                       "slices (%s); loading again with tp_mode process_group",
                       shown or "on another rank")
        loaded = model.load_weights(self.get_all_weights(model_config, model,
                                                         tp_mode="process_group"))
        self.last_load["slices_bytes_read"] = first["bytes_read"]
        return loaded


def _model_device(model: torch.nn.Module) -> str:
    devices: List[torch.device] = sorted({p.device for p in model.parameters()}, key=str)
    if not devices:
        return "cpu"
    if len(devices) > 1:
        raise ValueError(f"the model's parameters are on {[str(d) for d in devices]}; load "
                         "format ferry loads onto one device per process")
    device = devices[0]
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)
