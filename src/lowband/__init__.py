"""lowband: federated learning when communication is the scarce resource.

The package simulates a federation on one machine, runs communication-efficient FL
methods and their baselines under one protocol, and counts every byte that crosses a
link (see docs/ and the design notes).
"""

__version__ = "0.1.0"
