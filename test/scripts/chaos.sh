#!/usr/bin/env bash
# Runs the chaos suite (test/ecall_chaos_SUITE.erl) for longer than CI does:
# rounds of CHAOS_TESTS sequences (default 200), each with a seed of its
# own, until CHAOS_MINUTES (default 30) have passed or a round fails. The
# failing round's seed and shrunk sequence are in its output (and in
# _build/test/logs); CHAOS_SEED=A,B,C runs one round with that seed.
set -euo pipefail
cd "$(dirname "$0")/../.."

tests=${CHAOS_TESTS:-200}
if [ -n "${CHAOS_SEED:-}" ]; then
    ECALL_CHAOS_TESTS=$tests ECALL_CHAOS_SEED=$CHAOS_SEED test/scripts/ct.sh --suite test/ecall_chaos_SUITE
    exit
fi
end=$(( $(date +%s) + 60 * ${CHAOS_MINUTES:-30} ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
    round=$((round + 1))
    echo "chaos.sh: round $round, $tests sequences"
    ECALL_CHAOS_TESTS=$tests test/scripts/ct.sh --suite test/ecall_chaos_SUITE
done
echo "chaos.sh: $round rounds of $tests sequences passed"
