"""Shared pytest fixtures: where the serval binary and the test models are."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def serval_binary() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SERVAL_BINARY", REPO / "build" / "serval"))


def models_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SERVAL_MODELS", REPO.parent / "shared" / "models"))


@pytest.fixture(scope="session")
def serval():
    binary = serval_binary()
    if not binary.exists():
        pytest.fail(f"{binary} not found: build first (scripts/build.sh) or set SERVAL_BINARY")
    return binary


@pytest.fixture(scope="session")
def models():
    d = models_dir()
    if not (d / "stories260K").is_dir():
        pytest.fail(f"test models not found in {d}: set SERVAL_MODELS to the shared/models folder")
    return d


def smollm2_path() -> pathlib.Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), where scripts/fetch-smollm2.py puts it."""
    if os.environ.get("SERVAL_SMOLLM2"):
        return pathlib.Path(os.environ["SERVAL_SMOLLM2"])
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return cache / "serval" / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2():
    """A real trained model (docs/MODELS.md): fetched by the test setup, never by a test."""
    path = smollm2_path()
    if not path.is_file():
        pytest.fail(f"SmolLM2 not found at {path}: run scripts/fetch-smollm2.py (scripts/install-deps.sh "
                    "runs it) or set SERVAL_SMOLLM2 to the .gguf")
    return path


def run_serval(binary, *args, check=True, timeout=300, input=None):
    """Runs serval with args; returns CompletedProcess with text stdout/stderr."""
    proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"serval {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stderr}")
    return proc
