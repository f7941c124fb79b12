#!/bin/sh
# Runs one of the tests' nodes: `test/scripts/node.sh ERL ARGS...`
# (ecall_test_nodes starts its nodes so). The node runs as this script's
# child, so that its end is seen: a node killed by a crash signal (SIGILL,
# SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS), at exit too, is
# written down in the file $ECALL_NODE_CRASHES names, which
# test/scripts/with_epmd.sh checks once its command and every such node
# have ended. OTP's `peer' closes its port to a
# node once it has started, so nothing else learns how a peer ended: two
# scheduler threads of such nodes once died of SIGSEGV and no test failed.
# A node that halts (the BEAM halts on SIGTERM too), or that a test kills
# (SIGKILL), is not written down.
#
# While its node runs, this script holds a shared lock on
# $ECALL_NODE_CRASHES.lock (the node itself does not inherit it); with_epmd.sh
# takes it exclusively to wait for every node of its run.
if [ -n "${ECALL_NODE_CRASHES:-}" ]; then
    exec 9>>"$ECALL_NODE_CRASHES.lock"
    flock -s 9
fi
"$@" 9>&-
status=$?
case $status in
    # 128 + the signal: ILL 4, TRAP 5, ABRT 6, BUS 7, FPE 8, SEGV 11, SYS 31.
    132 | 133 | 134 | 135 | 136 | 139 | 159)
        if [ -n "${ECALL_NODE_CRASHES:-}" ]; then
            echo "signal $((status - 128)) (exit status $status): $*" >>"$ECALL_NODE_CRASHES"
        fi
        ;;
esac
exit "$status"
