"""The in-memory dataset every source and the user's own data arrive as."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(repr=False)
class Dataset:
    """A train/test pair of tensors plus what models need to know about them.

    Images: ``x`` float32 ``(N, C, H, W)``, normalised. Text: ``x`` int64 token ids
    ``(N, L)``, 0 = pad, 1 = unk, and ``meta["vocab_size"]`` set. ``y`` is int64 in
    ``0..num_classes-1``. ``natural_partition`` lists train indices per client when the
    source defines clients (``synthetic``). Shared via the cache: do not mutate.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    meta: dict = field(default_factory=dict)
    natural_partition: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if len(x) != len(y):
                raise ValueError(f"{self.name}: {split}_x has {len(x)} rows but {split}_y has {len(y)}")
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise ValueError(f"{self.name}: {split}_x rows are {tuple(x.shape[1:])}, input_shape says {self.input_shape}")
        if not self.train_x.is_floating_point() and "vocab_size" not in self.meta:
            raise ValueError(f"{self.name}: token-id data must set meta['vocab_size']")

    @property
    def is_text(self) -> bool:
        """True for token-id inputs (int64), False for float features/images."""
        return not self.train_x.is_floating_point()

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, train={tuple(self.train_x.shape)}, test={tuple(self.test_x.shape)}, "
            f"num_classes={self.num_classes}, input_shape={self.input_shape}"
            + (f", clients={len(self.natural_partition)}" if self.natural_partition is not None else "")
            + ")"
        )
