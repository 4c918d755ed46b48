"""Tensors that outlive a node's step, in memory the C heap can give to the next one.

A peer round holds two sets of every node's weights at its peak (the trained states and the
messages in flight: 2 x 318 kB a node for the NTK-FL MLP, 6.4 GB at 10,000 nodes). torch's CPU
allocator takes each buffer with ``posix_memalign(64)``; glibc serves an aligned request from
a free block at least ``size + 64 + 32`` bytes long, so the block a freed buffer leaves
cannot hold the next buffer of the same size, and every round of per-node copies made
and dropped in turn grew the heap instead of reusing it (measured: 1.48 GiB of peak RSS
against 1.21 GiB of live peak at 1,000 DFedAvg nodes, 10.45 GiB at 10,000; issue 43).

:func:`heap_empty` takes the buffer with plain ``malloc`` (a numpy byte array) and keeps
torch's 64-byte alignment by starting the tensor at the first aligned byte, so a freed buffer's
block fits the next one and the heap stays at the live peak. Values, strides and alignment are
those of ``torch.empty``: nothing computed depends on which allocator gave the memory.
Small tensors (under :data:`MIN_BYTES`) keep torch's allocator (small blocks do not
fragment this way). Used for the copies a round makes per node: trained weights read out
of a cohort, a broadcast's private copy for each receiver, averages, parameter copies.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["MIN_BYTES", "ALIGN", "heap_empty", "heap_clone", "heap_zeros_like"]

#: tensors smaller than this keep torch's own allocator
MIN_BYTES = 64 * 1024
#: torch's CPU alignment (c10's gAlignment), kept
ALIGN = 64


def heap_empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor whose memory comes from ``malloc`` (module
    docstring), 64-byte aligned; a small one (under :data:`MIN_BYTES`) from ``torch.empty``."""
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    off = -raw.ctypes.data % ALIGN
    return torch.from_numpy(raw[off:off + nbytes]).view(dtype).view(shape)


def heap_clone(t: torch.Tensor) -> torch.Tensor:
    """``t.detach().clone()`` in :func:`heap_empty` memory, for a contiguous CPU tensor of
    :data:`MIN_BYTES` or more (any other is ``t.detach().clone()``: same strides)."""
    if not _heap(t):
        return t.detach().clone()
    out = heap_empty(t.shape, t.dtype)
    out.copy_(t.detach())
    return out


def heap_zeros_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.zeros_like(t, dtype=dtype)`` in :func:`heap_empty` memory where
    :func:`heap_clone` would use it."""
    dtype = t.dtype if dtype is None else dtype
    if not _heap(t):
        return torch.zeros_like(t, dtype=dtype)
    out = heap_empty(t.shape, dtype)
    out.zero_()
    return out


def _heap(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and t.numel() * t.element_size() >= MIN_BYTES
