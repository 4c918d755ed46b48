"""CIFAR ResNet-18 with BatchNorm or GroupNorm.

Architecture: He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016),
adapted to 32x32 inputs as in the widely used kuangliu/pytorch-cifar code (FedCSPACK's
CIFAR-100 model, FOL's CIFAR-100/Hurricane model, the KTA FedAvg baseline): a 3x3 stride-1
stem conv with 64 channels and no max-pool, BasicBlocks [2, 2, 2, 2] with 64/128/256/512
channels (stride 2 at the start of stages 2-4), 1x1 conv + norm shortcuts where the shape
changes, global average pooling and a linear head. 11,173,962 parameters for 10 classes.

``norm="gn"`` swaps every BatchNorm for GroupNorm (Wu & He, ECCV 2018). GroupNorm keeps no
running statistics, so nothing but parameters needs to be averaged or sent, and
non-IID client batches do not corrupt shared statistics (Hsieh et al., ICML 2020). Each
GroupNorm uses ``gn_groups`` groups (default 32, Wu & He's default) when that divides the
channel count, else the largest divisor of the channel count below it; all ResNet-18
widths (64..512) are divisible by 32. ``gn_groups=2`` gives the FL variant of Hsieh et
al. / Reddi et al. (ICLR 2021). Parameter counts are the same for both norms.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .base import FeatureClassifier, image_shape

NormFactory = Callable[[int], nn.Module]


def norm_factory(norm: str, gn_groups: int) -> NormFactory:
    """A function ``channels -> norm layer`` for ``norm`` in {"bn", "gn"}."""
    if norm == "bn":
        return nn.BatchNorm2d
    if norm == "gn":

        def make_gn(channels: int) -> nn.Module:
            groups = max(g for g in range(1, min(gn_groups, channels) + 1) if channels % g == 0)
            return nn.GroupNorm(groups, channels)

        return make_gn
    raise ValueError(f"model 'resnet18': norm must be 'bn' or 'gn'; got {norm!r}")


class BasicBlock(nn.Module):
    """Two 3x3 convs with norm and ReLU, plus identity or 1x1-conv shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int, norm: NormFactory) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), norm(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(FeatureClassifier):
    """CIFAR-style ResNet; ``features`` is the globally average-pooled last stage."""

    def __init__(
        self,
        in_channels: int,
        num_blocks: Sequence[int],
        num_classes: int,
        norm: NormFactory,
        widths: Sequence[int] = (64, 128, 256, 512),
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = norm(widths[0])
        stages = []
        in_planes = widths[0]
        for i, (planes, n) in enumerate(zip(widths, num_blocks)):
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(in_planes, planes, stride, norm))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.head = nn.Linear(in_planes, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)


def build_resnet18(
    num_classes: int, input_shape: Sequence[int], norm: str = "bn", gn_groups: int = 32
) -> ResNet:
    """CIFAR ResNet-18 (11,173,962 params for 10 classes); ``norm`` is "bn" or "gn"."""
    c, _, _ = image_shape("resnet18", input_shape)
    if not isinstance(gn_groups, int) or isinstance(gn_groups, bool) or gn_groups < 1:
        raise ValueError(f"model 'resnet18': gn_groups must be a positive int; got {gn_groups!r}")
    return ResNet(c, (2, 2, 2, 2), num_classes, norm_factory(norm, gn_groups))
