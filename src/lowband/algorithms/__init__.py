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
from lowband.algorithms import ntk_dfl as _ntk_dfl  # noqa: F401,E402
from lowband.algorithms import spark as _spark  # noqa: F401,E402
from lowband.algorithms import dfedsam as _dfedsam  # noqa: F401,E402
from lowband.algorithms import dispfl as _dispfl  # noqa: F401,E402
from lowband.algorithms import fedcspack as _fedcspack  # noqa: F401,E402
from lowband.algorithms import fednova as _fednova  # noqa: F401,E402
from lowband.algorithms import moon as _moon  # noqa: F401,E402
from lowband.algorithms import fedala as _fedala  # noqa: F401,E402
from lowband.algorithms import feddbe as _feddbe  # noqa: F401,E402
from lowband.algorithms import fedas as _fedas  # noqa: F401,E402
from lowband.algorithms import fedntd as _fedntd  # noqa: F401,E402
from lowband.algorithms import fedpac as _fedpac  # noqa: F401,E402
from lowband.algorithms import fedspu as _fedspu  # noqa: F401,E402
from lowband.algorithms import kta as _kta  # noqa: F401,E402
from lowband.algorithms import fedmd as _fedmd  # noqa: F401,E402
from lowband.algorithms import fol as _fol  # noqa: F401,E402
from lowband.algorithms import oneshot as _oneshot  # noqa: F401,E402
from lowband.algorithms import dense as _dense  # noqa: F401,E402
from lowband.algorithms import coboost as _coboost  # noqa: F401,E402

__all__ = ["ALGORITHMS", "Algorithm", "register"]
