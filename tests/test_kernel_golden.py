"""NTK-DFL and SPARK, every switch and reading, to the byte: the sha256 of the metrics.jsonl of
tiny runs (digits, 6 nodes, 2-3 rounds, one thread), recorded at 7a8e35c before the kernel round
was rewritten as one function over per-method operations. A change of the round's code that
moves any number (a float summed in another order included) fails here; update the digests only
for a change that is meant to move numbers, and say so in its commit."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from lowband.config import validate
from lowband.engine.simulator import Simulation
from test_ntk import _cfg

SPARK_HP = {"k": 40, "lr": 0.05, "taus": [2, 6], "distill_warmup": 0, "distill_rounds": 4,
            "alpha_final": 0.3, "temp_final": 3.0}
SWITCHES = {"taus": [2, 6], "tau_select": "linear", "lr": 0.05, "momentum": 0.5, "distill": True,
            "distill_warmup": 0, "distill_rounds": 4}

#: name -> (algorithm, rounds, hyperparameters, other config keys)
CASES: dict[str, tuple[str, int, dict[str, Any], dict[str, Any]]] = {
    "ntk_true": ("ntk_dfl", 2, {"taus": [3, 8], "tau_select": "true", "lr": 0.05}, {}),
    "ntk_switches": ("ntk_dfl", 2, SWITCHES, {}),
    "ntk_switches_seq": ("ntk_dfl", 2, {**SWITCHES, "order": "sequential"}, {}),
    "ntk_groups_sampled": ("ntk_dfl", 2, {"taus": [2, 6], "tau_select": "evolved", "lr": 0.05, "reply_groups": 2,
                                          "sample_fraction": 0.5}, {}),
    "ntk_projected": ("ntk_dfl", 2, {"taus": [2, 6], "tau_select": "evolved", "lr": 0.05, "projection": "gaussian",
                                     "k": 40}, {}),
    "ntk_projected_full": ("ntk_dfl", 2, {"taus": [2, 6], "tau_select": "evolved", "lr": 0.05,
                                          "projection": "gaussian", "k": 40, "update": "full", "momentum": 0.5}, {}),
    "spark_sum": ("spark", 3, SPARK_HP, {}),
    "spark_tensor": ("spark", 2, {**SPARK_HP, "projection_layout": "tensor"}, {}),
    "spark_module_seq": ("spark", 2, {**SPARK_HP, "projection_layout": "module", "order": "sequential"}, {}),
    "spark_kron": ("spark", 2, {**SPARK_HP, "projection": "kron", "kron_terms": 2}, {}),
    "spark_full_groups": ("spark", 2, {**SPARK_HP, "update": "full", "reply_groups": 2}, {}),
    "spark_full_seq": ("spark", 2, {**SPARK_HP, "update": "full", "order": "sequential", "distill": False}, {}),
    "spark_none": ("spark", 2, {**SPARK_HP, "projection": "none", "k": 1000}, {}),
    "spark_none_seq": ("spark", 2, {**SPARK_HP, "projection": "none", "k": 1000, "order": "sequential",
                                    "tau_select": "true"}, {}),
    "spark_sampled_nocache": ("spark", 2, {**SPARK_HP, "sample_fraction": 0.5, "reply_groups": 3,
                                           "xp_cache_mb": 0, "xp_cache_disk_mb": 0}, {}),
    "spark_fp16cache_linear": ("spark", 2, {**SPARK_HP, "xp_cache_dtype": "float16", "tau_select": "linear"}, {}),
    "spark_A": ("spark", 2, {**SPARK_HP, "distill": False, "momentum": 0.0}, {}),
    "spark_defaults": ("spark", 3, {"k": 40}, {}),
    "spark_fp16_wire": ("spark", 2, SPARK_HP, {"comm": {"by_kind": {"jacobian": "fp16"}}}),
}


def run_case(root: Path, name: str) -> Simulation:
    alg, rounds, hp, extra = CASES[name]
    cfg = {**_cfg(root / name, alg, rounds, **hp), **extra}
    sim = Simulation(validate(cfg))
    sim.run()
    return sim


def metrics_sha(sim: Simulation) -> str:
    return hashlib.sha256((Path(sim.exp.run_dir()) / "metrics.jsonl").read_bytes()).hexdigest()


GOLDEN: dict[str, str] = {
    "ntk_groups_sampled": "9fad95d6860ef978648664a81546e18c0e33e3a5fb5400e14822934bc576349b",
    "ntk_projected": "44aa2757856d1b967971bcd5f0e3d0007b7d30dfa14b20f43b386bbd95e758f1",
    "ntk_projected_full": "9b7380e3b250b1eec7dee615638d3285eca7bdd84192471c72b3305dfb37de6c",
    "ntk_switches": "eb8285b5576bee071e068f2daa03afd6f7476df326ef182528abc95ec9bbf3c6",
    "ntk_switches_seq": "b73ccfdbb7aa247eea12770d06e6b0fb436dfa789c171a51aa9c6cdf769cabfa",
    "ntk_true": "57ed7e749be07b63e54487462776d111e0923ab18eab25d12d7d048032815708",
    "spark_A": "44aa2757856d1b967971bcd5f0e3d0007b7d30dfa14b20f43b386bbd95e758f1",
    "spark_defaults": "c352d836b9fc820d125d3086422fc8ad251589c13bd91dd7e00f27b6b3f64544",
    "spark_fp16_wire": "c5173df0803f598bc2482e21cdb86e0f48036778c8af4a9cf6489c9105935d94",
    "spark_fp16cache_linear": "be4a999a15e477af1ce05877b16154a23cd11c0c0c11442ec2cc1f74d019dbea",
    "spark_full_groups": "c3436a1614358cc974e534039d9672b3921746c8832741a8f847d69f7870c097",
    "spark_full_seq": "56ab33cd343934802d7c4996b637e5be5defd44b5eb1716b64aac50727c9fbaa",
    "spark_kron": "8ff2d18e1e34612a6371822f7d0b71819e74123c415b45ef13f4ce1022adfe2e",
    "spark_module_seq": "edf22571ba4a51b1b90262905aaa2a9d15a894f0fd9a21b20f14c5277f076cc2",
    "spark_none": "5c285f0c5f5bcfba95fe7e242ec16389ffc9eab9d7d1766d68c19a6315c9a752",
    "spark_none_seq": "507b4c641364383a81b0ed8bcdd3275883c3a9d08db79a09bd9c516f2c55a82a",
    "spark_sampled_nocache": "86360e3b1201c3325cdc6b3292ef6facd984bf9f9da2beec9122ab63f0d9d007",
    "spark_sum": "c7ad56f22cbcabcadf9707d645fb4168e0fbb4a24306018f29acda8738cae8dd",
    "spark_tensor": "779f54cc907945b66bea80ebe12dc6e2a9decff7c3543ab28fd0fb9165408a06",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_metrics_are_byte_identical_to_the_recorded_ones(tmp_path: Path, name: str) -> None:
    assert metrics_sha(run_case(tmp_path, name)) == GOLDEN[name]
