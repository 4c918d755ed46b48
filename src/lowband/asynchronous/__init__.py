"""Asynchronous federations on an event clock: FedAsync and FedBuff's updates arrive at the
times their devices' downloads, compute and uploads take (docs/async.md).

- :mod:`~lowband.asynchronous.staleness`: the staleness weights (FedAsync's constant,
  polynomial and hinge functions; FedBuff's ``1 / sqrt(1 + s)``);
- :mod:`~lowband.asynchronous.plan`: :class:`AsyncPlan`, one arrival's round;
- :mod:`~lowband.asynchronous.clock`: :class:`EventClock`, the scheduler (an observer of the
  round driver), with :mod:`~lowband.asynchronous.build` building it from a run.

The algorithms live with the other server methods (``lowband.algorithms.server.fedasync``,
``fedbuff``).
"""
