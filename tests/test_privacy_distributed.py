"""Distributed DP (Skellam inside SecAgg): noise variance exact, the decoded sum is the
clipped sum plus noise of the planned std, bits trade bytes for error, and the accountant
tends to the Gaussian's for large sensitivities (Agarwal et al. 2021)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lowband.comm.ledger import Ledger
from lowband.comm.network import CodecConfig, Network
from lowband.privacy.distributed import Skellam, hadamard, rotate, skellam_epsilon, skellam_rdp, unrotate
from lowband.privacy.secagg import SecAggParams, run_secagg


def test_rotation_is_orthonormal_and_invertible() -> None:
    x = torch.randn(1000, dtype=torch.float64)
    y = rotate(x, 1, 2)
    assert y.numel() == 1024 and float(y.norm()) == pytest.approx(float(x.norm()), rel=1e-12)
    torch.testing.assert_close(unrotate(y, 1000, 1, 2), x)
    torch.testing.assert_close(hadamard(hadamard(torch.arange(8.0, dtype=torch.float64))), torch.arange(8.0, dtype=torch.float64))


def _send(net: Network):
    def send(msg, src, dst, direction):
        return net.send(msg, src, dst, round=1, direction=direction)
    return send


def test_secure_sum_decodes_to_clipped_sum_plus_planned_noise() -> None:
    n, d, clip, z = 8, 3000, 1.0, 1.0
    mech = Skellam(clip=clip, noise_multiplier=z, bits=20, n=n, d=d)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(d, generator=g) * 0.05 + 0.01 for _ in range(n)]  # norms ~2.7 > clip
    enc = {u: mech.encode(x, seed=3, round=1, node=u) for u, x in enumerate(xs)}
    net = Network(CodecConfig(), Ledger(), seed=3)
    res = run_secagg(enc, SecAggParams(modulus_bits=mech.bits, degree=4), seed=3, round=1, send=_send(net))
    got = mech.decode_sum(res.total, seed=3, round=1)
    want = sum(x * min(1.0, clip / float(x.norm())) for x in xs)
    err = (got.double() - want.double())
    # the error is noise of std sqrt(mu)/gamma (plus rounding, std <= sqrt(n/4)/gamma) per coordinate
    noise_std = math.sqrt(mech.variance) / mech.gamma
    rounding_std = math.sqrt(n / 4) / mech.gamma
    assert float(err.std()) == pytest.approx(math.sqrt(noise_std**2 + rounding_std**2), rel=0.08)
    assert float(err.std()) >= 0.9 * noise_std
    # noise std is z times the clip, up to the rounding's inflation of the sensitivity
    assert noise_std == pytest.approx(z * mech.l2_sensitivity / mech.gamma) and noise_std >= z * clip
    masked = net.ledger.by_kind()["secagg_masked"]
    assert masked["messages"] == n and masked["encoded"] > n * mech.payload_bytes()


def test_skellam_noise_has_the_planned_variance() -> None:
    mech = Skellam(clip=1.0, noise_multiplier=0.7, bits=24, n=5, d=1 << 15)
    zero = torch.zeros(mech.d)
    tot = sum(mech.encode(zero, seed=1, round=1, node=u).astype(np.int64) for u in range(5)) % (1 << 24)
    signed = np.where(tot >= 1 << 23, tot - (1 << 24), tot)
    assert signed.var() == pytest.approx(mech.variance, rel=0.03)


def test_bits_trade_bytes_for_error() -> None:
    d, n = 4000, 10
    errs, sizes = [], []
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(d, generator=g) * 0.01 for _ in range(n)]
    for bits in (10, 14, 18):
        mech = Skellam(clip=1.0, noise_multiplier=1e-4, bits=bits, n=n, d=d)  # rounding, not DP noise, dominates
        tot = sum(mech.encode(x, seed=1, round=1, node=u).astype(np.int64) for u, x in enumerate(xs)) % (1 << bits)
        err = mech.decode_sum(tot.astype(np.uint64), seed=1, round=1) - sum(xs)
        errs.append(float(err.std()))
        sizes.append(mech.payload_bytes())
    assert sizes == [math.ceil(4096 * b / 8) for b in (10, 14, 18)]
    assert errs[0] > 4 * errs[1] and errs[2] <= 1.02 * errs[1]  # 10 bits: rounding dominates; 14+: the DP noise floor
    with pytest.raises(ValueError, match="raise dp.bits"):
        Skellam(clip=1.0, noise_multiplier=1.0, bits=3, n=100, d=10)


def test_skellam_rdp_tends_to_the_gaussians() -> None:
    # large sensitivity at fixed z: the correction term vanishes, RDP -> alpha / (2 z^2)
    z = 1.5
    for l2 in (10.0, 1e3, 1e5):
        mu = (z * l2) ** 2
        r = skellam_rdp(8, l2, l2 * l2, mu)
        assert r >= 8 / (2 * z * z)
    assert skellam_rdp(8, 1e5, 1e10, (z * 1e5) ** 2) == pytest.approx(8 / (2 * z * z), rel=1e-3)
    pytest.importorskip("dp_accounting")
    from lowband.privacy.accountant import SampledGaussian, final_epsilon

    mech = Skellam(clip=1.0, noise_multiplier=4.0, bits=32, n=10, d=1 << 16)
    gauss = final_epsilon(SampledGaussian(4.0, 10, 10, "all"), 20, 1e-5, "rdp")
    sk = skellam_epsilon(mech, 20, 1e-5)
    assert gauss <= sk <= 1.05 * gauss
