"""docs/results/kta_vs_summary.md is rendered from the results store alone
(experiments/kta/write_table.py): no run folder, no Markdown read back."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "kta_vs_summary.md"
STORE = ROOT / "docs" / "results" / "records"


def _module():
    spec = importlib.util.spec_from_file_location("kta_write_table", ROOT / "experiments" / "kta" / "write_table.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_the_page_is_rendered_from_the_store_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In an empty folder (no run folder anywhere), the committed records render the page."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "kta_vs_summary.md"
    assert _module().main(["--store", str(STORE), "--out", str(out)]) == 0
    assert out.read_text() == PAGE.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kta_vs_summary.md"]


def test_a_changed_record_changes_the_page_and_a_measured_one_is_named(tmp_path: Path) -> None:
    """The page follows its records: a record replaced by a measured one changes its rows and
    the prose numbers derived from it, and the page names it as measured; a config without a
    record is "not run", never a number kept from an earlier page."""
    store = tmp_path / "records"
    shutil.copytree(STORE / "kta", store / "kta")
    rec = store / "kta" / "cifar10_simplecnn_kta_T10_s0" / "seed-0.jsonl"
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    lines[0]["kind"] = "measured"
    lines[-1]["metrics"]["node_global/acc"] = 0.4321
    rec.write_text("".join(json.dumps(x) + "\n" for x in lines))
    shutil.rmtree(store / "kta" / "cifar10_simplecnn_kta_lam0.9_s0")
    mod = _module()
    page = mod.render(store)
    assert "| T = 10 | 10/10 | 43.21 |" in page and "40.79 /\n  43.21;" in page  # the row and the reading
    assert "measured: `cifar10_simplecnn_kta_T10_s0`" in page
    assert "| lambda = 0.9 | not run |" in page


def test_imported_records_are_not_taken_for_measured_ones() -> None:
    """The generic table (`lowband reproduce kta`) and --verify read measured records only:
    the imported KTA records are shown as imported by write_table.py, never as measured."""
    from lowband.results.store import Store

    store = Store(STORE, "kta")
    cfg = "experiments/kta/cifar10_simplecnn_kta_s0.toml"
    assert store.records(cfg) == {}
    assert store.records(cfg, imported=True)[0].kind == "imported"
