"""Read-ahead for per-key reads to a GPU. transformers and vLLM take a handle's tensors one by one
(`for k in f.keys(): f.get_tensor(k)`); read one at a time, each would wait for its own read and
copy, with the engine's workers idle in between. Once two calls follow each other in file order
or in keys() order, the next tensors of that order are submitted to ferry's transfer engine
(parallel reads, staged copies) into GPU tensors of their own while the caller works on the
current one. What is read ahead and not yet taken holds at most READ_AHEAD_BYTES of GPU memory
(or one tensor, where a single one is larger). A call that follows no order (random access) cancels the guesses and
reads just its tensor: nothing is read that was not asked for until an order shows again.

The window is refilled in batches, each ONE engine submission with one extent per tensor: once
half of it has been taken, the tensors that fill it again go together, so that a checkpoint of
small tensors costs a submission per batch rather than per key.

Tensors the handle calls small (`is_small`: a few hundred KiB in a file the page cache holds) are
never read ahead: each is read by the caller when taken (`read_small`: a memory copy from the
page cache and an asynchronous copy up), which costs less than its share of an engine job; it
keeps the order going, so the large tensors around it are still read ahead."""
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

# GPU memory a handle may hold in tensors read ahead and not handed out yet.
READ_AHEAD_BYTES = 512 << 20
# The most tensors in flight ahead of the caller (small tensors: the count, not the bytes, binds).
READ_AHEAD_TENSORS = 64


class _Batch:
    """Tensors submitted together: the engine's ticket and the event the writes wait for (both
    kept until the reads are over: the engine's copy streams wait on the event when they
    start). Waited for once, by the first of its tensors taken."""

    __slots__ = ("ticket", "event", "waited")

    def __init__(self, ticket, event):
        self.ticket, self.event, self.waited = ticket, event, ticket is None


class _Read:
    """One tensor on its way: its memory and the batch that reads it."""

    __slots__ = ("tensor", "batch", "size")

    def __init__(self, tensor, batch: _Batch, size: int):
        self.tensor, self.batch, self.size = tensor, batch, size


class ReadAhead:
    """The engine's reads of one safe_open handle, to `device` (cuda:N; cpu works the same and
    serves the tests). `size_of(name)` gives a tensor's bytes."""

    def __init__(self, reader, names_in_file_order: List[str], device: str,
                 size_of: Callable[[str], int],
                 is_small: Optional[Callable[[str, int], bool]] = None,
                 read_small: Optional[Callable[[str, int], Any]] = None):
        self._reader, self._device, self._size_of = reader, device, size_of
        self._is_small = is_small if read_small is not None else None
        self._read_small = read_small
        self._small_names: Dict[str, bool] = {}  # is_small's answers (fixed for the handle)
        # (order, begin, end): the names order[begin:end] are all small, so a refill from inside
        # that run starts looking at `end` (a file of small tensors costs no scan per key).
        self._skip_to: Optional[Tuple[List[str], int, int]] = None
        self._file_order = names_in_file_order
        self._orders: Optional[List[Tuple[List[str], Dict[str, int]]]] = None  # made when used
        self._pending: Dict[str, _Read] = {}  # read ahead, not taken yet
        self._pending_bytes = 0
        self._last: Optional[str] = None
        # Taken since the last miss: not guessed again (keys() and file order differ at the ends).
        self._taken = set()
        self._lock = threading.Lock()
        self.hits = 0  # tensors handed out from the read-ahead
        self.wasted_bytes = 0  # read ahead, never taken (a wrong guess)

    def take(self, name: str, size: int):
        """Tensor `name` as uint8 on the device, read whole (its `size` bytes)."""
        small = self._small(name, size)
        with self._lock:
            read = self._pending.pop(name, None)
            if read is not None:
                self._pending_bytes -= read.size
                self.hits += 1
            elif not small or not self._follows_an_order(name):
                self._drop_pending()  # the guess was wrong: free its memory before reading more
                self._taken.clear()
            if read is None and not small:
                read = self._start([(name, size)])[0]
            self._taken.add(name)
            self._refill(name)
            self._last = name
            if read is not None:
                ticket, first = read.batch.ticket, not read.batch.waited
                read.batch.waited = True  # the first taker waits (below, outside the lock)
        if read is None:
            return self._read_small(name, size)
        if ticket is not None:
            if first:
                self._reader.wait(ticket)  # counts the batch's bytes once; raises its failure
            else:
                ticket.wait()  # the batch another thread is waiting for; raises its failure
        return read.tensor

    def _small(self, name: str, size: Optional[int] = None) -> bool:
        if self._is_small is None:
            return False
        answer = self._small_names.get(name)
        if answer is None:
            answer = self._is_small(name, self._size_of(name) if size is None else size)
            self._small_names[name] = answer
        return answer

    def _follows_an_order(self, name: str) -> bool:
        """Whether `name` comes right after the last name taken in an order the calls follow."""
        return self._place(self._last, name) is not None

    def _refill(self, name: str) -> None:
        """Once the window is half empty, the tensors that fill it again go as one batch."""
        if self._pending and (len(self._pending) > READ_AHEAD_TENSORS // 2 or
                              self._pending_bytes > READ_AHEAD_BYTES // 2):
            return
        place = self._place(self._last, name)
        if place is None:
            return
        order, at = place
        start = skip_from = at + 1
        known = self._skip_to
        if known is not None and known[0] is order and known[1] <= start <= known[2]:
            start, skip_from = known[2], known[1]
        wanted, total = [], self._pending_bytes
        only_small = True
        for index in range(start, min(len(order), at + 1 + READ_AHEAD_TENSORS)):
            following = order[index]
            if self._small(following):  # read by the caller when taken
                if only_small:
                    self._skip_to = (order, skip_from, index + 1)
                continue
            only_small = False
            if following in self._pending or following in self._taken:
                continue
            nbytes = self._size_of(following)
            if (self._pending or wanted) and total + nbytes > READ_AHEAD_BYTES:
                break
            wanted.append((following, nbytes))
            total += nbytes
        if wanted:
            for (following, nbytes), read in zip(wanted, self._start(wanted)):
                self._pending[following] = read
            self._pending_bytes = total

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

    def _start(self, wanted: List[Tuple[str, int]]) -> List[_Read]:
        """Reads of the (name, size) tensors, submitted as one batch."""
        import torch

        event = self._event()
        tensors = [torch.empty(size, dtype=torch.uint8, device=self._device) for _, size in wanted]
        submitted = [(name, t.data_ptr()) for (name, size), t in zip(wanted, tensors) if size]
        ticket = None
        if submitted:
            ticket = self._reader.submit_tensors(submitted, self._device,
                                                 event.cuda_event if event is not None else 0)
        batch = _Batch(ticket, event)
        return [_Read(t, batch, size) for t, (_, size) in zip(tensors, wanted)]

    def _drop_pending(self) -> None:
        reads = list(self._pending.values())
        self._pending.clear()
        self._pending_bytes = 0
        batches = {id(read.batch): read.batch for read in reads}.values()
        for batch in batches:
            if batch.ticket is not None and not batch.waited:  # a taker may still wait on others
                batch.ticket.cancel()
        for read in reads:
            self.wasted_bytes += read.size
        for batch in batches:
            # The ticket's destructor waits for the chunks in flight: it goes before the memory.
            batch.ticket = None
        for read in reads:
            read.tensor = None

    def _place(self, last: Optional[str], name: str) -> Optional[Tuple[List[str], int]]:
        """(order, position of `name` in it) for the first order (file order, then keys()
        order) where `name` follows `last` (or comes first, when nothing was taken before)."""
        if self._orders is None:
            self._orders = [(order, {n: i for i, n in enumerate(order)})
                            for order in (self._file_order, sorted(self._file_order))]
        for order, position in self._orders:
            at = position.get(name)
            previous = position.get(last) if last is not None else None
            if at is not None and ((previous is not None and at == previous + 1) or
                                   (previous is None and at == 0)):
                return order, at
        return None
