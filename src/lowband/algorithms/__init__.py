"""Algorithms: one module per method, grouped by family, registered by name.

``ALGORITHMS`` maps a name (as used in configs) to the algorithm class; each class
carries its ``Hyperparams`` with the paper's defaults. The folders show the architecture:

- ``server/``: one global model, server rounds (FedAvg and its server optimisers, FedProx,
  FedNova, MOON, FedNTD, SCAFFOLD);
- ``personalised/``: a model per client through a server (FedCSPACK, FedALA, FedDBE, FedAS,
  FedPAC, FedSPU) and the local-only baseline;
- ``decentralised/``: peer rounds (D-PSGD, DFedAvg(M), DFedSAM, DisPFL, NTK-DFL, SPARK);
- ``knowledge/``: prediction-space knowledge transfer (KTA v2, FedMD);
- ``oneshot/``: one-shot and contact methods (FOL, one-shot FedAvg, DENSE, Co-Boosting).

``base.py`` (the step/message vocabulary) and ``common.py`` (shared local SGD) serve all.
"""

from lowband.algorithms.base import REGISTRY as ALGORITHMS
from lowband.algorithms.base import Algorithm, register

# importing the family packages registers their algorithms
from lowband.algorithms import server, personalised, decentralised, knowledge, oneshot  # noqa: F401,E402,I001

#: the family folders, in the order the docs present them
FAMILIES = ("server", "personalised", "decentralised", "knowledge", "oneshot")

__all__ = ["ALGORITHMS", "FAMILIES", "Algorithm", "register"]
