#!/usr/bin/env bash
# Runs the C++ tests, then the end-to-end tests (pytest) against a serval built
# with a sanitizer, and fails on any report:
#   scripts/sanitize.sh thread  [pytest args]   ThreadSanitizer, in build-tsan
#   scripts/sanitize.sh address [pytest args]   AddressSanitizer + UBSan, in build-asan
# pytest args default to the whole of tests/python (e.g. `tests/python/test_server_*.py`
# for the server only). Under TSan the tests run 5-20x slower, so a test that waits on a
# deadline may fail for time alone; the script counts sanitizer reports, not test results.
# CPU only (-DSERVAL_CUDA=OFF). Reports go to build-*/reports/.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: scripts/sanitize.sh thread|address [pytest args]}"
shift
export SERVAL_MODELS="${SERVAL_MODELS:-$(cd .. && pwd)/shared/models}"

case "$kind" in
  thread) dir=build-tsan; flags="-fsanitize=thread" ;;
  address) dir=build-asan; flags="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all" ;;
  *) echo "unknown sanitizer: $kind (thread or address)" >&2; exit 2 ;;
esac

cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSERVAL_CUDA=OFF -DSERVAL_NATIVE=OFF \
  -DSERVAL_BUILD_TESTS=ON -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer -O1 -g" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$dir" -j"$(nproc)"

reports="$dir/reports"
rm -rf "$reports" && mkdir -p "$reports"
# libgomp is not built with TSan, so it cannot see the barriers that order an OpenMP
# region's threads: every parallel kernel would read as a race. tests/tsan.supp drops
# reports with a libgomp frame; races between our own threads have none. exitcode=0:
# the tests judge behaviour (a server must exit 0), the reports are counted below.
export TSAN_OPTIONS="halt_on_error=0 exitcode=0 history_size=7 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp log_path=$PWD/$reports/report"
export ASAN_OPTIONS="detect_leaks=1 log_path=$PWD/$reports/report"
export UBSAN_OPTIONS="print_stacktrace=1 log_path=$PWD/$reports/report"

status=0
"$dir/serval_tests" --gtest_brief=1 || status=$?
[ $# -eq 0 ] && set -- tests/python
SERVAL_BINARY="$PWD/$dir/serval" python3 -m pytest -q "$@" || status=$?

# Reports that are not ours are skipped: see docs/SANITIZERS.md.
report_status=0
python3 - "$reports" <<'EOF' || report_status=$?
import pathlib, re, sys

def created_in_libgomp(block, thread):
    m = re.search(rf"Thread {thread} \(.*?\n\n", block, re.S)
    return bool(m and "libgomp" in m.group(0))

def not_ours(block):
    # cpp-httplib's function-local static, first used by two responses at once.
    if re.search(r"Location is global .*libcpp-httplib\.so", block):
        return True
    # An OpenMP worker whose side TSan could not restore (so tsan.supp saw no libgomp frame).
    lost = re.findall(r"by thread (T\d+):\n\s+\[failed to restore the stack\]", block)
    return bool(lost) and all(created_in_libgomp(block, t) for t in lost)

found = skipped = 0
for path in sorted(pathlib.Path(sys.argv[1]).glob("report*")):
    text = path.read_text(errors="replace")
    for block in text.split("==================\n"):
        if not re.search(r"(WARNING|ERROR): (ThreadSanitizer|AddressSanitizer|LeakSanitizer)", block):
            continue
        if not_ours(block):
            skipped += 1
            continue
        found += 1
        summary = re.search(r"SUMMARY: .*", block)
        print(f"{path}: {summary.group(0) if summary else block.strip().splitlines()[0]}")
    for line in re.findall(r".*runtime error: .*", text):
        found += 1
        print(f"{path}: {line}")
print(f"sanitizer reports: {found} ({skipped} not ours skipped)")
sys.exit(1 if found else 0)
EOF
echo "tests exit status: $status$([ "$kind" = thread ] && echo " (under TSan a deadline may fail a test for time alone)")"
exit $report_status
