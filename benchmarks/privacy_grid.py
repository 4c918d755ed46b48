"""FedAvg on digits (8 clients, 4 a round, 10 rounds): epsilon {inf, 8, 1} x uplink codec
{fp32, qsgd(4)} x {plain, SecAgg}; prints the Markdown rows of docs/results/privacy.md.

Plain cells with DP run central DP-FedAvg at the noise multiplier whose 10 rounds reach the
target (lowband.privacy.accountant.noise_for_target); SecAgg cells run distributed DP
(Skellam, 20 bits) at the same multiplier and report the epsilon it spends.

    python benchmarks/privacy_grid.py OUT_DIR
"""
import json, sys, time
sys.path.insert(0, "tests")
from conftest import digits_config
from pathlib import Path
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.privacy.accountant import SampledGaussian, noise_for_target
from lowband.privacy.config import PrivacyRefused

out = Path(sys.argv[1])
R = 10
rows = []
z = {e: noise_for_target(SampledGaussian(1.0, 8, 4, "fixed"), R, 1e-5, e) for e in (1.0, 8.0)}
for eps in (None, 8.0, 1.0):
    for codec in ("fp32", "qsgd(4)"):
        for secure in (False, True):
            cfg = digits_config(out / f"e{eps}-{codec}-{secure}", "fedavg", rounds=R, upload="delta")
            cfg["comm"] = {"by_direction": {"up": codec}}
            if eps is not None:
                cfg["dp"] = ({"mechanism": "distributed", "clip": 1.0, "noise_multiplier": z[eps], "bits": 20} if secure else
                             {"mechanism": "central", "clip": 1.0, "noise_multiplier": z[eps], "target_epsilon": eps})
            if secure:
                cfg["secagg"] = {"enabled": True}
            t = time.time()
            try:
                res = Simulation(validate(cfg)).run()
            except PrivacyRefused as e:
                rows.append((eps, codec, secure, "refused: " + str(e)[:90]))
                continue
            s = res.summary
            rows.append((eps, codec, secure, f"{s['final']['global/acc']*100:.1f} | {s['bytes_up']} | "
                         f"{s.get('dp/epsilon', float('inf')):.3g} | {time.time()-t:.1f}"))
print("z:", z)
for r in rows:
    print(f"| {'inf' if r[0] is None else r[0]:} | {r[1]} | {'SecAgg' if r[2] else 'plain'} | {r[3]} |")
