"""Per-client augmentation at partition time (FOL): plain torch ops, seeded per client."""

from __future__ import annotations

import pytest
import torch

from lowband.data import build_federation, load_dataset
from lowband.data.augment import AugmentSpec, augment_images
from lowband.seeding import torch_gen


def _imgs(n: int = 6) -> torch.Tensor:
    return torch.randn(n, 3, 12, 12, generator=torch_gen(0, "imgs"))


def test_identity_spec_is_identity() -> None:
    x = _imgs()
    spec = AugmentSpec(rotation=0.0, flip=0.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), noise_std=0.0)
    assert torch.allclose(augment_images(x, spec, torch_gen(1)), x, atol=1e-5)


def test_flip_only_mirrors_and_noise_only_adds_noise() -> None:
    x = _imgs()
    flip = AugmentSpec(rotation=0.0, flip=1.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), noise_std=0.0)
    assert torch.allclose(augment_images(x, flip, torch_gen(1)), x.flip(-1), atol=1e-5)
    noise = AugmentSpec(rotation=0.0, flip=0.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), noise_std=0.1)
    d = augment_images(x, noise, torch_gen(1)) - x
    assert 0.08 < float(d.std()) < 0.12


def test_rotation_moves_pixels_but_keeps_the_centre() -> None:
    x = torch.zeros(4, 1, 11, 11)
    x[:, :, 5, 5] = 1.0  # a dot at the exact centre stays there under any rotation
    x[:, :, 5, 9] = 1.0  # a dot off-centre moves
    spec = AugmentSpec(rotation=45.0, flip=0.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), noise_std=0.0)
    out = augment_images(x, spec, torch_gen(3))
    assert torch.allclose(out[:, :, 5, 5], torch.ones(4, 1), atol=1e-4)
    assert float(out[:, :, 5, 9].max()) < 0.99


def test_seeded_per_client_and_deterministic() -> None:
    ds = load_dataset("digits")
    kw = dict(num_clients=3, partition="iid", split=(0.7, 0.15, 0.15), seed=4)
    a = build_federation(ds, augment="fol", **kw)
    b = build_federation(ds, augment="fol", **kw)
    plain = build_federation(ds, **kw)
    for na, nb, npl in zip(a.nodes, b.nodes, plain.nodes):
        assert torch.equal(na.train_x, nb.train_x) and torch.equal(na.test_x, nb.test_x)
        assert torch.equal(na.train_y, npl.train_y) and torch.equal(na.test_y, npl.test_y)  # labels untouched
        assert na.train_x.shape == npl.train_x.shape and not torch.allclose(na.train_x, npl.train_x)
    # the global test set is not augmented
    assert torch.equal(a.global_test_x, plain.global_test_x)
    # another seed gives other transforms
    c = build_federation(ds, augment="fol", **{**kw, "seed": 5})
    assert not torch.equal(c.nodes[0].train_x[:5], a.nodes[0].train_x[:5]) or c.nodes[0].n_train != a.nodes[0].n_train


def test_unknown_preset_is_one_clear_error() -> None:
    ds = load_dataset("digits")
    with pytest.raises(ValueError, match="augment must be one of fol"):
        build_federation(ds, num_clients=2, augment="nope")
