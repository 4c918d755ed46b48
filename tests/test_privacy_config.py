"""The [dp] and [secagg] sections refuse unsound combinations with one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lowband.privacy.config import DPConfig, SecAggConfig, check_privacy


def test_sections_validate() -> None:
    assert DPConfig().mechanism == "none" and SecAggConfig().modulus_bits == 32
    with pytest.raises(ValidationError, match="dp.clip must be set"):
        DPConfig(mechanism="central")
    with pytest.raises(ValidationError, match="adaptive_clip is read only"):
        DPConfig(mechanism="local", clip=1.0, adaptive_clip=True)
    with pytest.raises(ValidationError):
        DPConfig(mechanism="central", clip=1.0, typo=1)


@pytest.mark.parametrize("dp,sa,kw,words", [
    (dict(mechanism="central", clip=1.0), {}, dict(algorithm="fednova", family="server"), "step count"),
    (dict(mechanism="central", clip=1.0), {}, dict(algorithm="dpsgd", family="peer"), "no server"),
    (dict(mechanism="central", clip=1.0, accountant="pld"), {}, dict(algorithm="fedavg", family="server"), "pld"),
    (dict(mechanism="distributed", clip=1.0), {}, dict(algorithm="fedavg", family="server"), "secagg.enabled"),
    ({}, dict(enabled=True), dict(algorithm="scaffold", family="server"), "two secure sums"),
    ({}, dict(enabled=True), dict(algorithm="fedavg", family="server", norm_screen=True), "norm screen"),
    ({}, dict(enabled=True), dict(algorithm="fedavg", family="server", robust_rule="krum"), "krum"),
    ({}, dict(enabled=True), dict(algorithm="fedavg", family="server", uplink_codecs=("ef(topk(0.01))",)), "topk"),
    (dict(mechanism="central", clip=1.0), dict(enabled=True), dict(algorithm="fedavg", family="server"), "distributed"),
])
def test_refusals(dp, sa, kw, words) -> None:
    with pytest.raises(ValueError, match=words) as e:
        check_privacy(DPConfig(**dp), SecAggConfig(**sa), **kw)
    assert "\n" not in str(e.value)


def test_served_combinations_pass() -> None:
    check_privacy(DPConfig(mechanism="central", clip=1.0), SecAggConfig(), algorithm="fedavg", family="server")
    check_privacy(DPConfig(mechanism="local", clip=1.0), SecAggConfig(), algorithm="dpsgd", family="peer")
    check_privacy(DPConfig(mechanism="distributed", clip=1.0), SecAggConfig(enabled=True), algorithm="fedprox",
                  family="server", uplink_codecs=("fp32",))
    with pytest.raises(ValueError, match="qsgd"):
        check_privacy(DPConfig(), SecAggConfig(enabled=True), algorithm="fedavg", family="server",
                      uplink_codecs=("qsgd(4)",))
