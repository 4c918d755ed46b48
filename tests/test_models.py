"""Tests for lowband.models: parameter counts, shapes, the features/head convention,
seeding, GroupNorm buffers, error messages, and padding invariance of text models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lowband.models import MODELS, build_model, count_params
from lowband.models.cnn import build_fol_wildfire_cnn

VOCAB = 50

# name -> (input_shape, kwargs, num_classes) for a small, fast instance of each model.
CASES: dict[str, tuple[tuple[int, ...], dict, int]] = {
    "mlp": ((1, 28, 28), {}, 10),
    "cnn_fmnist": ((1, 28, 28), {}, 10),
    "cnn_cifar": ((3, 32, 32), {}, 10),
    "simplecnn": ((3, 32, 32), {}, 10),
    "fol_cnn": ((3, 32, 32), {}, 10),
    "fol_wildfire_cnn": ((3, 32, 32), {"channels": [8, 8, 16, 16]}, 2),
    "resnet18": ((3, 32, 32), {}, 10),
    "text_bag": ((12,), {"vocab_size": VOCAB}, 4),
    "text_cnn": ((12,), {"vocab_size": VOCAB, "num_filters": 8}, 4),
    "logreg": ((60,), {}, 10),
    "char_lstm": ((12,), {"vocab_size": VOCAB, "hidden": 16}, 4),
    "pfl_simple_cnn": ((3, 32, 32), {}, 10),
}


def _input(name: str, shape: tuple[int, ...], batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if MODELS[name].inputs == "tokens":
        x = torch.randint(1, VOCAB, (batch, *shape), generator=g)
        x[:, -3:] = 0  # trailing padding
        return x
    return torch.randn(batch, *shape, generator=g)


def _build(name: str, seed: int | None = 0, **extra) -> nn.Module:
    shape, kwargs, nc = CASES[name]
    return build_model(name, num_classes=nc, input_shape=shape, seed=seed, **{**kwargs, **extra})


def test_every_registered_model_has_a_case():
    assert set(CASES) == set(MODELS)


@pytest.mark.parametrize(
    "name, shape, kwargs, expected",
    [
        ("mlp", (1, 28, 28), {}, 79_510),
        ("cnn_fmnist", (1, 28, 28), {}, 100_816),
        ("cnn_cifar", (3, 32, 32), {}, 541_094),
        ("simplecnn", (3, 32, 32), {}, 62_006),
        ("pfl_simple_cnn", (3, 32, 32), {}, 896 + 18_496 + 1_605_760 + 1_290),
        ("fol_cnn", (3, 32, 32), {}, 3584 + 147_584 + 147_584 + 20_490),
        ("resnet18", (3, 32, 32), {}, 11_173_962),
        ("resnet18", (3, 32, 32), {"norm": "gn"}, 11_173_962),
    ],
)
def test_param_counts(name, shape, kwargs, expected):
    assert count_params(build_model(name, num_classes=10, input_shape=shape, **kwargs)) == expected


def test_fol_wildfire_matches_table_9():
    # FOL appendix C.5 table 9: 1,792 + 128 + 73,856 + 256 + 295,168 + 512 + 1,180,160 + 1,024 + 1,026
    m = build_model("fol_wildfire_cnn", num_classes=2, input_shape=(3, 32, 32))
    assert count_params(m) == 1_553_922


def test_mlp_layout_and_init():
    m = build_model("mlp", num_classes=10, input_shape=(1, 28, 28), seed=3)
    assert m.fc1.weight.shape == (100, 784) and m.head.weight.shape == (10, 100)
    assert torch.all(m.fc1.bias == 0) and torch.all(m.head.bias == 0)
    # Kaiming-normal, fan_in, ReLU gain: std = sqrt(2 / 784)
    assert abs(m.fc1.weight.std().item() - (2 / 784) ** 0.5) < 0.002
    deep = build_model("mlp", num_classes=10, input_shape=(784,), hidden=[32, 16])
    assert deep(torch.randn(2, 784)).shape == (2, 10) and deep.feature_dim == 16


@pytest.mark.parametrize("name", list(CASES))
def test_forward_shape_and_head_convention(name):
    model = _build(name).eval()
    shape, _, nc = CASES[name]
    x = _input(name, shape)
    with torch.no_grad():
        out = model(x)
        feats = model.features(x)
    assert out.shape == (2, nc)
    assert feats.dim() == 2 and feats.shape[0] == 2
    assert isinstance(model.head, nn.Linear) and model.head.in_features == feats.shape[1]
    assert torch.equal(model.head(feats), out)


def test_simplecnn_on_mnist_shape():
    m = build_model("simplecnn", num_classes=10, input_shape=(1, 28, 28))
    assert m(torch.randn(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize("name", ["mlp", "cnn_cifar", "text_cnn", "fol_wildfire_cnn"])
def test_seed_determinism(name):
    a, b, c = _build(name, seed=7), _build(name, seed=7), _build(name, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())


def test_seed_leaves_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    _build("mlp", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_manual_seed_without_seed_kwarg_is_deterministic():
    torch.manual_seed(11)
    a = _build("simplecnn", seed=None).state_dict()
    torch.manual_seed(11)
    b = _build("simplecnn", seed=None).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resnet_gn_has_no_running_buffers():
    gn = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), norm="gn")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gn.modules())
    assert list(gn.buffers()) == []
    assert all(m.num_groups == 32 for m in gn.modules() if isinstance(m, nn.GroupNorm))
    bn = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))
    assert any("running_mean" in k for k in bn.state_dict())
    two = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), norm="gn", gn_groups=2)
    assert two(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_unknown_model_message():
    with pytest.raises(ValueError, match=r"unknown model 'x'; available: mlp, cnn_fmnist, .*logreg"):
        build_model("x", num_classes=10, input_shape=(1, 28, 28))


def test_bad_kwarg_messages():
    with pytest.raises(ValueError, match=r"model 'mlp' got unknown kwarg 'hiden'; allowed: hidden$"):
        build_model("mlp", num_classes=10, input_shape=(784,), hiden=10)
    with pytest.raises(ValueError, match=r"model 'text_bag' needs kwarg 'vocab_size'"):
        build_model("text_bag", num_classes=4, input_shape=(12,))
    with pytest.raises(ValueError, match=r"norm must be 'bn' or 'gn'"):
        build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), norm="ln")
    with pytest.raises(ValueError, match=r"needs an image input_shape"):
        build_model("cnn_cifar", num_classes=10, input_shape=(784,))
    with pytest.raises(ValueError, match=r"too small"):
        build_fol_wildfire_cnn(2, (3, 8, 8))


@pytest.mark.parametrize("name", ["text_bag", "text_cnn"])
def test_text_models_ignore_padding(name):
    model = _build(name).eval()
    x = _input(name, CASES[name][0], batch=3)
    padded = torch.cat([x, torch.zeros(3, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded), model(x), rtol=0, atol=1e-6)
        empty = model(torch.zeros(1, 5, dtype=torch.long))  # all padding: finite output
    assert torch.isfinite(empty).all()


def test_text_bag_is_mean_of_real_tokens():
    m = _build("text_bag").eval()
    x = torch.tensor([[3, 5, 0, 0]])
    bag = m.embedding.weight[[3, 5]].mean(0, keepdim=True)
    with torch.no_grad():
        torch.testing.assert_close(m.features(x), torch.relu(m.fc(bag)))
