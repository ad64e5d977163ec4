"""The FP8 golden tables of tests/core/fp8_test.cpp (decoding, encoding) equal PyTorch's conversions."""
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_fp8_golden_table_is_torchs():
    script = ROOT / "scripts" / "gen_fp8_golden.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, "tests/core/fp8_golden.inc differs from torch's: rerun scripts/gen_fp8_golden.py"
