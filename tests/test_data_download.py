"""Checksummed downloads against a local HTTP mirror (a served copy of shared/data),
corrupted mirrors, optional files, and ``verify``."""

from __future__ import annotations

import http.server
import socket
import threading
from functools import partial
from pathlib import Path
from typing import Iterator

import pytest

from lowband.data import DatasetError, download, load_dataset, verify
from lowband.data.download import url_for
from lowband.data.files import FILES
from lowband.data.sources import clear_cache

class _Mirror:
    """A thread serving ``root`` on 127.0.0.1:<ephemeral>, recording requested paths."""

    def __init__(self, root: Path) -> None:
        self.requests: list[str] = []
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                mirror.requests.append(self.path)
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def mirror(shared_data: Path) -> Iterator[_Mirror]:
    m = _Mirror(shared_data)
    yield m
    m.close()


def _corrupt_mirror(shared_data: Path, tmp: Path, name: str, mutate, labels_only: bool = False) -> Path:
    """A mirror of shared/fashion-mnist (symlinks, no copying) whose ``name`` is ``mutate``d."""
    root = tmp / "mirror"
    (root / "fashion-mnist").mkdir(parents=True)
    for f in (shared_data / "fashion-mnist").iterdir():
        if f.name == name:
            (root / "fashion-mnist" / name).write_bytes(mutate(f.read_bytes()))
        elif not labels_only or "labels" in f.name:
            (root / "fashion-mnist" / f.name).symlink_to(f)
    return root


def test_download_from_mirror_checks_md5_and_is_idempotent(tmp_path: Path, mirror: _Mirror) -> None:
    dest = tmp_path / "data"
    paths = download("mnist", dest, base_url=mirror.url + "/")
    assert [p.relative_to(dest).as_posix() for p in paths] == [s.relpath for s in FILES["mnist"]]
    assert sorted(mirror.requests) == sorted("/" + s.relpath for s in FILES["mnist"])
    assert not list(dest.rglob("*.part"))
    mirror.requests.clear()
    again = download("mnist", dest, base_url=mirror.url)
    assert again == paths and mirror.requests == []  # good files are not fetched again
    download("mnist", dest, base_url=mirror.url, force=True)
    assert len(mirror.requests) == 4
    clear_cache()
    ds = load_dataset("mnist", dest)
    assert len(ds.train_y) == 60000 and len(ds.test_y) == 10000
    assert all(c.ok for c in verify("mnist", dest))


def test_a_present_file_with_a_wrong_md5_is_replaced(tmp_path: Path, mirror: _Mirror) -> None:
    dest = tmp_path / "data"
    download("mnist", dest, base_url=mirror.url)
    victim = dest / "mnist" / "t10k-labels-idx1-ubyte.gz"
    victim.write_bytes(b"garbage")
    assert [c.status for c in verify("mnist", dest)].count("bad") == 1
    mirror.requests.clear()
    download("mnist", dest, base_url=mirror.url)
    assert mirror.requests == ["/mnist/t10k-labels-idx1-ubyte.gz"]
    assert all(c.ok for c in verify("mnist", dest))


@pytest.mark.parametrize("mutate, expect", [
    (lambda b: b[: len(b) // 2], "bytes, expected"),  # truncated: caught by size
    (lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:], "md5"),  # same size, altered
])
def test_corrupted_mirror_file_raises_and_leaves_nothing(tmp_path: Path, shared_data: Path, mutate, expect: str) -> None:
    root = _corrupt_mirror(shared_data, tmp_path, "t10k-labels-idx1-ubyte.gz", mutate)
    m = _Mirror(root)
    dest = tmp_path / "data"
    try:
        with pytest.raises(DatasetError) as e:
            download("fashion_mnist", dest, base_url=m.url)
    finally:
        m.close()
    msg = str(e.value)
    assert "\n" not in msg and "t10k-labels-idx1-ubyte.gz" in msg and expect in msg and "deleted" in msg
    if expect == "md5":
        assert "bb300cfdad3c16e7a12a480ee83cd310" in msg  # the expected md5 is named
    assert not list(dest.rglob("t10k-labels*")), "a corrupt download was left behind"
    assert (dest / "fashion-mnist" / "train-labels-idx1-ubyte.gz").is_file()  # good earlier file kept


def test_missing_required_file_on_mirror_is_a_clear_error(tmp_path: Path, shared_data: Path) -> None:
    root = _corrupt_mirror(shared_data, tmp_path, "t10k-labels-idx1-ubyte.gz", lambda b: b, labels_only=True)
    m = _Mirror(root)  # has no image files
    try:
        with pytest.raises(DatasetError, match=r"HTTP 404.*--mirror") as e:
            download("fashion_mnist", tmp_path / "data", base_url=m.url)
    finally:
        m.close()
    assert "train-images-idx3-ubyte.gz" in str(e.value)
    assert not list((tmp_path / "data").rglob("*.part"))


def test_ag_news_optional_train_csv_skipped_and_env_mirror_used(
    tmp_path: Path, mirror: _Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOWBAND_MIRROR", mirror.url)
    dest = tmp_path / "data"
    with pytest.warns(UserWarning, match="train.csv"):
        got = download("ag_news", dest)
    assert sorted(p.name for p in got) == ["classes.txt", "test.csv"]
    assert "/ag_news/train.csv" in mirror.requests
    checks = {c.path.name: c.status for c in verify("ag_news", dest)}
    assert checks == {"train.csv": "missing", "test.csv": "ok", "classes.txt": "ok"}


def test_load_dataset_download_true_fetches_missing_files(
    tmp_path: Path, mirror: _Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOWBAND_MIRROR", mirror.url)
    clear_cache()
    with pytest.warns(UserWarning, match="optional file ag_news/train.csv"):
        ds = load_dataset("ag_news", tmp_path / "data", download=True)
    assert len(ds.train_y) == 6000 and (tmp_path / "data" / "ag_news" / "test.csv").is_file()


def test_unreachable_host_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DatasetError) as e:
        download("mnist", tmp_path, base_url=f"http://127.0.0.1:{port}", timeout=5)
    msg = str(e.value)
    assert "\n" not in msg and "could not download mnist/train-images-idx3-ubyte.gz" in msg
    assert not list(tmp_path.rglob("*.part"))


def test_url_layout_and_name_errors() -> None:
    spec = FILES["fashion_mnist"][0]
    assert url_for(spec, None).startswith("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/")
    assert url_for(spec, "https://m.example/x/") == "https://m.example/x/fashion-mnist/train-images-idx3-ubyte.gz"
    assert FILES["cifar10"][0].md5 == "c58f30108f718f92721af3b95e74349a"
    assert FILES["mnist"][0].url.startswith("https://ossci-datasets.s3.amazonaws.com/mnist/")
    with pytest.raises(ValueError, match="needs no files"):
        download("digits", "/nonexistent")
    with pytest.raises(ValueError, match="unknown dataset"):
        verify("imagenet", "/nonexistent")


def test_verify_shared_copies(shared_data: Path, tmp_path: Path) -> None:
    for name in ("mnist", "fashion_mnist"):
        assert all(c.ok for c in verify(name, shared_data))
    assert [c.status for c in verify("cifar10", tmp_path)] == ["missing"]
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not a tar")
    [bad] = verify("cifar10", tmp_path)
    assert bad.status == "bad" and "corrupt" in bad.detail


@pytest.mark.slow
def test_cifar10_structure_verified_and_offline_rebuild_downloadable(shared_data: Path, tmp_path: Path, mirror: _Mirror) -> None:
    [check] = verify("cifar10", shared_data)
    assert check.ok and "49873 train / 9966 test" in check.detail and "offline rebuild" in check.detail
    [path] = download("cifar10", tmp_path, base_url=mirror.url)  # accepted by its known alt md5
    assert path.stat().st_size == (shared_data / "cifar-10-python.tar.gz").stat().st_size
    path.unlink()  # 169 MB: do not leave it in pytest's kept tmp dirs
