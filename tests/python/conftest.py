"""pytest setup for the Python package's tests (ctest's test_python runs them): the package from
python/ of this checkout, the library and CLI of the build ctest names (DTRAIN_LIBRARY,
DTRAIN_BIN), a small slice of Fashion-MNIST as numpy arrays and as IDX files."""
import gzip
import os
import struct
import sys

import numpy as np
import pytest

SRC = os.environ.get("DTRAIN_SRC") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "python"))
if os.environ.get("DTRAIN_LIBRARY"):  # absolute: the tests' processes run in other folders
    os.environ["DTRAIN_LIBRARY"] = os.path.abspath(os.environ["DTRAIN_LIBRARY"])
FASHION = os.environ.get("FASHION", "/usr/share/datasets/fashion-mnist")


def _idx(path, offset, count, size):
    with gzip.open(path) as f:
        f.read(offset)
        return np.frombuffer(f.read(count * size), np.uint8)


@pytest.fixture(scope="session")
def src():
    return SRC


@pytest.fixture(scope="session")
def bin_path():
    return os.environ.get("DTRAIN_BIN") or os.path.join(SRC, "build", "dtrain")


@pytest.fixture(scope="session")
def fashion(tmp_path_factory):
    """(x, y, tx, ty, idx_dir): the first 1024 training and 256 test images, uint8 NHWC, and the
    same bytes as uncompressed IDX files (what `dtrain train --data` reads)."""
    if not os.path.exists(os.path.join(FASHION, "train-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST not found in %s (Debian package dataset-fashion-mnist)" % FASHION)
    d = tmp_path_factory.mktemp("fashion")
    out = []
    for prefix, n in (("train", 1024), ("t10k", 256)):
        x = _idx(os.path.join(FASHION, prefix + "-images-idx3-ubyte.gz"), 16, n, 784).reshape(n, 28, 28, 1)
        y = _idx(os.path.join(FASHION, prefix + "-labels-idx1-ubyte.gz"), 8, n, 1).astype(np.int32)
        with open(d / (prefix + "-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + x.tobytes())
        with open(d / (prefix + "-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + y.astype(np.uint8).tobytes())
        out += [x, y]
    return out[0], out[1], out[2], out[3], str(d)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "tiny.model"
    p.write_text("model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2 padding=same\nrelu\nflatten\n"
                 "dense units=10\n")
    return str(p)


def cli_env():
    """The environment for a CLI process: without the sanitizer runtime preloaded for python3 (the
    sanitizer build's CLI links its own)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def python_cmd():
    """python3 as a CLI process starts it: with the sanitizer runtime again where the tests run so."""
    pre = os.environ.get("DTRAIN_PRELOAD")
    return (["env", "LD_PRELOAD=" + pre] if pre else []) + [sys.executable]
