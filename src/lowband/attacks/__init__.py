"""Byzantine attackers as a fault (``[faults.byzantine]``), and what a run measures of them.

- :mod:`lowband.attacks.model`: who attacks and each attack's formula;
- :mod:`lowband.attacks.config`: the config section;
- :mod:`lowband.attacks.wrapper`: the attack as a wrapper of the attackers' step outputs
  (a sender-side transform before the codec), and the omniscient attacks' stage at the
  aggregator;
- :mod:`lowband.attacks.metrics`: honest-only metrics, backdoor accuracy, the summary.
Kept free of imports so the config schema can import its section without loading torch.
"""
