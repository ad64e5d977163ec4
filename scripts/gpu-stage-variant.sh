#!/usr/bin/env bash
# Adds a second (third, ...) build to a folder scripts/gpu-stage.sh made, for
# scripts/gpu-ab.sh to compare with the staged one in the same device call:
# the build's serval, serval_tests and cuda_gemv_bench, stripped and
# xz-compressed into DEST/variants/NAME.tar.xz (~6 MB; the carry limit is 64
# MiB). The build must link the same shared libraries as the staged one.
# Usage: scripts/gpu-stage-variant.sh BUILD_DIR NAME [DEST]
set -euo pipefail
BUILD=${1:?build dir}
NAME=${2:?variant name}
DEST=${3:-/work/main/.gpu}
[ -x "$DEST/serval" ] || { echo "stage a base build first: scripts/gpu-stage.sh BUILD $DEST" >&2; exit 1; }
case $NAME in *[!A-Za-z0-9_.-]*) echo "variant name: letters, digits, _ . - only" >&2; exit 1 ;; esac
W=$(mktemp -d)
mkdir -p "$W/$NAME" "$DEST/variants"
strip -o "$W/$NAME/serval" "$BUILD/serval"
strip -o "$W/$NAME/serval_tests" "$BUILD/serval_tests"
[ -f "$BUILD/bench/cuda_gemv_bench" ] && strip -o "$W/$NAME/cuda_gemv_bench" "$BUILD/bench/cuda_gemv_bench"
# What the build is (staged right after building it, the checkout is its tree).
git -C "$(dirname "$0")/.." log --oneline -1 > "$W/$NAME/COMMIT" 2>/dev/null || true
tar -cJf "$DEST/variants/$NAME.tar.xz" -C "$W" "$NAME"
rm -rf "$W"
du -sh "$DEST/variants/$NAME.tar.xz" "$DEST"
