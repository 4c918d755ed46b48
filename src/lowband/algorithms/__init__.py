"""Algorithms: one module per method, registered by name.

``ALGORITHMS`` maps a name (as used in configs) to the algorithm class; each class
carries its ``Hyperparams`` with the paper's defaults.
"""

from lowband.algorithms.base import REGISTRY as ALGORITHMS
from lowband.algorithms.base import Algorithm, register

# importing the modules registers the algorithms
from lowband.algorithms import local as _local  # noqa: F401,E402
from lowband.algorithms import fedavg as _fedavg  # noqa: F401,E402
from lowband.algorithms import decentralized as _decentralized  # noqa: F401,E402
from lowband.algorithms import fedcspack as _fedcspack  # noqa: F401,E402

__all__ = ["ALGORITHMS", "Algorithm", "register"]
