"""``[faults.byzantine]``: which nodes attack and how (see lowband.attacks.model).

```toml
[faults.byzantine]
kind = "sign_flip"     # scaling, gaussian, label_flip, alie, ipm, model_replacement
fraction = 0.125       # or nodes = [3]
```

Parameters a kind does not read are refused with one line.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: kind -> the parameters it reads
READS: dict[str, tuple[str, ...]] = {
    "sign_flip": ("scale",), "scaling": ("scale",), "gaussian": ("sigma",), "label_flip": (),
    "alie": ("z",), "ipm": ("epsilon",), "model_replacement": ("gamma", "target", "poison_fraction"),
}
DEFAULT_SCALE = {"sign_flip": 1.0, "scaling": 20.0}


class ByzantineConfig(BaseModel):
    """Byzantine attackers (a fault: seeded, resumable, acting through the same messages)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["sign_flip", "scaling", "gaussian", "label_flip", "alie", "ipm", "model_replacement"]
    nodes: Optional[list[int]] = Field(None, description="the attacking nodes")
    fraction: Optional[float] = Field(None, gt=0, lt=1, description="fraction of nodes attacking, drawn once "
                                                                       "from (seed, 'byzantine')")
    scale: Optional[float] = Field(None, description="sign_flip: -scale u (1); scaling: scale u (20)")
    sigma: float = Field(200.0, gt=0, description="gaussian: the noise's standard deviation (Fang et al.: 200)")
    z: Optional[float] = Field(None, description="alie: z (unset: Baruch et al.'s z_max from n and f)")
    epsilon: float = Field(0.1, description="ipm: epsilon (Xie et al.: 0.1)")
    gamma: Optional[float] = Field(None, gt=0, description="model_replacement: boost (unset: n / eta, n the "
                                                           "aggregation's inputs)")
    target: int = Field(0, ge=0, description="model_replacement: the backdoor's target class")
    poison_fraction: float = Field(0.5, gt=0, le=1, description="model_replacement: triggered copies of this "
                                                                "fraction of the attacker's data")

    @model_validator(mode="after")
    def _check(self) -> "ByzantineConfig":
        if (self.nodes is None) == (self.fraction is None):
            raise ValueError("set exactly one of nodes (a list of node ids) and fraction (e.g. 0.125)")
        if self.nodes is not None and (not self.nodes or min(self.nodes) < 0 or len(set(self.nodes)) != len(self.nodes)):
            raise ValueError(f"nodes must be distinct node ids >= 0, got {self.nodes}")
        reads = READS[self.kind]
        for key in ("scale", "z", "gamma"):
            if getattr(self, key) is not None and key not in reads:
                raise ValueError(f"{key} is not read by kind {self.kind!r} (it reads: {', '.join(reads) or 'nothing'})")
        for key, default in (("sigma", 200.0), ("epsilon", 0.1), ("target", 0), ("poison_fraction", 0.5)):
            if getattr(self, key) != default and key not in reads:
                raise ValueError(f"{key} is not read by kind {self.kind!r} (it reads: {', '.join(reads) or 'nothing'})")
        return self

    @property
    def coefficient(self) -> float:
        return self.scale if self.scale is not None else DEFAULT_SCALE.get(self.kind, 1.0)
