"""pytest setup for tests/python: the binding from python/ of this checkout
(build/libmha.so unless MHA_LIBRARY names another), and loud reporting of
anything that was not tested.

Missing dependencies: a test (or module) that needs numpy or torch calls
require(name); when the module cannot be imported it is skipped with a
reason starting "missing dependency", counted in pytest's closing line.
Under CI=true such a skip fails the run instead (the test is reported as
failed, naming the module), so a CI machine without torch cannot pass by
skipping the ~120 PyTorch parity tests.
"""
import importlib
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("MHA_LIBRARY", os.path.join(ROOT, "build", "libmha.so"))

MISSING = "missing dependency"
CI = os.environ.get("CI", "").lower() == "true"
_HOW = {"torch": "python3-torch", "numpy": "python3-numpy", "pip": "python3-pip",
        "setuptools": "python3-setuptools"}


def _import(name, find_only=False):
    """(module, None) or (None, "ImportError: ..."); find_only: the module's
    spec instead, for tools a subprocess imports (setuptools must not be
    imported into a process that already imported pip)."""
    try:
        if find_only:
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise ImportError(f"no module named {name!r}")
            return spec, None
        return importlib.import_module(name), None
    except Exception as e:  # ImportError, or a broken install
        return None, f"{type(e).__name__}: {e}"


def missing_reason(name, error):
    return (f"{MISSING} {name}: not importable ({error}); install {_HOW.get(name, name)} "
            "(Debian; scripts/setup.sh test installs it)")


def require(name, find_only=False):
    """The imported module, or a skip of the calling test (or module, when
    called at import time) whose reason names it; fails under CI=true."""
    mod, error = _import(name, find_only)
    if mod is None:
        pytest.skip(missing_reason(name, error), allow_module_level=True)
    return mod


torch, TORCH_ERROR = _import("torch")
TORCH_SKIP_REASON = missing_reason("torch", TORCH_ERROR) if TORCH_ERROR else ""

# (test id, message) for every forward the fast path declined with
# MHA_E_UNSUPPORTED; filled by test_parity.run_paths.
FAST_DECLINED = []


def _skip_reason(report):
    lr = report.longrepr
    reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return reason.removeprefix("Skipped: ")


def _fail_missing_dependency_in_ci(report):
    """Under CI=true, a skip for a missing dependency becomes a failure."""
    if not (CI and report.skipped):
        return
    reason = _skip_reason(report)
    if MISSING not in reason:
        return
    report.outcome = "failed"
    report.longrepr = f"CI=true: a missing dependency fails the run. {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing_dependency_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_missing_dependency_in_ci(outcome.get_result())


def pytest_report_header(config):
    lines = [f"mha: MHA_LIBRARY={os.environ['MHA_LIBRARY']}, CI={'true' if CI else 'not set'}"]
    numpy, numpy_error = _import("numpy")
    for name, mod, error in (("numpy", numpy, numpy_error), ("torch", torch, TORCH_ERROR)):
        lines.append(f"mha: {name} {mod.__version__}" if mod else f"mha: {missing_reason(name, error)}")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    skipped = [r for r in tr.stats.get("skipped", []) if MISSING in _skip_reason(r)]
    if skipped:
        tr.write_sep("!", f"{len(skipped)} tests or modules SKIPPED for a missing dependency", yellow=True)
        for reason in sorted({_skip_reason(r) for r in skipped}):
            tr.write_line(reason)
    if FAST_DECLINED:
        reasons = sorted({m for _, m in FAST_DECLINED})
        tr.write_sep("-", f"fast path declined {len(FAST_DECLINED)} parity requests "
                          "(checked through MHA_PATH_AUTO's reference fallback instead)")
        for m in reasons:
            tr.write_line(f"  {m}")


def _kernel_sets():
    """The kernel sets this CPU runs (MHA_KERNELS values): the reference,
    scalar, and the SIMD ones its flags allow."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    ks = ["reference", "scalar"]
    if " avx2" in flags and " fma" in flags:
        ks.append("avx2")
    if " avx512f" in flags:
        ks.append("avx512")
    return ks


KERNELS = _kernel_sets()


@pytest.fixture(params=KERNELS)
def kernels(request, monkeypatch):
    """Each test run once per kernel set (MHA_KERNELS is read at every call)."""
    monkeypatch.setenv("MHA_KERNELS", request.param)
    return request.param
