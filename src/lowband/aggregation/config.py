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

from lowband.config.schema import AggregationConfig


def build_rule(cfg: Optional[AggregationConfig]) -> Any:
    """The configured rule object, or None."""
    if cfg is None or cfg.rule is None:
        return None
    from lowband.aggregation.rules import RULES

    return RULES[cfg.rule](**cfg.params)
