"""experiments/kta/write_table.py keeps measured rows whose run folders are gone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("kta_write_table", ROOT / "experiments" / "kta" / "write_table.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_rerun_without_run_folders_keeps_measured_rows(tmp_path: Path) -> None:
    mod = _module()
    out = tmp_path / "kta_vs_summary.md"
    runs = tmp_path / "runs"
    runs.mkdir()
    assert mod.main(["--runs", str(runs), "--out", str(out)]) == 0
    first = out.read_text()
    assert "| KTA v2 | not run |" in first
    # a measured row, as an earlier run of the script with the run folder present wrote it
    measured = "| KTA v2 | 10/10 | 40.79 | 55.10 |  | 1.23 | 1.23 | 2.46 | about 49%, < 10 MB |"
    out.write_text(first.replace(next(line for line in first.splitlines() if line.startswith("| KTA v2 | not run |")),
                                 measured))
    assert mod.main(["--runs", str(runs), "--out", str(out)]) == 0
    again = out.read_text()
    kept = [line for line in again.splitlines() if line.startswith("| KTA v2 |")]
    assert kept[0] == measured.removesuffix(" |") + mod.KEPT + " |", kept
    assert kept[1].startswith("| KTA v2 | not run |")  # AG News: another section, never measured
    # kept once, not again on every rerun; rows never measured stay "not run"
    assert mod.main(["--runs", str(runs), "--out", str(out)]) == 0
    assert out.read_text().count(mod.KEPT) == 1
    assert "| FedAvg | not run |" in out.read_text()
