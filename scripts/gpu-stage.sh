#!/usr/bin/env bash
# Stages what scripts/gpu-check.sh needs into a folder that the device tool
# carries to the GPU machine (default: /work/main/.gpu): the binaries of a
# build made with -DSERVAL_MARCH=x86-64-v3, the Debian shared libraries the
# GPU host lacks (compressed: the carry limit is 64 MiB), stories260K.
# Usage: scripts/gpu-stage.sh BUILD_DIR [DEST]
set -euo pipefail
BUILD=${1:?build dir}
DEST=${2:-/work/main/.gpu}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$DEST" && mkdir -p "$DEST/models" "$DEST/libstage"
strip -o "$DEST/serval" "$BUILD/serval"
strip -o "$DEST/serval_tests" "$BUILD/serval_tests"
for b in "$BUILD"/bench/cuda_*_bench; do [ -f "$b" ] && strip -o "$DEST/$(basename "$b")" "$b"; done
cp "$ROOT/scripts/gpu-check.sh" "$ROOT/scripts/gpu-profile.sh" "$ROOT/scripts/gpu-engine-check.sh" \
  "$ROOT/scripts/batch-vs-solo.sh" "$ROOT/scripts/gpu-ab.sh" "$ROOT/scripts/gpu-engine-ab.sh" \
  "$ROOT/scripts/gpu-serve-ab.sh" "$ROOT/scripts/gpu-quant-ab.sh" "$ROOT/scripts/gpu-constrained-ab.sh" "$DEST/"
git -C "$ROOT" log --oneline -1 > "$DEST/COMMIT" 2>/dev/null || true
cp -r "${SERVAL_MODELS:-/work/shared/models}/stories260K" "$DEST/models/"
# Every non-system library the binaries load, except the CUDA ones the host has.
for lib in $(ldd "$BUILD/serval" "$BUILD/serval_tests" $(ls "$BUILD"/bench/cuda_*_bench 2>/dev/null) | awk '/=>/ {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*|libcublas*|libcuda*) ;;
    *) cp -L "$lib" "$DEST/libstage/" ;;
  esac
done
tar -cJf "$DEST/lib.tar.xz" -C "$DEST/libstage" .
rm -rf "$DEST/libstage"
du -sh "$DEST"; ls -la "$DEST"
