"""ferry for numpy: host memory, no torch needed."""
import os
from typing import Dict, Union

import numpy

from . import _ferry
from ._save import numpy_save as save, numpy_save_file as save_file, numpy_write_file as write_file  # noqa: F401
from ._dtypes import numpy_dtype, numpy_view, tensor_table


def load_file(filename: Union[str, "os.PathLike[str]"]) -> Dict[str, numpy.ndarray]:
    """Like safetensors.numpy.load_file; `filename` may also be a shard directory or an index.
    The arrays view ferry's host memory, which lives as long as any of them."""
    checkpoint = _ferry.Checkpoint.open(os.fspath(filename))
    table = tensor_table(checkpoint)
    for name, (dtype, _, _) in table.items():
        numpy_dtype(dtype, name)  # refuse before loading, not halfway
    loaded = _ferry.load(checkpoint, "cpu")
    return {name: numpy_view(loaded, name, dtype, shape) for name, (dtype, shape, _) in table.items()}
