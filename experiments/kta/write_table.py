"""Tabulate the KTA v2 / FedMD runs beside the summary's numbers -> docs/results/kta_vs_summary.md.

    python experiments/kta/write_table.py [--runs runs] [--out docs/results/kta_vs_summary.md]

Reads ``runs/kta-<config>/metrics.jsonl`` of the configs written by make_configs.py (a
missing run is shown as "not run"; an unfinished one with the rounds it has). Bytes come
from the ledger totals in metrics.jsonl (``bytes/up``, ``bytes/down``: encoded bytes,
wire headers included). Two byte conventions, each named where it is used:

- *one-way*: KTA's upload only (logits, N_ref x C per client per round) against FedAvg's
  upload + download; this is the convention under which the summary's "about 1/1100"
  for ResNet-18 works out;
- *like-for-like*: both directions of both methods (KTA: logits up + soft labels down).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


def load(runs: Path, name: str) -> Optional[list[dict]]:
    p = runs / f"kta-{name}" / "metrics.jsonl"
    if not p.is_file():
        return None
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return recs or None


def config_rounds(name: str) -> int:
    import tomllib

    return int(tomllib.loads((ROOT / "experiments" / "kta" / f"{name}.toml").read_text())["rounds"])


def pct(v: Optional[float]) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}"


def mb(v: Optional[float]) -> str:
    return "" if v is None else f"{v / 1e6:,.2f}"


def last(m: Optional[list[dict]], key: str) -> Optional[float]:
    if not m:
        return None
    v = m[-1].get(key)
    return None if v is None else float(v)


def rounds_of(m: Optional[list[dict]], name: str) -> str:
    if not m:
        return "not run"
    return f"{m[-1]['round']}/{config_rounds(name)}"


def mean_sd(vals: list[float]) -> str:
    if not vals:
        return ""
    if len(vals) == 1:
        return f"{100 * vals[0]:.2f} (1 seed)"
    return f"{100 * statistics.mean(vals):.2f} +- {100 * statistics.stdev(vals):.2f} (n={len(vals)})"


KEPT = " (kept from the previous table: run folder not found)"


def keep_previous(new: list[str], old_text: str) -> list[str]:
    """Rows that read "not run" now but had values in the previous table keep those values.

    Run folders are not committed, so a rerun of this script on a clean checkout (or after
    ``runs/`` was cleaned) would otherwise blank results that were measured. A row is matched
    by its section heading and first cell; a kept row says so in its last cell. Sums and
    ratios below a table are computed from the runs found only.
    """
    old: dict[tuple[str, str], str] = {}
    section = ""
    for line in old_text.splitlines():
        if line.startswith("## "):
            section = line
        elif line.startswith("| "):
            old[(section, line.split("|")[1].strip())] = line
    out, section = [], ""
    for line in new:
        if line.startswith("## "):
            section = line
        elif line.startswith("| ") and "| not run |" in line:
            prev = old.get((section, line.split("|")[1].strip()))
            if prev is not None and "| not run |" not in prev:
                line = prev if KEPT in prev else prev.rstrip().removesuffix("|").rstrip() + KEPT + " |"
        out.append(line)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "kta_vs_summary.md"))
    args = ap.parse_args(argv)
    runs = Path(args.runs)
    L: list[str] = [
        "# KTA v2 and FedMD: lowband vs the summary", "",
        f"Written by `python experiments/kta/write_table.py` on {time.strftime('%Y-%m-%d %H:%M')} from "
        f"`{runs}`. Accuracies in %; `node_global` = each client's model on the global CIFAR-10 test set, "
        "mean over clients; `personal` = each client's model on its own local test split (sample-weighted); "
        "FedAvg/FedProx `global` = the global model on the test set. Bytes are the ledger's encoded bytes "
        "(wire headers included), 1 MB = 10^6 bytes. *rounds* = rounds done / planned.", "",
    ]

    # ---------------------------------------------------------------- headline
    L += ["## CIFAR-10, SimpleCNN, Dirichlet 0.5, 10 clients, 10 rounds", "",
          "| run | rounds | node_global | personal | global | up MB | down MB | total MB | summary |",
          "|---|---|---|---|---|---|---|---|---|"]
    rows = [("KTA v2", "cifar10_simplecnn_kta_s0", "about 49%, < 10 MB"),
            ("KTA v2, fp16 links", "cifar10_simplecnn_kta_fp16_s0", ""),
            ("local-only", "cifar10_simplecnn_local_s0", "below KTA"),
            ("FedAvg", "cifar10_simplecnn_fedavg_s0", "below KTA"),
            ("FedProx (mu 0.01)", "cifar10_simplecnn_fedprox_s0", "below KTA")]
    for label, name, paper in rows:
        m = load(runs, name)
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {pct(last(m, 'global/acc'))} | "
                 f"{mb(last(m, 'bytes/up'))} | {mb(last(m, 'bytes/down'))} | {mb(last(m, 'bytes/total'))} | {paper} |")
    kta, fa = load(runs, "cifar10_simplecnn_kta_s0"), load(runs, "cifar10_simplecnn_fedavg_s0")
    L.append("")
    if kta and fa and kta[-1]["round"] == fa[-1]["round"]:
        ku, kt, ft = last(kta, "bytes/up"), last(kta, "bytes/total"), last(fa, "bytes/total")
        L += [f"Traffic ratio FedAvg : KTA v2 over the same {kta[-1]['round']} rounds (same partition): "
              f"**one-way** (KTA upload vs FedAvg up+down) {ft / ku:,.1f}x (1/{ft / ku:,.0f}); "
              f"**like-for-like** (both directions) {ft / kt:,.1f}x (1/{ft / kt:,.1f}).", ""]

    # ---------------------------------------------------------------- seeds and uniform ablation
    L += ["## Similarity weighting (next check 1): uniform weights vs full KTA, per seed", "",
          "| seed | KTA v2 | uniform weights | drop (KTA - uniform) | local-only | KTA personal | uniform personal |",
          "|---|---|---|---|---|---|---|"]
    drops, accs_k, accs_u, accs_l, pdrops = [], [], [], [], []
    for s in (0, 1, 2):
        mk, mu, ml = (load(runs, f"cifar10_simplecnn_{a}_s{s}") for a in ("kta", "kta_uniform", "local"))
        k, u, lo = last(mk, "node_global/acc"), last(mu, "node_global/acc"), last(ml, "node_global/acc")
        kp, up = last(mk, "personal/acc_weighted"), last(mu, "personal/acc_weighted")
        done = (mk and mu and mk[-1]["round"] == mu[-1]["round"] == config_rounds(f"cifar10_simplecnn_kta_s{s}"))
        d = (k - u) if (done and k is not None and u is not None) else None
        if d is not None:
            drops.append(d)
            pdrops.append(kp - up)
        for lst, v, mm in ((accs_k, k, mk), (accs_u, u, mu), (accs_l, lo, ml)):
            if v is not None and mm and mm[-1]["round"] == 10:
                lst.append(v)
        L.append(f"| {s} | {pct(k)} ({rounds_of(mk, f'cifar10_simplecnn_kta_s{s}')}) | {pct(u)} "
                 f"({rounds_of(mu, f'cifar10_simplecnn_kta_uniform_s{s}')}) | {pct(d)} | {pct(lo)} | {pct(kp)} | {pct(up)} |")
    L += ["", f"- KTA v2 node_global over seeds: {mean_sd(accs_k)}; uniform: {mean_sd(accs_u)}; "
          f"local-only: {mean_sd(accs_l)}.",
          f"- Drop of uniform weights vs full KTA (node_global, paired by seed): {mean_sd(drops)} points "
          f"(summary's reading: < 2 points = little benefit, > 5 = mechanism confirmed).",
          f"- Same on personal accuracy: {mean_sd(pdrops)}.", ""]

    # ---------------------------------------------------------------- FedMD and global teacher
    L += ["## FedMD and the global teacher (summary: FedMD collapses to 38%)", "",
          "| run | rounds | node_global | personal | teacher entropy (last) | teacher acc on D_ref (last) |",
          "|---|---|---|---|---|---|"]
    curves = []
    for label, name in (("FedMD (faithful)", "cifar10_simplecnn_fedmd_s0"),
                        ("KTA loop, global teacher", "cifar10_simplecnn_kta_global_s0"),
                        ("KTA v2 (market)", "cifar10_simplecnn_kta_s0"),
                        ("KTA v2, uniform weights", "cifar10_simplecnn_kta_uniform_s0")):
        m = load(runs, name)
        ent = last(m, "alg/ensemble_entropy")
        ent_s = "" if ent is None else f"{ent:.3f}"
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {ent_s} | {pct(last(m, 'alg/teacher_acc'))} |")
        curves.append((label, m))
    L += ["", "Per-round curves (entropy in nats of the teacher's softmax at T = 1, max ln 10 = 2.303; "
          "accuracy = node_global %):", "",
          "| round | " + " | ".join(f"{lab}: entropy / teacher acc / node_global" for lab, _ in curves) + " |",
          "|---|" + "---|" * len(curves)]
    for r in range(0, 11):
        cells = []
        for _, m in curves:
            rec = next((x for x in (m or []) if x["round"] == r), None)
            if rec is None:
                cells.append("")
                continue
            e = rec.get("alg/ensemble_entropy")
            cells.append(f"{'-' if e is None else f'{e:.3f}'} / {pct(rec.get('alg/teacher_acc')) or '-'} / "
                         f"{pct(rec.get('node_global/acc'))}")
        L.append(f"| {r} | " + " | ".join(cells) + " |")
    L.append("")

    # ---------------------------------------------------------------- other ablations
    L += ["## Other ablations (seed 0; compare with KTA v2 seed 0 above)", "",
          "| ablation | rounds | node_global | personal | teacher acc | summary's question |", "|---|---|---|---|---|---|"]
    for label, name, q in (
            ("KTA v2 (reference)", "cifar10_simplecnn_kta_s0", ""),
            ("similarity only (a = 1)", "cifar10_simplecnn_kta_simonly_s0", ""),
            ("accuracy only (S = 1)", "cifar10_simplecnn_kta_acconly_s0", ""),
            ("k = all", "cifar10_simplecnn_kta_kall_s0", "k = 5 vs full neighbourhood"),
            ("D_ref held-out (balanced)", "cifar10_simplecnn_kta_ref_holdout_s0", "check 2 (b)"),
            ("D_ref mismatched (5 classes)", "cifar10_simplecnn_kta_ref_mismatched_s0", "check 2 (c): collapse?"),
            ("N_ref = 500", "cifar10_simplecnn_kta_ref500_s0", "reference-set size"),
            ("T = 0.1", "cifar10_simplecnn_kta_T0.1_s0", "check 3"),
            ("T = 1", "cifar10_simplecnn_kta_T1_s0", "check 3"),
            ("T = 10", "cifar10_simplecnn_kta_T10_s0", "check 3"),
            ("lambda = 0.1", "cifar10_simplecnn_kta_lam0.1_s0", "check 3"),
            ("lambda = 0.9", "cifar10_simplecnn_kta_lam0.9_s0", "check 3"),
            ("mixed: SimpleCNN + cnn_cifar", "cifar10_mixed_kta_s0", "heterogeneous architectures"),
            ("mixed, local-only", "cifar10_mixed_local_s0", "")):
        m = load(runs, name)
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {pct(last(m, 'alg/teacher_acc'))} | {q} |")
    L.append("")

    # ---------------------------------------------------------------- AG News
    L += ["## AG News (test.csv only: 6,000 train / 1,600 test), text_bag, Dirichlet 0.5, 10 clients", "",
          "| run | rounds | node_global | personal | global | total MB | summary |", "|---|---|---|---|---|---|---|"]
    for label, name, paper in (("KTA v2", "agnews_textbag_kta_s0", "89.3% (full AG News)"),
                               ("local-only", "agnews_textbag_local_s0", ""),
                               ("FedAvg", "agnews_textbag_fedavg_s0", "")):
        m = load(runs, name)
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {pct(last(m, 'global/acc'))} | "
                 f"{mb(last(m, 'bytes/total'))} | {paper} |")
    ka, fa2 = load(runs, "agnews_textbag_kta_s0"), load(runs, "agnews_textbag_fedavg_s0")
    if ka and fa2 and ka[-1]["round"] == fa2[-1]["round"]:
        L += ["", f"Traffic ratio FedAvg : KTA v2 (summary: about 300): one-way "
              f"{last(fa2, 'bytes/total') / last(ka, 'bytes/up'):,.0f}x; like-for-like "
              f"{last(fa2, 'bytes/total') / last(ka, 'bytes/total'):,.0f}x."]
    L.append("")

    # ---------------------------------------------------------------- ResNet-18
    L += ["## ResNet-18 on CIFAR-10: traffic from the ledger (summary: about 1/1100) and a reduced run", ""]
    r_k, r_f = load(runs, "cifar10_resnet18_kta_reduced_s0"), load(runs, "cifar10_resnet18_fedavg_reduced_s0")
    s_k = load(runs, "cifar10_simplecnn_kta_s0")
    per = lambda m, key: last(m, key) / (10 * m[-1]["round"]) if m and m[-1]["round"] else None  # noqa: E731
    fu, fd = per(r_f, "bytes/up"), per(r_f, "bytes/down")
    L += ["| quantity (per client per round, bytes) | value |", "|---|---|"]
    L.append(f"| FedAvg ResNet-18 upload (ledger) | {'' if fu is None else f'{fu:,.0f}'} |")
    L.append(f"| FedAvg ResNet-18 download (ledger) | {'' if fd is None else f'{fd:,.0f}'} |")
    for label, m in (("KTA N_ref = 2000 (SimpleCNN run; logits bytes do not depend on the model)", s_k),
                     ("KTA N_ref = 200 (ResNet-18 reduced run)", r_k)):
        ku, kd = per(m, "bytes/up"), per(m, "bytes/down")
        L.append(f"| {label}: upload / download | {'' if ku is None else f'{ku:,.0f} / {kd:,.0f}'} |")
        if fu and ku:
            L.append(f"| ratio FedAvg (up+down) : KTA upload, **one-way** | {(fu + fd) / ku:,.0f} |")
            L.append(f"| ratio FedAvg (up+down) : KTA (up+down), **like-for-like** | {(fu + fd) / (ku + kd):,.0f} |")
    L += ["", f"Reduced ResNet-18 KTA run: {rounds_of(r_k, 'cifar10_resnet18_kta_reduced_s0')} rounds, "
          f"personal accuracy {pct(last(r_k, 'personal/acc_weighted'))}% (10 clients x about 100 images, "
          "N_ref = 200, E = E_d = 1; the summary's 57.7% is a full run, not comparable).", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file():
        L = keep_previous(L, out.read_text())
    out.write_text("\n".join(L) + "\n")
    print("\n".join(L))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
