#!/usr/bin/env bash
# Runs the Common Test suites against a private epmd, with the OTP 27 and
# OTP 29 peers prepared, and ends with a plain "N passed, N failed" line.
set -euo pipefail
cd "$(dirname "$0")/../.."

ECALL_OTP27_ERL=$(test/scripts/otp27.sh)
ECALL_OTP29_ERL=$(test/scripts/otp27.sh 29 sid)
export ECALL_OTP27_ERL ECALL_OTP29_ERL
mkdir -p _build
status=0
test/scripts/with_epmd.sh rebar3 ct --sname "ecall_ct_$$" --readable true "$@" | tee _build/ct.out || status=$?

# rebar3 ct ends with "All N tests passed." or "Failed N tests. ... Passed M tests."
out=$(sed 's/\x1b\[[0-9;]*m//g' _build/ct.out)
passed=$(grep -oE '(All ([0-9]+) tests passed|Passed ([0-9]+) tests)' <<<"$out" | grep -oE '[0-9]+' | tail -1 || true)
failed=$(grep -oE 'Failed ([0-9]+) tests' <<<"$out" | grep -oE '[0-9]+' | tail -1 || true)
skipped=$(grep -oE 'Skipped ([0-9]+)' <<<"$out" | grep -oE '[0-9]+' | tail -1 || true)
# CI keeps only the tail of the output: repeat each failed case and what
# rebar3 printed about it here, so the tail names what failed and why.
if grep -qE '==> [^ :]+: .*(FAILED|SKIPPED|auto_skipped|failed)' <<<"$out"; then
    echo "---- failed or skipped cases (repeated from above) ----"
    grep -E -A 25 '==> [^ :]+: .*(FAILED|SKIPPED|auto_skipped|failed)' <<<"$out" | cut -c1-300 | head -150
    echo "----"
fi
echo "common_test: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
if [ "$status" -eq 0 ] && { [ -n "${failed:-}" ] && [ "${failed}" -ne 0 ] || [ -n "${skipped:-}" ] && [ "${skipped}" -ne 0 ]; }; then
    status=1
fi
exit "$status"
