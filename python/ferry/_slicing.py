"""get_slice's index rules, as safetensors 0.8 applies them, and which rows a slice needs.

safetensors has two rule sets: framework "pt" with its default "mmap" backend indexes a torch
view of the file, so torch's rules hold (negative indices, clamped bounds, lists...); numpy and
the "pread" backend go through safetensors' own parser (ints, slices with a positive step, one
ellipsis, the empty list; bounds checked, with its error messages). ferry follows both, and reads
only the rows of the first dimension that the slice touches."""
import operator
from typing import Any, List, Optional, Tuple

from ._ferry import SafetensorError

# A parsed index, one entry per leading dimension: ("select", i) or ("narrow", start, stop, step)
# with None for an open bound.
Indexer = Tuple


def parse_indexers(index: Any, shape: List[int]) -> List[Indexer]:
    """safetensors' parse_indexers: SafetensorError for what it refuses."""
    if isinstance(index, tuple):
        items = list(index)
    elif isinstance(index, list):
        if not index:
            return [("narrow", 0, 0, 1)]
        raise SafetensorError("Non empty lists are not implemented")
    else:
        items = [index]
    ellipses = sum(1 for item in items if item is Ellipsis)
    if ellipses > 1:
        raise SafetensorError("Only one ellipsis (...) is allowed in slice index")
    expansion = max(0, len(shape) - (len(items) - ellipses))
    indexers: List[Indexer] = []
    for item in items:
        dim_idx = len(indexers)
        if item is Ellipsis:
            indexers += [("narrow", None, None, 1)] * expansion
        elif isinstance(item, slice):
            start = None if item.start is None else _unsigned(item.start)
            stop = None if item.stop is None else _unsigned(item.stop)
            step = 1 if item.step is None else operator.index(item.step)
            if step <= 0:
                raise SafetensorError(f"Slice step must be a positive integer, got {step}")
            indexers.append(("narrow", start, stop, step))
        else:
            try:
                value = operator.index(item)
            except TypeError:
                raise SafetensorError(f"Unsupported slice index at position {dim_idx}: expected "
                                      "slice, int, or ellipsis") from None
            if not -(1 << 31) <= value < (1 << 31):
                raise OverflowError(f"index {value} does not fit in 32 bits")
            dim = shape[dim_idx] if dim_idx < len(shape) else 0
            if value < 0:
                if dim + value < 0:
                    raise SafetensorError(f"Invalid index {value} for dimension {dim_idx} of size {dim}")
                value += dim
            indexers.append(("select", value))
    return indexers


def _unsigned(value: Any) -> int:
    value = operator.index(value)
    if value < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return value


def _display(indexers: List[Indexer]) -> str:
    parts = []
    for ix in indexers:
        if ix[0] == "select":
            parts.append(str(ix[1]))
        else:
            _, start, stop, step = ix
            text = f"{'' if start is None else start}:{'' if stop is None else stop}"
            parts.append(text if step == 1 else f"{text}:{step}")
    return "[" + ", ".join(parts) + "]"


def _bounds(ix: Indexer, dim: int) -> Tuple[int, int, int]:
    if ix[0] == "select":
        return ix[1], ix[1] + 1, 1
    _, start, stop, step = ix
    return (0 if start is None else start), (dim if stop is None else stop), step


def byte_ranges(indexers: List[Indexer], shape: List[int], bits: int) -> Tuple[List[Tuple[int, int]], List[int]]:
    """safetensors' slice_byte_ranges: the (begin, end) byte ranges of the slice in order and its
    shape; SafetensorError naming the slice and the shape where it is out of range or splits a
    byte."""
    def fail(reason: str):
        raise SafetensorError(f"Error during slicing {_display(indexers)} with shape {list(shape)}: {reason}")

    if len(indexers) > len(shape):
        fail("more slicing indexes than dimensions in tensor")
    misaligned = ("The slice is slicing for subbytes dtypes, and the slice does not end up at a "
                  "byte boundary, this is invalid.")
    newshape: List[int] = []
    span = bits
    ranges: List[Tuple[int, int]] = []
    for i in reversed(range(len(shape))):
        dim = shape[i]
        if i < len(indexers):
            ix = indexers[i]
            start, stop, step = _bounds(ix, dim)
            if start >= dim or stop > dim:
                fail(f"index {start if start >= dim else max(stop - 1, 0)} out of bounds for tensor "
                     f"dimension #{i} of size {dim}")
            if ix[0] != "select":
                newshape.append(max(0, -(-(stop - start) // step)))
            if not ranges:
                if step == 1 and start == 0 and stop == dim:
                    pass
                elif step == 1:
                    if start * span % 8 or stop * span % 8:
                        fail(misaligned)
                    ranges.append((start * span // 8, stop * span // 8))
                else:
                    for n in range(start, stop, step):
                        if n * span % 8 or (n + 1) * span % 8:
                            fail(misaligned)
                        ranges.append((n * span // 8, (n + 1) * span // 8))
            else:
                if span % 8:  # whole bytes per step of this dimension: no element splits one
                    for n in range(start, stop, step):
                        if n * span % 8:
                            fail(misaligned)
                stride = span // 8 if span % 8 == 0 else None
                if stride is not None and len(ranges) == 1:  # a column block: one range per row
                    (a, b), = ranges
                    ranges = [(a + n * stride, b + n * stride) for n in range(start, stop, step)]
                else:
                    ranges = [(a + n * span // 8, b + n * span // 8)
                              for n in range(start, stop, step) for a, b in ranges]
        else:
            newshape.append(dim)
        span *= dim
    if not ranges:
        if span % 8:
            fail(misaligned)
        ranges.append((0, span // 8))
    return ranges, newshape[::-1]


def as_python_index(indexers: List[Indexer], shape: List[int]) -> tuple:
    """The numpy/torch index equal to validated safetensors indexers."""
    out = []
    for ix, dim in zip(indexers, shape):
        if ix[0] == "select":
            out.append(ix[1])
        else:
            start, stop, step = _bounds(ix, dim)
            out.append(slice(start, stop, step))
    return tuple(out)


def leading_rows(index: tuple, rows: int) -> Optional[Tuple[int, int, tuple]]:
    """For an index tuple in numpy/torch form: (first row, end row, the index relative to those
    rows) when its first entry is an int or a slice with a positive step; None when the whole
    tensor is needed (or the index is one that torch itself must judge)."""
    if not index:
        return None
    first = index[0]
    if isinstance(first, slice):
        try:
            start, stop, step = first.indices(rows)
        except (TypeError, ValueError):
            return None
        if step <= 0:
            return None
        count = len(range(start, stop, step))
        if count == 0:
            return 0, 0, (slice(0, 0),) + index[1:]
        end = start + (count - 1) * step + 1
        return start, end, (slice(0, end - start, step),) + index[1:]
    if isinstance(first, bool) or first is None or first is Ellipsis:
        return None
    try:
        value = operator.index(first)
    except TypeError:
        return None
    if not -rows <= value < rows:
        return None  # out of range: let the framework raise its own error
    value %= rows
    return value, value + 1, (0,) + index[1:]


def torch_indexers(index: tuple, shape: List[int]) -> Optional[List[Indexer]]:
    """Indexers equal to a torch-rules index tuple when it is made of in-range ints and slices
    with a positive step only (what tensor parallelism asks for); None otherwise (torch then
    judges the index itself)."""
    if len(index) > len(shape):
        return None
    indexers: List[Indexer] = []
    for item, dim in zip(index, shape):
        if isinstance(item, slice):
            try:
                start, stop, step = item.indices(dim)
            except (TypeError, ValueError):
                return None
            if step <= 0 or start >= stop:
                return None
            indexers.append(("narrow", start, stop, step))
        elif isinstance(item, bool) or item is None or item is Ellipsis:
            return None
        else:
            try:
                value = operator.index(item)
            except TypeError:
                return None
            if not -dim <= value < dim:
                return None
            indexers.append(("select", value % dim))
    return indexers


def range_count(indexers: List[Indexer], shape: List[int]) -> int:
    """How many byte ranges byte_ranges() makes for these (valid) indexers, before it is asked:
    a step in an inner dimension can make one per element."""
    count = 0  # 0: no partial dimension yet (a whole inner block)
    for i in reversed(range(min(len(indexers), len(shape)))):
        start, stop, step = _bounds(indexers[i], shape[i])
        if count == 0:
            if not (step == 1 and start == 0 and stop == shape[i]):
                count = 1 if step == 1 else len(range(start, stop, step))
        else:
            count *= len(range(start, stop, step))
    return max(count, 1)
