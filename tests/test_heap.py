"""lowband.heap: per-node copies in malloc'd memory, same values, torch's alignment.

The property that matters (the heap stays at its live peak over many rounds: 10.45 -> 7.18
GiB at 10,000 DFedAvg nodes) is measured in benchmarks/README.md; these tests make sure the
copies a round makes really take that memory (a copy silently back on torch's allocator
would pass every metric test and regrow the heap)."""

from __future__ import annotations

import torch

from lowband.comm.message import Message
from lowband.heap import ALIGN, MIN_BYTES, heap_clone, heap_empty, heap_zeros_like
from lowband.train.params import clone_params, weighted_average


def _on_heap(t: torch.Tensor) -> bool:
    """A heap_empty tensor is a typed view of the byte buffer numpy took with malloc; a copy
    made by torch's own allocator (``clone``, ``torch.empty``) is a view of nothing."""
    return t._base is not None


def test_heap_tensors_are_aligned_and_equal_to_torchs() -> None:
    x = torch.randn(300, 265)
    y = heap_clone(x)
    assert _on_heap(y) and y.data_ptr() % ALIGN == 0
    assert torch.equal(x, y) and y.stride() == x.stride() and y.dtype == x.dtype
    z = heap_zeros_like(x, torch.float64)
    assert _on_heap(z) and z.dtype == torch.float64 and not z.any()
    e = heap_empty((MIN_BYTES,), torch.uint8)
    assert _on_heap(e) and e.data_ptr() % ALIGN == 0


def test_small_or_strided_tensors_keep_torchs_allocator() -> None:
    small = heap_clone(torch.randn(10))
    assert not _on_heap(small)
    strided = torch.randn(400, 400).t()
    c = heap_clone(strided)
    assert not _on_heap(c) and torch.equal(c, strided)


def test_the_rounds_copies_take_heap_memory() -> None:
    params = {"w": torch.randn(100, 784), "b": torch.randn(100)}
    copy = clone_params(params)
    assert _on_heap(copy["w"]) and not _on_heap(copy["b"])  # the bias is under MIN_BYTES
    msg = Message(kind="weights", tensors=params).clone()
    assert _on_heap(msg.tensors["w"]) and torch.equal(msg.tensors["w"], params["w"])
    avg = weighted_average([params, copy], [1.0, 3.0])
    assert _on_heap(avg["w"]) and torch.allclose(avg["w"], params["w"])
