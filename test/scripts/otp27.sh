#!/usr/bin/env bash
# Prints the path of an OTP 27 `erl` (or, with arguments `RELEASE SUITE`,
# of the OTP release that Debian suite ships: `29 sid`), preparing it first
# if needed.
#
# Debian 13 (trixie) ships OTP 27 and unstable (sid) OTP 29, built against
# a newer libc than this Debian 12 machine has, so the packages are
# unpacked (not installed) into a cache outside the clone, and the
# emulator's binaries are pointed at the unpacked loader and libraries with
# patchelf. The cache makes every run after the first free of downloads.
# Progress goes to stderr. Cache: ECALL_OTP27_CACHE for 27 (default
# /var/cache/ecall-otp27), ECALL_OTP<RELEASE>_CACHE for the others.
set -euo pipefail

release=${1:-27}
suite=${2:-trixie}
var=ECALL_OTP${release}_CACHE
cache=${!var:-/var/cache/ecall-otp$release}
root=$cache/root
erl=$root/usr/lib/erlang/bin/erl

# Both `erl' scripts name the root they run from: bin/erl, and the one in
# erts-*/bin that a running node finds first on its PATH (the emulator puts
# that directory there), which is how a node of this release starts its
# peers with `peer' (as bench/run.sh's ECALL_BENCH_OTP does).
point_roots() {
    local f
    for f in "$erl" "$root"/usr/lib/erlang/erts-*/bin/erl; do
        grep -q "ROOTDIR=$root/usr/lib/erlang\$" "$f" && continue
        # A cache another user unpacked may be read-only here: the tests
        # only need bin/erl, which was pointed when it was unpacked.
        sed -i "s|ROOTDIR=/usr/lib/erlang\$|ROOTDIR=$root/usr/lib/erlang|" "$f" 2>/dev/null ||
            echo "otp27.sh: cannot point $f at $root (read-only); nodes of OTP $release cannot start peers" >&2
    done
}

if [ -f "$cache/ready" ] && [ -x "$erl" ]; then
    # A cache unpacked before erts-*/bin/erl was pointed too.
    point_roots
    echo "$erl"
    exit 0
fi

# Preparing it writes the cache (and installs patchelf when missing): a
# user who cannot write /var/cache points ECALL_OTP27_CACHE elsewhere.
parent=$cache
while [ ! -e "$parent" ]; do parent=$(dirname "$parent"); done
if [ ! -w "$parent" ]; then
    echo "otp27.sh: cannot write $parent to unpack OTP $release into $cache;" >&2
    echo "otp27.sh: run as root once, or set $var to a writable dir, e.g." >&2
    echo "otp27.sh:     $var=\$HOME/.cache/ecall-otp$release make test" >&2
    exit 1
fi
if ! command -v patchelf >/dev/null && [ "$(id -u)" -ne 0 ]; then
    echo "otp27.sh: needs patchelf: sudo apt-get install -y patchelf" >&2
    exit 1
fi
command -v patchelf >/dev/null || { apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >&2; }

# The machine's own Debian mirror, with the next suite.
uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [ -z "$uri" ]; then
    uri=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
[ -n "$uri" ] || { echo "otp27.sh: no Debian mirror found in the apt sources" >&2; exit 1; }

rm -rf "$cache"
mkdir -p "$cache/apt/lists/partial" "$cache/apt/archives/partial" "$cache/debs" "$root"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" > "$cache/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$cache/apt/sources.list" -o "Dir::Etc::SourceParts=$cache/apt/none"
          -o "Dir::State::Lists=$cache/apt/lists" -o "Dir::Cache=$cache/apt"
          -o "Dir::Cache::archives=$cache/apt/archives" -o Debug::NoLocking=1 -qq)
echo "otp27.sh: fetching OTP $release packages from the $suite suite" >&2
apt-get "${apt_opts[@]}" update >&2
pkgs=(erlang-base libc6 libstdc++6 libgcc-s1 libtinfo6 zlib1g libsystemd0
      libcap2 libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libzstd1 libsctp1)
(cd "$cache/debs" && chmod 777 . && apt-get "${apt_opts[@]}" download "${pkgs[@]}" >&2)
for deb in "$cache"/debs/*.deb; do
    dpkg -x "$deb" "$root"
done

loader=$root/usr/lib64/ld-linux-x86-64.so.2
[ -e "$loader" ] || loader=$root/lib64/ld-linux-x86-64.so.2
rpath=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu
for bin in "$root"/usr/lib/erlang/erts-*/bin/{beam.smp,erlexec,erl_child_setup,epmd,inet_gethost}; do
    [ -f "$bin" ] || continue
    patchelf --set-interpreter "$loader" --set-rpath "$rpath" "$bin"
done
point_roots
out=$("$erl" -noshell -eval 'io:put_chars(erlang:system_info(otp_release)), halt().')
[ "$out" = "$release" ] || { echo "otp27.sh: unpacked erl reports OTP '$out', not $release" >&2; exit 1; }
touch "$cache/ready"
echo "$erl"
