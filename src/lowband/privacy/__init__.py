"""Privacy priced in bytes: differential privacy (central, local, distributed) with an
accountant, and secure aggregation whose protocol messages are encoded and counted.

Modules: :mod:`.accountant` (epsilon per round, ``dp.target_epsilon``), :mod:`.central`
(DP-FedAvg as an aggregation rule, adaptive clipping), :mod:`.transforms` (sender-side
``clip(S)+gauss(z)`` before the codec), :mod:`.secagg` (SecAgg+ with real arithmetic),
:mod:`.distributed` (the Skellam mechanism inside secure aggregation). See docs/privacy.md.
"""
