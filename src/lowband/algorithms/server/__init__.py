"""Server rounds with one global model: the server sends the model to the sampled clients,
they train and reply, the server aggregates (FedAvg with its server optimisers, FedProx,
FedNova, MOON, FedNTD, SCAFFOLD), and HierFAVG's client-edge-cloud hierarchy; and the
asynchronous forms on the event clock, where a round is one client's arrival (FedAsync,
FedBuff)."""

# importing the modules registers the algorithms
from . import fedasync, fedavg, fedbuff, fednova, fedntd, hierfavg, moon, scaffold  # noqa: F401,E402
