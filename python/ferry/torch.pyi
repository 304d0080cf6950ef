import os
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple, Union

import torch

PathLike = Union[str, os.PathLike]

def load(path: PathLike, device: Any = "cpu", names: Optional[Iterable[str]] = None,
         progress: Optional[Callable[[int, int], None]] = None, **engine: Any) -> Tuple[Dict[str, torch.Tensor], dict]: ...
def load_file(filename: PathLike, device: Any = "cpu") -> Dict[str, torch.Tensor]: ...
def iterate_weights(paths: Union[PathLike, Iterable[PathLike]], device: Any = "cpu",
                    group_bytes: int = ..., **engine: Any) -> Iterator[Tuple[str, torch.Tensor]]: ...
def load_into(target: Union[torch.nn.Module, Dict[str, torch.Tensor]], path: PathLike,
              strict: bool = True, **engine: Any) -> dict: ...
