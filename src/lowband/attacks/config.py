"""``[faults.byzantine]``: which nodes attack and how (see lowband.attacks.model).

```toml
[faults.byzantine]
kind = "sign_flip"     # scaling, gaussian, label_flip, alie, ipm, model_replacement
fraction = 0.125       # or nodes = [3]
```

Parameters a kind does not read are refused with one line.
"""

from __future__ import annotations

from lowband.config.schema import DEFAULT_SCALE, READS, ByzantineConfig

__all__ = ["ByzantineConfig", "READS", "DEFAULT_SCALE"]
