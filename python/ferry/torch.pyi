import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

import torch

from ._ferry import SafetensorError as SafetensorError
from ._open import safe_open as safe_open

PathLike = Union[str, os.PathLike]

def load_file(filename: PathLike, device: Union[str, int] = "cpu", *, backend: str = "mmap") -> Dict[str, torch.Tensor]: ...
def load(data: bytes) -> Dict[str, torch.Tensor]: ...
def load_model(model: torch.nn.Module, filename: PathLike, strict: bool = True,
               device: Union[str, int] = "cpu", *, backend: str = "mmap") -> Tuple[Set[str], List[str]]: ...
def load_with_stats(path: PathLike, device: Any = "cpu", names: Optional[Iterable[str]] = None,
                    progress: Optional[Callable[[int, int], None]] = None,
                    **engine: Any) -> Tuple[Dict[str, torch.Tensor], dict]: ...
def iterate_weights(paths: Union[PathLike, Iterable[PathLike]], device: Any = "cpu",
                    group_bytes: int = ..., **engine: Any) -> Iterator[Tuple[str, torch.Tensor]]: ...
def load_into(target: Union[torch.nn.Module, Dict[str, torch.Tensor]], path: PathLike,
              strict: bool = True, **engine: Any) -> dict: ...
