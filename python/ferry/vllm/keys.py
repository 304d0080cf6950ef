"""vLLM's offload keys in ferry's store: the store indexes a block by a 64-bit XXH3 of the key,
so two keys may map to one index entry. Each block therefore carries its full key in a trailer
of TRAILER bytes after its data, written with it and read back with it: a get whose trailer is
not its key (another key's block under the same 64-bit hash) is a failed key, never another
block's bytes. A put that finds the hash taken by another key's block reports "already_present"
as for its own key; a later get of it then fails its key check and vLLM recomputes the block.

Trailer: the key's length (2 bytes, little-endian) and the key, zero-padded; a key longer than
TRAILER - 2 bytes is kept as its SHA-256 digest under the length 0xFFFF."""
import hashlib
from typing import List, Sequence

import numpy as np
import torch

TRAILER = 128
_LONG = 0xFFFF


def record(key: bytes) -> bytes:
    key = bytes(key)
    if len(key) > TRAILER - 2:
        key, length = hashlib.sha256(key).digest(), _LONG
    else:
        length = len(key)
    return (length.to_bytes(2, "little") + key).ljust(TRAILER, b"\0")


class KeyTrailers:
    """The trailers of one batch of keys, as (len(keys), TRAILER) uint8 rows on `device`: for a
    put, each key's record; for a get, room the stored trailers land in, checked by mismatched()."""

    def __init__(self, keys: Sequence[bytes], device, storing: bool):
        self._expected = np.frombuffer(b"".join(record(k) for k in keys), dtype=np.uint8
                                       ).reshape(len(keys), TRAILER)
        if storing:
            rows = torch.from_numpy(self._expected.copy())
            self.rows = rows.to(device) if str(device) != "cpu" else rows
        else:
            self.rows = torch.zeros((len(keys), TRAILER), dtype=torch.uint8, device=device)

    def piece(self, i: int) -> torch.Tensor:
        return self.rows[i]

    def mismatched(self, indices: Sequence[int]) -> List[int]:
        """Of `indices` (blocks whose get succeeded), those whose trailer is not their key."""
        if not indices:
            return []
        got = self.rows.cpu().numpy()
        return [i for i in indices if not np.array_equal(got[i], self._expected[i])]
