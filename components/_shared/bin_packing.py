"""Which whole rows go into which pack: best-fit decreasing, the packs then in a seeded shuffled order.

Greedy packing in row order closes a pack as soon as the next row does not fit, so long-tailed data leaves much
of every pack padding (measured on the GPU suite's rows: 0.78 of each pack filled at max_seq_len 1024, 0.91 at
4096). Best-fit decreasing places the rows longest first, each into the fullest pack that still holds it, and
fills packs almost whole.

Rows of one length are placed together: the fullest pack that holds one holds `space // length` of them, and no
pack left with less space than the length is the best fit again for that length, so each pass over a free-space
value serves all of its packs at once (numpy), and the loop runs per (length, free space) pair, not per row.

The plan depends on the lengths only: ties are broken by row index, a pack's rows keep their order in the data
(a pack is never "long rows first") and the packs are shuffled with a fixed seed, so no run of packs holds the
longest rows (the loss curve of an unshuffled epoch would show it). Both ways a run gets packs use it:
dataset-initialize's pack writer (packing.py) and torchtune's packing in the trainer (torchtune/sample_packing.py).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

#: The seed of the pack order: a constant, so the same rows give the same packs on every rank and every run.
ORDER_SEED = 0


@dataclass
class PackPlan:
    """Pack k holds rows `order[bounds[k]:bounds[k + 1]]`, in increasing row order."""

    order: object  # np.ndarray int64: row indices, pack after pack
    bounds: object  # np.ndarray int64: len(packs) + 1 offsets into order

    def __len__(self) -> int:
        return len(self.bounds) - 1


def plan_packs(lengths, max_seq_len: int) -> PackPlan:
    """Packs of whole rows with these token lengths (each at most `max_seq_len`), best-fit decreasing."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > max_seq_len:
        raise ValueError(f"a row of {int(lengths.max())} tokens does not fit a pack of {max_seq_len}")
    # A row of no tokens is planned as one: every length divides the free space it is placed in.
    sizes = np.maximum(lengths, 1)
    by_size = np.argsort(-sizes, kind="stable")  # longest first, ties by row index
    pack_of = np.empty(len(sizes), dtype=np.int64)  # pack of the row at by_size[i]
    packs = _Packs(max_seq_len)
    runs = np.append(np.flatnonzero(np.diff(sizes[by_size], prepend=-1)), len(sizes)).tolist()
    for start, end in zip(runs[:-1], runs[1:], strict=True):  # the rows of one length
        packs.place(int(sizes[by_size[start]]), pack_of[start:end])
    return _shuffled(by_size, pack_of, packs.count)


class _Packs:
    """Open packs by free space: for each free space, the packs with it, in the order they came to it."""

    def __init__(self, max_seq_len: int):
        self.max_seq_len = max_seq_len
        self.count = 0
        self.spaces: list[int] = []  # sorted free spaces some pack has (none for a full pack)
        self.by_space: dict[int, _Queue] = {}

    def place(self, size: int, into) -> None:
        """Place rows of `size` tokens, writing each one's pack into `into` (an int64 view, one entry a row)."""
        import numpy as np

        done = 0
        while done < len(into):
            left = len(into) - done
            i = bisect.bisect_left(self.spaces, size)
            if i == len(self.spaces):  # no pack holds one: new packs, as many rows in each as fit
                per = self.max_seq_len // size
                new = np.arange(self.count, self.count - (-left // per), dtype=np.int64)
                into[done:] = np.repeat(new, per)[:left]
                self.count += len(new)
                full, rest = divmod(left, per)
                self._put(self.max_seq_len - per * size, new[:full])
                if rest:
                    self._put(self.max_seq_len - rest * size, new[full:])
                return
            space = self.spaces[i]
            queue, per = self.by_space[space], space // size
            taken = queue.take(min(len(queue), -(-left // per)))
            placed = min(left, len(taken) * per)
            into[done : done + placed] = np.repeat(taken, per)[:placed]
            done += placed
            if not len(queue):
                del self.by_space[space], self.spaces[i]
            full, rest = divmod(placed, per)
            self._put(space - per * size, taken[:full])
            if rest:
                self._put(space - rest * size, taken[full:])

    def _put(self, space: int, packs) -> None:
        if space == 0 or not len(packs):
            return
        if space not in self.by_space:
            bisect.insort(self.spaces, space)
            self.by_space[space] = _Queue()
        self.by_space[space].put(packs)


class _Queue:
    """Pack ids first in, first out, kept as numpy chunks (taking and putting cost per chunk, not per pack)."""

    def __init__(self):
        self._chunks: deque = deque()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def put(self, packs) -> None:
        self._chunks.append(packs)
        self._len += len(packs)

    def take(self, n: int):
        import numpy as np

        parts = []
        self._len -= n
        while n:
            head = self._chunks[0]
            if len(head) <= n:
                parts.append(self._chunks.popleft())
                n -= len(head)
            else:
                parts.append(head[:n])
                self._chunks[0] = head[n:]
                n = 0
        return np.concatenate(parts) if len(parts) != 1 else parts[0]


def _shuffled(by_size, pack_of, count: int) -> PackPlan:
    """The plan with the packs in a seeded random order and each pack's rows in row order."""
    import numpy as np

    rank = np.empty(count, dtype=np.int64)
    rank[np.random.default_rng(ORDER_SEED).permutation(count)] = np.arange(count)
    packs = np.empty(len(by_size), dtype=np.int64)
    packs[by_size] = rank[pack_of]
    order = np.lexsort((np.arange(len(packs)), packs))
    bounds = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(packs, minlength=count), out=bounds[1:])
    return PackPlan(order, bounds)
