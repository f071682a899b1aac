"""pytest setup for tests/python: the binding from python/ of this checkout,
and loud reporting of anything that was not tested (torch missing, or
requests the fast path declined and the reference answered instead)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    import torch  # noqa: F401
    TORCH_ERROR = None
except Exception as e:  # ImportError, or a broken install
    torch = None
    TORCH_ERROR = f"{type(e).__name__}: {e}"

TORCH_SKIP_REASON = (f"torch is not importable ({TORCH_ERROR}); the PyTorch conformance suite "
                     "needs python3-torch (Debian), which scripts/setup.sh test installs")

# (test id, message) for every forward the fast path declined with
# MHA_E_UNSUPPORTED; filled by test_parity.run_paths.
FAST_DECLINED = []


def pytest_report_header(config):
    if TORCH_ERROR:
        return f"mha: {TORCH_SKIP_REASON}"
    import numpy
    return f"mha: torch {torch.__version__}, numpy {numpy.__version__}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    if TORCH_ERROR:
        tr.write_sep("!", "PyTorch conformance suite SKIPPED", yellow=True)
        tr.write_line(TORCH_SKIP_REASON)
    if FAST_DECLINED:
        reasons = sorted({m for _, m in FAST_DECLINED})
        tr.write_sep("-", f"fast path declined {len(FAST_DECLINED)} parity requests "
                          "(checked through MHA_PATH_AUTO's reference fallback instead)")
        for m in reasons:
            tr.write_line(f"  {m}")
