"""The ``[dp]`` and ``[secagg]`` sections of an experiment, and the checks that refuse,
before a run starts, a combination that cannot be served (one line each).

Imports nothing of lowband but the privacy tables (so the config schema can include these
models). :func:`check_privacy` is what a run's setup calls with the algorithm's name and
family, the codec specs in use and the sampling, before anything is written.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DPConfig(BaseModel):
    """``[dp]``: differential privacy (docs/privacy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Literal["none", "central", "local", "distributed"] = Field(
        "none", description="where the noise is added: central (DP-FedAvg at the server), local (clip+gauss on "
        "every sender before the codec), distributed (Skellam inside secure aggregation)")
    noise_multiplier: float = Field(1.0, gt=0, description="z: noise std over the clip norm")
    clip: Optional[float] = Field(None, gt=0, description="S: L2 clip of each update or message (None with "
                                  "adaptive_clip: start at 0.1)")
    adaptive_clip: bool = Field(False, description="clip at a quantile of the update norms (Andrew et al. 2021; "
                                "central only)")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="gamma of adaptive clipping")
    clip_learning_rate: float = Field(0.2, gt=0, description="eta_C of adaptive clipping")
    bit_noise: Optional[float] = Field(None, gt=0, description="sigma_b of adaptive clipping (None: cohort / 20)")
    delta: float = Field(1e-5, gt=0, lt=1, description="delta at which epsilon is reported")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="dp-accounting's RDP or PLD accountant")
    target_epsilon: Optional[float] = Field(None, gt=0, description="refuse a run whose schedule exceeds it")
    bits: int = Field(16, ge=2, le=62, description="bits per coordinate of distributed DP's modular sum")

    @model_validator(mode="after")
    def _consistent(self) -> "DPConfig":
        if self.mechanism != "none" and self.clip is None and not self.adaptive_clip:
            raise ValueError("dp.clip must be set (or dp.adaptive_clip = true with dp.mechanism = \"central\")")
        if self.adaptive_clip and self.mechanism != "central":
            raise ValueError(f"dp.adaptive_clip is read only with dp.mechanism = \"central\", not {self.mechanism!r}")
        return self


class SecAggConfig(BaseModel):
    """``[secagg]``: SecAgg+ secure aggregation (docs/privacy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    degree: Optional[int] = Field(None, ge=2, description="neighbours per client (even); None: all others")
    threshold: Optional[int] = Field(None, ge=1, description="Shamir shares needed; None: degree // 2 + 1")
    modulus_bits: int = Field(32, ge=8, le=62, description="the sum is taken mod 2**modulus_bits")
    clip_range: float = Field(8.0, gt=0, description="coordinates are clipped to [-clip_range, clip_range] "
                              "before quantisation")
    levels_bits: Optional[int] = Field(None, ge=2, description="quantisation levels 2**levels_bits; None: "
                                       "the most the modulus leaves room for")


#: uplink codecs SecAgg accepts: the upload travels as the masked field vector (the field
#: quantisation, ``secagg.levels_bits``, is its codec); any other uplink codec would be ignored.
#: lowband's random masks and sketches draw their randomness per sender, so they are not
#: summable across clients; a round-shared-seed rand-k or sketch is not implemented.
SECAGG_UPLINK_CODECS = ("fp32",)


def check_privacy(dp: DPConfig, secagg: SecAggConfig, *, algorithm: str, family: str,
                  uplink_codecs: tuple[str, ...] = (), sampling: str = "fixed",
                  norm_screen: bool = False, robust_rule: Optional[str] = None) -> None:
    """Raise ValueError (one line) for a combination that cannot be served (docs/privacy.md)."""
    from .central import central_dp_releases
    from .secagg_steps import check_secagg

    if dp.mechanism == "central":
        central_dp_releases(algorithm, family)
        if dp.accountant == "pld" and sampling == "fixed":
            raise ValueError("dp.accountant = \"pld\" cannot account fixed-size sampling without replacement: set "
                             "dp.accountant = \"rdp\"")
        if robust_rule is not None:
            raise ValueError(f"dp.mechanism = \"central\" and aggregation rule {robust_rule!r} are both aggregation "
                             f"rules: choose one")
    if dp.mechanism == "distributed" and not secagg.enabled:
        raise ValueError("dp.mechanism = \"distributed\" adds noise inside secure aggregation: set "
                         "secagg.enabled = true")
    if secagg.enabled:
        check_secagg(algorithm, family)
        if norm_screen:
            raise ValueError("secagg.enabled = true hides individual updates: the norm screen "
                             "(validation.norm_factor) cannot see them; drop one")
        if robust_rule is not None:
            raise ValueError(f"secagg.enabled = true hides individual updates: aggregation rule {robust_rule!r} "
                             f"needs them; drop one")
        if dp.mechanism == "central":
            raise ValueError("secagg.enabled = true hides individual updates from the server, which central DP "
                             "must clip: use dp.mechanism = \"distributed\" (or \"local\")")
        for spec in uplink_codecs:
            if spec not in SECAGG_UPLINK_CODECS:
                raise ValueError(f"secagg.enabled = true sends each update as a masked vector in a finite field "
                                 f"(quantised to 2**secagg.levels_bits levels), so uplink codec {spec!r} would be "
                                 f"ignored; drop it (lowband's top-k, qsgd, int8, random masks and sketches are "
                                 f"per-client, not summable)")
