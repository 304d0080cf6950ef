"""Read-ahead for per-key reads to a GPU. transformers and vLLM take a handle's tensors one by one
(`for k in f.keys(): f.get_tensor(k)`); read one at a time, each would wait for its own read and
copy, with the engine's workers idle in between. Once two calls follow each other in file order
or in keys() order, the next tensors of that order are submitted to ferry's transfer engine
(parallel reads, staged copies) into GPU tensors of their own while the caller works on the
current one. What is read ahead and not yet taken holds at most READ_AHEAD_BYTES of GPU memory
(or one tensor, where a single one is larger). A call that follows no order (random access) cancels the guesses and
reads just its tensor: nothing is read that was not asked for until an order shows again."""
import threading
from typing import Callable, Dict, List, Optional, Tuple

# GPU memory a handle may hold in tensors read ahead and not handed out yet.
READ_AHEAD_BYTES = 512 << 20
# The most tensors in flight ahead of the caller (small tensors: the count, not the bytes, binds).
READ_AHEAD_TENSORS = 64


class _Read:
    """One tensor on its way: its memory, the engine's ticket and the event the writes wait for
    (both kept until the read is over: the engine's copy streams wait on the event when they
    start)."""

    __slots__ = ("tensor", "ticket", "size", "event")

    def __init__(self, tensor, ticket, size: int, event):
        self.tensor, self.ticket, self.size, self.event = tensor, ticket, size, event


class ReadAhead:
    """The engine's reads of one safe_open handle, to `device` (cuda:N; cpu works the same and
    serves the tests). `size_of(name)` gives a tensor's bytes."""

    def __init__(self, reader, names_in_file_order: List[str], device: str,
                 size_of: Callable[[str], int]):
        self._reader, self._device, self._size_of = reader, device, size_of
        self._file_order = names_in_file_order
        self._orders: Optional[List[Tuple[List[str], Dict[str, int]]]] = None  # made when used
        self._pending: Dict[str, _Read] = {}  # read ahead, not taken yet
        self._pending_bytes = 0
        self._last: Optional[str] = None
        self._lock = threading.Lock()
        self.hits = 0  # tensors handed out from the read-ahead
        self.wasted_bytes = 0  # read ahead, never taken (a wrong guess)

    def take(self, name: str, size: int):
        """Tensor `name` as uint8 on the device, read whole (its `size` bytes)."""
        with self._lock:
            read = self._pending.pop(name, None)
            if read is not None:
                self._pending_bytes -= read.size
                self.hits += 1
            else:
                self._drop_pending()  # the guess was wrong: free its memory before reading more
            event = self._event()
            if read is None:
                read = self._start(name, size, event)
            for following in self._predicted(name):
                if following in self._pending:
                    continue
                nbytes = self._size_of(following)
                if self._pending and self._pending_bytes + nbytes > READ_AHEAD_BYTES:
                    break
                self._pending[following] = self._start(following, nbytes, event)
                self._pending_bytes += nbytes
            self._last = name
        if read.ticket is not None:
            self._reader.wait(read.ticket)
        return read.tensor

    def close(self) -> None:
        with self._lock:
            self._drop_pending()

    def _event(self):
        """A CUDA event on the caller's current stream: memory the caching allocator hands back
        may still be read by kernels queued there, so the engine writes only after it. None for
        host memory."""
        import torch

        if not self._device.startswith("cuda"):
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        return event

    def _start(self, name: str, size: int, event) -> _Read:
        import torch

        tensor = torch.empty(size, dtype=torch.uint8, device=self._device)
        ticket = None
        if size:
            ticket = self._reader.submit(name, 0, size, tensor.data_ptr(), self._device,
                                         event.cuda_event if event is not None else 0)
        return _Read(tensor, ticket, size, event)

    def _drop_pending(self) -> None:
        reads = list(self._pending.values())
        self._pending.clear()
        self._pending_bytes = 0
        for read in reads:
            if read.ticket is not None:
                read.ticket.cancel()
            self.wasted_bytes += read.size
        for read in reads:
            # The ticket's destructor waits for the chunks in flight: it goes before the memory.
            read.ticket = None
            read.tensor = None

    def _predicted(self, name: str) -> List[str]:
        """The names after `name` in the order the calls so far follow, or none."""
        if self._orders is None:
            self._orders = [(order, {n: i for i, n in enumerate(order)})
                            for order in (self._file_order, sorted(self._file_order))]
        for order, position in self._orders:
            at = position.get(name)
            previous = position.get(self._last) if self._last is not None else None
            if at is not None and ((previous is not None and at == previous + 1) or
                                   (previous is None and at == 0)):
                return order[at + 1:at + 1 + READ_AHEAD_TENSORS]
        return []
