"""The binding as an installed package: python/pyproject.toml installs
offline with Debian's setuptools and pip, and the installed package,
imported from outside the repository, finds libmha.so through
MHA_LIBRARY or in <prefix>/lib; the loader's search order on its own."""
import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, require

require("numpy")
import mha  # noqa: E402
from mha import _lib  # noqa: E402

BUILD_LIB = os.path.join(ROOT, "build", "libmha.so")

# y of a random one-head-per-4-columns layer, checked against numpy from the
# math (softmax(q k^T / sqrt(d_k)) v per head, then W_O), in a fresh process.
CHECK = textwrap.dedent("""
    import sys, numpy as np, mha
    rng = np.random.default_rng(0)
    layer = mha.Layer(d_model=8, n_heads=2)
    w = {n: rng.uniform(-0.5, 0.5, a.shape).astype(np.float32) for n, a in layer.weights().items()}
    layer.set_weights(w)
    x = rng.standard_normal((1, 5, 8)).astype(np.float32)
    q, k, v = (x[0] @ w["w_" + n] + w["b_" + n] for n in "qkv")
    z = []
    for r in range(2):
        s = q[:, 4 * r:4 * r + 4] @ k[:, 4 * r:4 * r + 4].T / 2.0
        p = np.exp(s - s.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
        z.append(p @ v[:, 4 * r:4 * r + 4])
    want = np.concatenate(z, 1) @ w["w_o"] + w["b_o"]
    err = float(np.abs(layer.forward(x)[0] - want).max())
    assert err < 1e-5, err
    print(mha.__file__, mha._lib.path, mha._lib.found_by, sep="\\n")
""")


def run_outside(cwd, site, env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MHA_LIBRARY", "PYTHONPATH")}
    env.update(PYTHONPATH=site, **env_extra)
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("\n")[:3]


def test_pip_install_into_a_prefix_then_import_from_outside_the_repository(tmp_path):
    require("pip", find_only=True)
    require("setuptools", find_only=True)  # imported by pip in the subprocess
    src, prefix = tmp_path / "src", tmp_path / "prefix"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore",
               PIP_NO_INDEX="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                           "--prefix", str(prefix), str(src)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    inits = glob.glob(str(prefix / "**" / "mha" / "__init__.py"), recursive=True)
    assert len(inits) == 1, inits
    site = os.path.dirname(os.path.dirname(inits[0]))
    assert os.path.basename(site) in ("site-packages", "dist-packages"), site
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # 1. MHA_LIBRARY names the library
    file, path, how = run_outside(outside, site, {"MHA_LIBRARY": BUILD_LIB})
    assert file == inits[0] and path == BUILD_LIB and how == "MHA_LIBRARY"
    # 2. the library in <prefix>/lib, as `make install` puts it (no MHA_LIBRARY)
    os.makedirs(prefix / "lib", exist_ok=True)
    shutil.copy(BUILD_LIB, prefix / "lib" / "libmha.so")
    file, path, how = run_outside(outside, site, {})
    assert path == str(prefix / "lib" / "libmha.so") and how == "installed prefix", (path, how)


def fake_tree(root, package_layout):
    """A package directory at root/<package_layout>/mha (not created) and
    its would-be libdir; returns the package dir."""
    return str(root / package_layout / "mha")


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return str(path)


@pytest.mark.parametrize("layout,libdir", [
    ("lib/python3.11/site-packages", "lib"),
    ("lib/python3/dist-packages", "lib"),
    ("local/lib/python3.11/dist-packages", "lib"),  # Debian pip's --prefix layout
    ("local/lib/python3.11/dist-packages", "local/lib"),
])
def test_the_loader_looks_next_to_the_installed_package(tmp_path, layout, libdir):
    pkg, repo = fake_tree(tmp_path / "p", layout), str(tmp_path / "repo")
    touch(os.path.join(repo, "build", "libmha.so"))
    versioned = touch(tmp_path / "p" / libdir / "libmha.so.0")  # only the soname link
    assert _lib.find_library({}, pkg, repo) == (versioned, "installed prefix")
    plain = touch(tmp_path / "p" / libdir / "libmha.so")
    assert _lib.find_library({}, pkg, repo) == (plain, "installed prefix")
    # MHA_LIBRARY first
    other = touch(tmp_path / "other" / "libmha.so")
    assert _lib.find_library({"MHA_LIBRARY": other}, pkg, repo) == (other, "MHA_LIBRARY")


def test_the_loader_order_and_its_errors(tmp_path):
    repo = str(tmp_path / "repo")
    checkout_pkg = os.path.join(repo, "python", "mha")  # not an installed layout
    with pytest.raises(ImportError, match="MHA_LIBRARY=/nonexistent/libmha.so does not exist"):
        _lib.find_library({"MHA_LIBRARY": "/nonexistent/libmha.so"}, checkout_pkg, repo)
    system = any(_can_load(n) for n in _lib._system_names())
    if not system:  # no libmha installed system-wide here: the build tree, then nothing
        with pytest.raises(ImportError, match=r"libmha.so not found; tried .*repo/build/libmha.so"):
            _lib.find_library({}, checkout_pkg, repo)
        build = touch(os.path.join(repo, "build", "libmha.so"))
        assert _lib.find_library({}, checkout_pkg, repo) == (build, "build tree")
    # a library the system loader can find (LD_LIBRARY_PATH) comes before the build tree
    libdir = tmp_path / "syslib"
    libdir.mkdir()
    shutil.copy(BUILD_LIB, libdir / "libmha.so.0")
    code = ("from mha import _lib; print(*_lib.find_library({}, %r, %r), sep='|')"
            % (checkout_pkg, repo))
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split("|")[1] == "system loader", out.stdout


def _can_load(name):
    try:
        import ctypes
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def test_the_repository_checkout_loads_the_build_tree():
    assert os.path.samefile(_lib.path, os.environ.get("MHA_LIBRARY", BUILD_LIB))
    assert mha.Layer(8, 2).n_heads == 2
