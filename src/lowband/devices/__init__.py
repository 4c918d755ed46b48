"""Devices: what a node can compute and when it is reachable (issue: real devices).

:mod:`lowband.devices.availability` holds the availability interface that client
sampling, peer topologies and the asynchronous event clock all read.
"""
