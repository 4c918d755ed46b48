"""The FMNIST CNN's trunk in oneDNN's layout (lowband.models.eval_trunk): the same bits as
the dense path, taken in evaluation only, and refused where the bits could differ."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lowband.models import eval_trunk
from lowband.models.cnn import FedCSPackFMNISTCNN

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


def _model(seed: int = 0) -> FedCSPackFMNISTCNN:
    torch.manual_seed(seed)
    return FedCSPackFMNISTCNN((1, 28, 28), 10).eval()


def _inputs(n: int) -> torch.Tensor:
    return torch.randn((n, 1, 28, 28), generator=torch.Generator().manual_seed(n))


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows that went through the oneDNN layout (so a test sees whether it was taken)."""
    seen: list[int] = []
    real = eval_trunk._mkldnn_pass

    def counted(convs, x):  # type: ignore[no-untyped-def]
        seen.append(int(x.shape[0]))
        return real(convs, x)

    monkeypatch.setattr(eval_trunk, "_mkldnn_pass", counted)
    return seen


@pytest.mark.parametrize("n", [1, 3, 17, 128, 300])
def test_same_bits_as_the_dense_trunk_and_logits(n: int, passes: list[int]) -> None:
    m, x = _model(), _inputs(n)
    if not eval_trunk.layout_agrees((m.conv1, m.conv2), x, m._dense_trunk):
        pytest.skip("this machine's oneDNN gives the two layouts different bits: the dense path runs")
    with torch.inference_mode():
        fast, dense = m.row_trunk(x), m._dense_trunk(x)
        logits, reference = m(x), m.row_tail(dense)
    assert n in passes, "the oneDNN layout was not taken in evaluation"
    assert torch.equal(fast, dense)
    assert torch.equal(logits, reference)


def test_training_and_autograd_keep_the_dense_path(passes: list[int]) -> None:
    m, x = _model(), _inputs(8)
    m(x)  # autograd on
    with torch.no_grad():
        m.train()
        m(x)  # dropout active: never the oneDNN path
    assert passes == []


def test_non_finite_weights_take_the_dense_path_and_keep_its_nan(passes: list[int]) -> None:
    """oneDNN's max-pooling drops a NaN that F.max_pool2d keeps: a diverged model must
    score as it did (NaN logits), so the bound check sends it to the dense path."""
    m, x = _model(), _inputs(8)
    with torch.no_grad():
        m.conv1.weight[0, 0, 0, 0] = float("nan")
    with torch.inference_mode():
        out = m.row_trunk(x)
        ref = m._dense_trunk(x)
    assert passes == []
    assert torch.isnan(out).any()
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


def test_a_non_finite_input_takes_the_dense_path(passes: list[int]) -> None:
    m, x = _model(), _inputs(8)
    x[3, 0, 5, 5] = float("nan")
    x[5, 0, 7, 7] = float("inf")
    with torch.inference_mode():
        out, ref = m.row_trunk(x), m._dense_trunk(x)
    assert passes == []
    assert torch.isnan(out[3]).any()
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


def test_a_bound_near_overflow_takes_the_dense_path(passes: list[int]) -> None:
    m, x = _model(), _inputs(4)
    with torch.no_grad():
        m.conv1.weight.mul_(1e29)
    assert eval_trunk.trunk_bound((m.conv1, m.conv2), x) >= eval_trunk.SAFE_BOUND
    with torch.inference_mode():
        m.row_trunk(x)
    assert passes == []


def test_flop_counter_sees_the_dense_forward(passes: list[int]) -> None:
    """A FLOP count of an evaluation (benchmarks/_common.forward_flops) must count the
    model's convolutions once, not the oneDNN probe nor its layout."""
    m, x = _model(), _inputs(16)
    with torch.no_grad():
        with FlopCounterMode(display=False) as fc:
            m(x)
    per_sample = fc.get_total_flops() / 16
    assert per_sample == 1_118_440  # conv 288,000 + conv 640,000 + fc 163,840 + 25,600 + 1,000
    assert passes == []
