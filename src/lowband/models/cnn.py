"""The small CNNs of the papers we reproduce.

- :class:`FedCSPackFMNISTCNN` / :class:`FedCSPackCIFARCNN`: the FMNIST and CIFAR-10 CNNs
  of the FedCSPACK authors' code (100,816 and 541,094 parameters; specs/fedcspack.md).
- :class:`SimpleCNN`: the LeNet-style "simple-cnn" of FedMA (Wang et al., ICLR 2020) and
  MOON (Li et al., CVPR 2021), used by KTA v2 (62,006 parameters on CIFAR-10).
- :class:`FOLCNN`: FOL's CIFAR-10 base model (FOL paper, appendix C.5, table 7). The
  table lists a 224x224 input but its linear layer takes 2048 = 128 * 4 * 4 features,
  which is what a 32x32 input gives; we read it for 32x32, which reproduces every count.
- :class:`FOLWildfireCNN`: FOL's Wildfire base model (table 9): four blocks of
  conv 3x3 (pad 1) + BatchNorm + ReLU + maxpool 2 with 64-128-256-512 channels, global
  average pooling, linear head (1,553,922 parameters for 2 classes).

All flatten sizes are computed from ``input_shape``, so each model also builds for other
image sizes (e.g. ``simplecnn`` on 1x28x28). Weights use PyTorch's default init, which
draws from torch's default RNG only.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import eval_trunk
from .base import FeatureClassifier, check_spatial, conv_out, image_shape


def pool2(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 2)``, computed without indices when no gradient is recorded.

    In evaluation (``torch.no_grad``/``inference_mode``) the max of the 2x2 window is taken
    as two ``torch.maximum`` of strided slices: the same values bit for bit (a max is
    exact; a NaN propagates as in ``max_pool2d``), about 10x faster on CPU, where
    ``max_pool2d`` takes ~60% of the FMNIST CNN's forward pass (benchmarks/README.md). With
    autograd on, ``max_pool2d`` itself, so training (its gradient at ties) is unchanged.
    """
    if torch.is_grad_enabled():
        return F.max_pool2d(x, 2)
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2  # floor mode: an odd last row/column is dropped
    x = x[..., :h, :w]
    rows = torch.maximum(x[..., 0::2, :], x[..., 1::2, :])
    return torch.maximum(rows[..., 0::2], rows[..., 1::2])


class FedCSPackFMNISTCNN(FeatureClassifier):
    """conv(C->10, 5) -> maxpool 2 -> ReLU -> conv(10->20, 5) -> Dropout2d(0.5) -> maxpool 2
    -> ReLU -> flatten (320) -> fc 256 -> ReLU -> dropout(0.5) -> fc 50 -> ``head``.

    ``features`` is the fc-50 output (the code applies no activation after it).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        c, h, w = image_shape("cnn_fmnist", input_shape)
        size = tuple(conv_out(conv_out(s, 5) // 2, 5) // 2 for s in (h, w))
        check_spatial("cnn_fmnist", (h, w), size, "at least 12x12")
        self.conv1 = nn.Conv2d(c, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.conv2_drop = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(20 * size[0] * size[1], 256)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(256, 50)
        self.head = nn.Linear(50, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.relu(self.fc1(self.row_trunk(x)))))

    def row_trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The convolutions (to the flattened 320 features): each sample's output is the same
        bits whatever else shares its batch, unlike the dense layers' matrix products (see
        :data:`lowband.train.evaluate.ROW_ALIGN`). ``forward(x) = row_tail(row_trunk(x))``;
        the pooled evaluation runs the trunk on unpadded rows (lowband.engine.evaluation).
        In evaluation it runs in oneDNN's layout where that gives the same bits
        (:mod:`lowband.models.eval_trunk`)."""
        fast = eval_trunk.fast_trunk(self, (self.conv1, self.conv2), x, self._dense_trunk)
        return fast if fast is not None else self._dense_trunk(x)

    def _dense_trunk(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(pool2(self.conv1(x)))
        return F.relu(pool2(self.conv2_drop(self.conv2(x)))).flatten(1)

    def row_tail(self, z: torch.Tensor) -> torch.Tensor:
        """The dense layers after :meth:`row_trunk` (fc 256, fc 50, the head)."""
        return self.head(self.fc2(self.drop(F.relu(self.fc1(z)))))


class FedCSPackCIFARCNN(FeatureClassifier):
    """Three blocks conv 3x3 (pad 1) + ReLU + maxpool 2 with channels C->16->32->64, flatten
    (1024 for 32x32) -> dropout 0.3 -> fc 500 -> ReLU -> dropout 0.3 -> ``head``.

    ``features`` is the fc-500 activation after its ReLU and dropout.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        c, h, w = image_shape("cnn_cifar", input_shape)
        size = (h // 8, w // 8)
        check_spatial("cnn_cifar", (h, w), size, "at least 8x8")
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, 3, padding=1) for a, b in ((c, 16), (16, 32), (32, 64))
        )
        self.drop1 = nn.Dropout(0.3)
        self.fc1 = nn.Linear(64 * size[0] * size[1], 500)
        self.drop2 = nn.Dropout(0.3)
        self.head = nn.Linear(500, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = pool2(F.relu(conv(x)))
        return self.drop2(F.relu(self.fc1(self.drop1(x.flatten(1)))))


class SimpleCNN(FeatureClassifier):
    """conv(C->6, 5) -> ReLU -> maxpool 2 -> conv(6->16, 5) -> ReLU -> maxpool 2 -> flatten
    (400 for 32x32) -> fc 120 -> ReLU -> fc 84 -> ReLU -> ``head``.

    ``features`` is the 84-d activation, the representation MOON contrasts.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        c, h, w = image_shape("simplecnn", input_shape)
        size = tuple(conv_out(conv_out(s, 5) // 2, 5) // 2 for s in (h, w))
        check_spatial("simplecnn", (h, w), size, "at least 12x12")
        self.conv1 = nn.Conv2d(c, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * size[0] * size[1], 120)
        self.fc2 = nn.Linear(120, 84)
        self.head = nn.Linear(84, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = pool2(F.relu(self.conv1(x)))
        x = pool2(F.relu(self.conv2(x)))
        return F.relu(self.fc2(F.relu(self.fc1(x.flatten(1)))))


class FOLCNN(FeatureClassifier):
    """conv(C->128, 3) -> ReLU -> maxpool 2 -> conv(128->128, 3) -> ReLU -> maxpool 2 ->
    conv(128->128, 3) -> ReLU -> flatten (2048 for 32x32) -> ``head``. No padding.

    ``features`` is the flattened last conv activation.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, width: int = 128) -> None:
        super().__init__()
        c, h, w = image_shape("fol_cnn", input_shape)
        size = tuple(conv_out(conv_out(conv_out(s, 3) // 2, 3) // 2, 3) for s in (h, w))
        check_spatial("fol_cnn", (h, w), size, "at least 18x18")
        self.conv1 = nn.Conv2d(c, width, 3)
        self.conv2 = nn.Conv2d(width, width, 3)
        self.conv3 = nn.Conv2d(width, width, 3)
        self.head = nn.Linear(width * size[0] * size[1], num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = pool2(F.relu(self.conv1(x)))
        x = pool2(F.relu(self.conv2(x)))
        return F.relu(self.conv3(x)).flatten(1)


class FOLWildfireCNN(FeatureClassifier):
    """Blocks of conv 3x3 (pad 1) + BatchNorm + ReLU + maxpool 2 (``blocks``, a
    ``nn.Sequential`` of ``nn.Sequential``), global average pool, ``head``.

    ``features`` is the pooled vector (width ``channels[-1]``).
    """

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, channels: Sequence[int]
    ) -> None:
        super().__init__()
        c, h, w = image_shape("fol_wildfire_cnn", input_shape)
        n = len(channels)
        check_spatial(
            "fol_wildfire_cnn", (h, w), (h >> n, w >> n), f"at least {2**n}x{2**n}"
        )
        widths = [c, *channels]
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(
                    nn.Conv2d(a, b, 3, padding=1),
                    nn.BatchNorm2d(b),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                )
                for a, b in zip(widths[:-1], widths[1:])
            )
        )
        self.head = nn.Linear(widths[-1], num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.blocks(x), 1).flatten(1)


def build_cnn_fmnist(num_classes: int, input_shape: Sequence[int]) -> FedCSPackFMNISTCNN:
    """FedCSPACK's FMNIST CNN (100,816 params on 1x28x28, 10 classes)."""
    return FedCSPackFMNISTCNN(input_shape, num_classes)


def build_cnn_cifar(num_classes: int, input_shape: Sequence[int]) -> FedCSPackCIFARCNN:
    """FedCSPACK's CIFAR CNN (541,094 params on 3x32x32, 10 classes)."""
    return FedCSPackCIFARCNN(input_shape, num_classes)


def build_simplecnn(num_classes: int, input_shape: Sequence[int]) -> SimpleCNN:
    """FedMA / MOON simple-cnn (62,006 params on 3x32x32, 10 classes)."""
    return SimpleCNN(input_shape, num_classes)


def build_fol_cnn(num_classes: int, input_shape: Sequence[int], width: int = 128) -> FOLCNN:
    """FOL table 7 CNN (319,242 params on 3x32x32, 10 classes, width 128)."""
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"model 'fol_cnn': width must be a positive int; got {width!r}")
    return FOLCNN(input_shape, num_classes, width)


def build_fol_wildfire_cnn(
    num_classes: int,
    input_shape: Sequence[int],
    channels: Sequence[int] = (64, 128, 256, 512),
) -> FOLWildfireCNN:
    """FOL table 9 Wildfire CNN (1,553,922 params for 2 classes with the default widths)."""
    chans = list(channels) if not isinstance(channels, int) else []
    if not chans or any(not isinstance(ch, int) or isinstance(ch, bool) or ch < 1 for ch in chans):
        raise ValueError(
            f"model 'fol_wildfire_cnn': channels must be a non-empty list of positive ints; got {channels!r}"
        )
    return FOLWildfireCNN(input_shape, num_classes, chans)
