"""Render the KTA v2 / FedMD runs beside the summary's numbers -> docs/results/kta_vs_summary.md.

    python experiments/kta/write_table.py [--store docs/results/records] [--out docs/results/kta_vs_summary.md]

A pure function of the results store (``STORE/kta/<config>/seed-<s>.jsonl``, see
:mod:`lowband.results.store`) and today's configs: record a run of a config written by
make_configs.py (``lowband record import RUN --store docs/results/records --paper kta
--config experiments/kta/<config>.toml``) and render again; a config without a record is
shown as "not run". Nothing is read from run folders or from the page itself. The records
made before the store existed are *imported* (their header's ``provenance``: the page and
commit they were read from, as printed there); the page says which configs are. Bytes come
from the ledger totals in the metrics (``bytes/up``, ``bytes/down``: encoded bytes, wire
headers included). Two byte conventions, each named where it is used:

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
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from lowband.results.record import Record  # noqa: E402
from lowband.results.store import Store  # noqa: E402


#: numbers the page printed that the imported (rounded) records cannot give to the digit
PRINTED = "printed.jsonl"


class Runs:
    """The store's KTA records, one a config (its file stem), read once."""

    def __init__(self, store: Path):
        self.store = Store(store, "kta")
        self.seen: dict[str, Optional[Record]] = {}

    def record(self, name: str) -> Optional[Record]:
        if name not in self.seen:
            recs = self.store.records(f"{name}.toml", imported=True)  # (the stem of the config file)
            self.seen[name] = recs[min(recs)] if recs else None
        return self.seen[name]

    def __call__(self, name: str) -> Optional[list[dict]]:
        rec = self.record(name)
        return (rec.metrics or None) if rec is not None else None

    def derived(self, key: str, computed: str, *names: str) -> str:
        """A number derived from the records of ``names``: ``computed``, unless every one of
        them is imported and the store keeps the number as the page printed it (``printed.jsonl``:
        computed from the unrounded runs, where the rounded imports would move its last digit)."""
        if not all((r := self.record(n)) is not None and r.kind == "imported" for n in names):
            return computed
        path = self.store.dir / PRINTED
        if not hasattr(self, "_printed"):
            lines = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else [{}]
            self._printed = {x["key"]: x["text"] for x in lines[1:]}
        return self._printed.get(key, computed)


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


#: the compute behind the page, as the page recorded it when the runs were made (their records
#: hold no timing: they are imported)
COMPUTE = """**Compute: 1.67 CPU-hours recorded** (about 100 minutes), on this 2-core machine, one
thread per run; added by hand, like the ablation rows below. This page shows the runs of
[`kta.md`](kta.md) sections 1-5, which recorded 56.1 minutes (kta.md's Compute paragraph
without its section 6: 7.5 + 30.0 + 11.7 + 6.9), and the 11 runs of "Other ablations"
below at about 4 minutes each, 44 minutes. The runs with no recorded time that kta.md
lists (local-only, FedAvg, fp16, AG News) are not counted here either. The headline KTA
run's 7.5 minutes is an estimate under load; its wall time bounds the total at 4.04
CPU-hours."""

ABLATIONS = ("Rows run on 2026-11-24 (`lowband run experiments/kta/cifar10_simplecnn_kta_<ablation>_s0.toml`, one "
             "core each, about 4 min per run). The default reference set is N_ref = 2000 (CIFAR-10 train images held "
             "out of the clients' data); with N_ref = 5000 (docs/results/kta.md section 6) node_global is 43.26.")


def provenance_line(runs: Runs) -> str:
    """Which configs' records are imported (and from where), which measured."""
    recs = {n: r for n, r in runs.seen.items() if r is not None}
    imp = sorted(n for n, r in recs.items() if r.kind == "imported")
    measured = sorted(set(recs) - set(imp))
    text = f"Records: {len(recs)} configs"
    if imp:
        prov = sorted({(r.header["provenance"]["page"], r.header["provenance"]["commit"][:7],
                        r.header["provenance"]["date"]) for n, r in recs.items() if n in imp})
        text += (f"; *imported* ({len(imp)}{', all' if not measured else ''}): the values "
                 + "; ".join(f"{p} printed at commit {c} ({d})" for p, c, d in prov)
                 + ", kept as printed because their run folders are gone (accuracies to 0.01 points, MB to 0.01), "
                   "not measured from a run's record")
    if measured:
        text += f"; measured: {', '.join(f'`{n}`' for n in measured)}"
    return text + "."


def reading(runs: Runs) -> list[str]:
    """The reading of the ablations, its numbers taken from the records."""
    def acc(name: str, key: str = "node_global/acc") -> Optional[float]:
        v = last(runs(name), key)
        return None if v is None else 100 * v

    def f(v: Optional[float], fmt: str = "{:.2f}") -> str:
        return "n/a (not run)" if v is None else fmt.format(v)

    ref = acc("cifar10_simplecnn_kta_s0")
    same = [acc(f"cifar10_simplecnn_kta_{a}_s0") for a in ("simonly", "acconly", "kall", "ref_holdout",
                                                            "ref_mismatched")]
    spread = None if ref is None or None in same else max(abs(v - ref) for v in same)  # type: ignore[operator]
    t = [f(acc(f"cifar10_simplecnn_kta_{x}_s0")) for x in ("T0.1", "T1")]
    lam = [f(acc(f"cifar10_simplecnn_kta_lam{x}_s0")) for x in ("0.1", "0.9")]
    p_ref, p_09 = acc("cifar10_simplecnn_kta_s0", "personal/acc_weighted"), acc("cifar10_simplecnn_kta_lam0.9_s0",
                                                                                "personal/acc_weighted")
    cost = None if p_ref is None or p_09 is None else p_ref - p_09
    return [
        "Reading (seed 0, so differences under about 1.5 points, the spread between seeds above, are noise):", "",
        "- **The market's weighting is not where the accuracy comes from at this scale.** Similarity",
        "  only, accuracy only, k = all, a held-out or a 5-class mismatched reference set all land",
        f"  within {f(spread, '{:.1f}')} points of the reference ({f(ref)}), as uniform weights did over three seeds.",
        f"- **The reference set's size is:** N_ref = 500 / 2000 (default) / 5000 give "
        f"{f(acc('cifar10_simplecnn_kta_ref500_s0'))} / {f(ref)} /",
        "  43.26 node_global (46.09 with 5000 and 5 distillation epochs, docs/results/kta.md).",
        f"- **Temperature and lambda:** T = 0.1 / 1 / 2 (default) / 10 give {t[0]} / {t[1]} / {f(ref)} /",
        f"  {f(acc('cifar10_simplecnn_kta_T10_s0'))}; lambda = 0.1 / 0.5 (default) / 0.9 give {lam[0]} / {f(ref)} / "
        f"{lam[1]}, and lambda = 0.9",
        f"  costs {f(cost, '{:.1f}')} points of personal accuracy ({f(p_09)}): too little private cross-entropy. The",
        "  defaults sit at the top of both ranges.", ""]


def _headline(load: Runs) -> list[str]:
    """The headline setting: KTA v2 against local-only, FedAvg and FedProx, and the traffic ratio."""
    L: list[str] = []
    L += ["## CIFAR-10, SimpleCNN, Dirichlet 0.5, 10 clients, 10 rounds", "",
          "| run | rounds | node_global | personal | global | up MB | down MB | total MB | summary |",
          "|---|---|---|---|---|---|---|---|---|"]
    rows = [("KTA v2", "cifar10_simplecnn_kta_s0", "about 49%, < 10 MB"),
            ("KTA v2, fp16 links", "cifar10_simplecnn_kta_fp16_s0", ""),
            ("local-only", "cifar10_simplecnn_local_s0", "below KTA"),
            ("FedAvg", "cifar10_simplecnn_fedavg_s0", "below KTA"),
            ("FedProx (mu 0.01)", "cifar10_simplecnn_fedprox_s0", "below KTA")]
    for label, name, paper in rows:
        m = load(name)
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {pct(last(m, 'global/acc'))} | "
                 f"{mb(last(m, 'bytes/up'))} | {mb(last(m, 'bytes/down'))} | {mb(last(m, 'bytes/total'))} | {paper} |")
    kta, fa = load("cifar10_simplecnn_kta_s0"), load("cifar10_simplecnn_fedavg_s0")
    L.append("")
    if kta and fa and kta[-1]["round"] == fa[-1]["round"]:
        ku, kt, ft = last(kta, "bytes/up"), last(kta, "bytes/total"), last(fa, "bytes/total")
        L += [f"Traffic ratio FedAvg : KTA v2 over the same {kta[-1]['round']} rounds (same partition): "
              f"**one-way** (KTA upload vs FedAvg up+down) {ft / ku:,.1f}x (1/{ft / ku:,.0f}); "
              f"**like-for-like** (both directions) {ft / kt:,.1f}x (1/{ft / kt:,.1f}).", ""]
    return L


def _seeds(load: Runs) -> list[str]:
    """Uniform weights against full KTA, per seed, and their statistics."""
    L: list[str] = []
    L += ["## Similarity weighting (next check 1): uniform weights vs full KTA, per seed", "",
          "| seed | KTA v2 | uniform weights | drop (KTA - uniform) | local-only | KTA personal | uniform personal |",
          "|---|---|---|---|---|---|---|"]
    drops, accs_k, accs_u, accs_l, pdrops = [], [], [], [], []
    for s in (0, 1, 2):
        mk, mu, ml = (load(f"cifar10_simplecnn_{a}_s{s}") for a in ("kta", "kta_uniform", "local"))
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
        pair = (f"cifar10_simplecnn_kta_s{s}", f"cifar10_simplecnn_kta_uniform_s{s}")
        L.append(f"| {s} | {pct(k)} ({rounds_of(mk, pair[0])}) | {pct(u)} ({rounds_of(mu, pair[1])}) | "
                 f"{load.derived(f'drop/seed{s}', pct(d), *pair)} | {pct(lo)} | {pct(kp)} | {pct(up)} |")
    seeds = [f"cifar10_simplecnn_{a}_s{s}" for a in ("kta", "kta_uniform") for s in (0, 1, 2)]
    L += ["", f"- KTA v2 node_global over seeds: {mean_sd(accs_k)}; uniform: "
          f"{load.derived('uniform/mean', mean_sd(accs_u), *seeds[3:])}; local-only: {mean_sd(accs_l)}.",
          f"- Drop of uniform weights vs full KTA (node_global, paired by seed): {mean_sd(drops)} points "
          f"(summary's reading: < 2 points = little benefit, > 5 = mechanism confirmed).",
          f"- Same on personal accuracy: {load.derived('drop/personal', mean_sd(pdrops), *seeds)}.", ""]
    return L


def _fedmd(load: Runs) -> list[str]:
    """FedMD and the global teacher, with their per-round curves."""
    L: list[str] = []
    L += ["## FedMD and the global teacher (summary: FedMD collapses to 38%)", "",
          "| run | rounds | node_global | personal | teacher entropy (last) | teacher acc on D_ref (last) |",
          "|---|---|---|---|---|---|"]
    curves = []
    for label, name in (("FedMD (faithful)", "cifar10_simplecnn_fedmd_s0"),
                        ("KTA loop, global teacher", "cifar10_simplecnn_kta_global_s0"),
                        ("KTA v2 (market)", "cifar10_simplecnn_kta_s0"),
                        ("KTA v2, uniform weights", "cifar10_simplecnn_kta_uniform_s0")):
        m = load(name)
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
    return L


def _ablations(load: Runs) -> list[str]:
    """The other ablations (seed 0) and their reading."""
    L: list[str] = []
    L += ["## Other ablations (seed 0; compare with KTA v2 seed 0 above)", "",
          ABLATIONS, "",
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
        m = load(name)
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {pct(last(m, 'alg/teacher_acc'))} | {q} |")
    L += ["", ""] + reading(load)
    return L


def _agnews(load: Runs) -> list[str]:
    """AG News and its traffic ratio."""
    L: list[str] = []
    L += ["## AG News (test.csv only: 6,000 train / 1,600 test), text_bag, Dirichlet 0.5, 10 clients", "",
          "| run | rounds | node_global | personal | global | total MB | summary |", "|---|---|---|---|---|---|---|"]
    for label, name, paper in (("KTA v2", "agnews_textbag_kta_s0", "89.3% (full AG News)"),
                               ("local-only", "agnews_textbag_local_s0", ""),
                               ("FedAvg", "agnews_textbag_fedavg_s0", "")):
        m = load(name)
        L.append(f"| {label} | {rounds_of(m, name)} | {pct(last(m, 'node_global/acc'))} | "
                 f"{pct(last(m, 'personal/acc_weighted'))} | {pct(last(m, 'global/acc'))} | "
                 f"{mb(last(m, 'bytes/total'))} | {paper} |")
    ka, fa2 = load("agnews_textbag_kta_s0"), load("agnews_textbag_fedavg_s0")
    if ka and fa2 and ka[-1]["round"] == fa2[-1]["round"]:
        ku2 = last(ka, "bytes/up")  # (not printed by the page the imported records come from)
        one_way = load.derived("agnews/one_way", f"{last(fa2, 'bytes/total') / ku2:,.0f}" if ku2 else "",
                               "agnews_textbag_kta_s0", "agnews_textbag_fedavg_s0")
        L += ["", f"Traffic ratio FedAvg : KTA v2 (summary: about 300): one-way "
              f"{one_way}x; like-for-like "
              f"{last(fa2, 'bytes/total') / last(ka, 'bytes/total'):,.0f}x."]
    L.append("")
    return L


def _resnet(load: Runs) -> list[str]:
    """ResNet-18's traffic from the ledger and the reduced run."""
    L: list[str] = []
    L += ["## ResNet-18 on CIFAR-10: traffic from the ledger (summary: about 1/1100) and a reduced run", ""]
    r_k, r_f = load("cifar10_resnet18_kta_reduced_s0"), load("cifar10_resnet18_fedavg_reduced_s0")
    s_k = load("cifar10_simplecnn_kta_s0")
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
    return L


def render(store: Path) -> str:
    """The page, from the store's records and today's configs only."""
    load = Runs(store)
    L: list[str] = [
        "# KTA v2 and FedMD: lowband vs the summary", "",
        "Rendered by `python experiments/kta/write_table.py` from the records in [`records/kta/`](records/kta/) "
        "(nothing else: the same records render the same page). Accuracies in %; `node_global` = each client's model on the global CIFAR-10 test set, "
        "mean over clients; `personal` = each client's model on its own local test split (sample-weighted); "
        "FedAvg/FedProx `global` = the global model on the test set. Bytes are the ledger's encoded bytes "
        "(wire headers included), 1 MB = 10^6 bytes. *rounds* = rounds done / planned.", "",
        "@PROVENANCE@", "", COMPUTE, "",
    ]
    for section in (_headline, _seeds, _fedmd, _ablations, _agnews, _resnet):
        L += section(load)
    L[L.index("@PROVENANCE@")] = provenance_line(load)
    return "\n".join(L) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=str(ROOT / "docs" / "results" / "records"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "kta_vs_summary.md"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(Path(args.store)))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
