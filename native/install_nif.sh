#!/bin/sh
# Installs a built NIF library as PRIV_DIR/libecall_nif.so, stripped of
# debug info, the way a running node survives: a new file renamed into
# place. A node that loaded the old library keeps its mapping of the old
# file; copying over that file in place rewrites the pages the node runs
# (two nodes of a benchmark died with SIGSEGV that way while a build ran
# beside them). test/scripts/nif_reinstall.sh holds this to it.
#
#   native/install_nif.sh BUILT_LIBRARY PRIV_DIR
set -eu
built=$1
dir=$2
lib=$dir/libecall_nif.so
mkdir -p "$dir"
tmp=$dir/.libecall_nif.so.$$
trap 'rm -f "$tmp"' EXIT
if ! { command -v strip >/dev/null 2>&1 && strip -S -o "$tmp" "$built" 2>/dev/null; }; then
    cp "$built" "$tmp"
fi
if cmp -s "$tmp" "$lib"; then
    rm -f "$tmp"
else
    mv -f "$tmp" "$lib"
fi
