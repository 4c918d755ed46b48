"""``[aggregation]``: the rule a server or a peer applies to what it received.

```toml
[aggregation]
rule = "trimmed_mean"   # median, trimmed_mean, krum, multikrum, bulyan, geomed,
f = 1                   # centered_clipping, bridge, self_clipping, mean
```

The keys besides ``rule`` are the rule's parameters, validated by the rule's own model
(:mod:`lowband.aggregation.rules`): an unknown key, or one the chosen rule does not read,
is refused with one line. No ``rule`` (the default): no rule, every algorithm averages as
it always did.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


class AggregationConfig(BaseModel):
    """The ``[aggregation]`` section: ``rule`` plus that rule's parameters."""

    model_config = ConfigDict(extra="allow", frozen=True)

    rule: Optional[str] = None

    @model_validator(mode="after")
    def _rule_and_params(self) -> "AggregationConfig":
        from lowband.aggregation.rules import RULES

        params = dict(self.model_extra or {})
        if self.rule is None:
            if params:
                raise ValueError(f"{', '.join(sorted(params))} set without a rule; add rule = one of "
                                 f"{', '.join(sorted(RULES))}")
            return self
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}; available: {', '.join(sorted(RULES))}")
        try:
            RULES[self.rule].Params(**params)
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "?"
            fields = ", ".join(RULES[self.rule].Params.model_fields) or "none"
            raise ValueError(f"{key}: {err['msg']} (rule {self.rule!r} reads: {fields})") from None
        return self

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def build_rule(cfg: Optional[AggregationConfig]) -> Any:
    """The configured rule object, or None."""
    if cfg is None or cfg.rule is None:
        return None
    from lowband.aggregation.rules import RULES

    return RULES[cfg.rule](**cfg.params)
