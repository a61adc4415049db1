"""diffmoe.interpreter.dot_rows: every interpreted `tl.dot` is computed one output row at a time,
so a row's bits do not depend on its place in the tile or on how many rows the tile has (issue 33:
OpenBLAS's Haswell kernels made them depend on both, and the batch-invariance oracle reported the
shipped kernel for it).

Each BLAS configuration runs in a process of its own (tests/support/dot_rows_probe.py): OpenBLAS reads
OPENBLAS_CORETYPE once, when numpy loads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from diffmoe.interpreter import dot_rows, fixes
from optimized.backend import interpreter_enabled
from hang_bounds import SUBPROCESS_HANG_S

pytestmark = pytest.mark.skipif(not interpreter_enabled(), reason="hooks the Triton interpreter (TRITON_INTERPRET=1)")

BLAS_CONFIGURATIONS = {
    "OPENBLAS_CORETYPE=Haswell": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
    "OPENBLAS-unset": {},
}


def probe(configuration: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env.update(BLAS_CONFIGURATIONS[configuration])
    run = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "dot_rows_probe.py")],
                         env=env, capture_output=True, text=True, timeout=SUBPROCESS_HANG_S)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("configuration", list(BLAS_CONFIGURATIONS))
def test_a_rows_bits_do_not_depend_on_the_other_rows(configuration):
    counts = probe(configuration)
    assert counts["rows"] > 0 and counts["dot_rows"] == 0, counts


def test_triton_s_whole_tile_dot_moves_rows_under_openblas_haswell_kernels():
    """What the row-by-row product is for: the same probe with triton's own dot finds rows that
    moved (178 of 224 measured here); a BLAS whose Haswell kernels do not shows nothing to fix."""
    counts = probe("OPENBLAS_CORETYPE=Haswell")
    if counts["triton"] == 0:
        pytest.skip(f"this OpenBLAS's Haswell kernels sum a row the same way wherever it sits: {counts}")
    assert counts["dot_rows"] == 0 < counts["triton"], counts


def test_matmul_by_rows_is_a_stack_of_one_row_products():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3, 64), dtype=np.float32), rng.standard_normal((5, 64, 16), dtype=np.float32)
    out = dot_rows.matmul_by_rows(a, b, np.float32)  # a batched (3-D) dot
    assert out.shape == (5, 3, 16) and out.dtype == np.float32
    for i in range(5):
        for r in range(3):
            assert np.array_equal(out[i, r].view(np.int32), (a[i, r:r + 1] @ b[i])[0].view(np.int32))
    assert np.allclose(dot_rows.matmul_by_rows(a[0], b[0], np.float32), a[0] @ b[0], rtol=1e-5, atol=1e-5)


def test_installed_beneath_the_fixes_and_kept_when_they_are_suspended():
    from triton.runtime import interpreter

    import optimized.launch  # noqa: F401 - installs the fixes at import under the interpreter

    def method():
        return interpreter.InterpreterBuilder.__dict__["create_dot"]

    assert fixes.installed() and dot_rows.installed()
    rows = method().__wrapped__  # what the fixes wrap: the row-by-row dot, triton's own beneath it
    assert rows is not method() and not hasattr(rows.__wrapped__, "__wrapped__")
    with fixes.suspended():
        assert method() is rows, "suspending the fixes keeps the row-by-row product"
    assert method() is not rows and method().__wrapped__ is rows
    fixes.uninstall()
    assert method() is rows, "uninstalling the fixes keeps it too"
    fixes.install()


def test_uninstall_refuses_while_the_fixes_sit_on_top():
    import optimized.launch  # noqa: F401

    assert fixes.installed()
    with pytest.raises(RuntimeError, match="uninstall them first"):
        dot_rows.uninstall()
    assert dot_rows.installed()
