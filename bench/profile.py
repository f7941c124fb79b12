#!/usr/bin/env python3
"""Where the CPU of one message goes, from a perf recording of both nodes.

Usage: bench/profile.py FILE.perf NODES [MESSAGES]
  NODES: the file the profile mode writes ("A <os pid>" and "B <os pid>").
  MESSAGES: messages sent during the recording, to turn shares into
  microseconds per message (optional).

Prints a Markdown table: for each node, the share of its samples in each
category, by thread kind and symbol. The categories are approximate: the
emulator (beam.smp from Debian's packages) has no local symbols, so its
encode, decode and message passing show together as "emulator internals".
"""
import subprocess
import sys
from collections import defaultdict

CATEGORIES = [
    # (name, predicate on (comm, dso, sym))
    ("link writer: atom cache rewrite", lambda c, d, s: c == "ecall-io" and "atom_cache" in s),
    ("link writer: kernel (socket writes, wake-ups)", lambda c, d, s: c == "ecall-io" and "kernel" in d),
    ("link writer: the rest (shards, frames, tokio)", lambda c, d, s: c == "ecall-io"),
    ("NIF push (encode call, shard, lock)", lambda c, d, s: "libecall_nif" in d),
    ("receiver replay (ecall_receiver)", lambda c, d, s: "$ecall_receiver" in s),
    ("ecall API and transports (Erlang)", lambda c, d, s: s.startswith("$ecall") and "$ecall_bench" not in s),
    ("benchmark writers and receivers", lambda c, d, s: "$ecall_bench" in s or "$timer" in s),
    ("other Erlang code", lambda c, d, s: d.startswith("[JIT]")),
    ("emulator: scheduling", lambda c, d, s: "beam.smp" in d and ("schedule" in s or "sched" in s)),
    ("emulator internals (encode, decode, messages, GC)", lambda c, d, s: "beam.smp" in d),
    ("libc (copies, allocation, locks)", lambda c, d, s: "libc" in d),
    ("kernel (scheduler threads)", lambda c, d, s: "kernel" in d),
    ("other", lambda c, d, s: True),
]


def samples(perf_file, pid):
    """(comm, dso, sym) -> samples of that process."""
    # Sorted by thread ("tid:comm"), not by comm: with `comm' perf merges
    # the threads of both nodes that share a name (1_scheduler, ...) into
    # one entry before `--pid' filters, and gave one node's samples to the
    # other (node B's share of a call recording came out 1,637 samples
    # where it has 1,829).
    out = subprocess.run(
        ["perf", "report", "-i", perf_file, "--pid", pid, "--no-children", "-n",
         "--sort", "pid,dso,sym", "-g", "none", "-q", "--percent-limit", "0",
         "--field-separator", "\t"],
        check=True, capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("\t")]
        if len(parts) < 5 or not parts[0].endswith("%"):
            continue
        n = int(parts[1])
        key = (parts[2].split(":", 1)[-1], parts[3], parts[4].split("] ", 1)[-1])
        counts[key] = counts.get(key, 0) + n
    return counts


def classify(shares):
    by = defaultdict(float)
    for (comm, dso, sym), pct in shares.items():
        for name, pred in CATEGORIES:
            if pred(comm, dso, sym):
                by[name] += pct
                break
    return by


def main():
    perf_file, nodes_file = sys.argv[1], sys.argv[2]
    messages = float(sys.argv[3]) if len(sys.argv) > 3 else None
    hz = float(sys.argv[4]) if len(sys.argv) > 4 else 499.0
    nodes = dict(line.split() for line in open(nodes_file) if line.strip())
    sa, sb = samples(perf_file, nodes["A"]), samples(perf_file, nodes["B"])
    a, b = classify(sa), classify(sb)
    ta, tb = sum(a.values()) or 1, sum(b.values()) or 1

    def us(n):
        # Samples are taken at `hz` per second of CPU: n / hz CPU seconds.
        return f"{n / hz / messages * 1e6:.2f}" if messages else "-"

    print("| category | A % | A µs/msg | B % | B µs/msg |")
    print("| --- | --- | --- | --- | --- |")
    for name, _ in CATEGORIES:
        na, nb = a.get(name, 0), b.get(name, 0)
        if na / ta >= 0.005 or nb / tb >= 0.005:
            print(f"| {name} | {100 * na / ta:.1f} | {us(na)} | {100 * nb / tb:.1f} | {us(nb)} |")
    print(f"| all | 100 | {us(ta)} | 100 | {us(tb)} |")
    if messages:
        print(f"\n{messages:.0f} messages in the recording window; "
              f"{ta + tb} samples at {hz:.0f} Hz.")
    # The kernel zeroing pages a node touches for the first time: high in
    # the first point after the nodes start (see warm_up/6 in ecall_bench).
    fresh = [sum(n for (_, _, sym), n in s.items() if sym == "clear_page_erms") for s in (sa, sb)]
    print(f"\nFresh pages zeroed (kernel `clear_page_erms`): {100 * fresh[0] / ta:.1f} % of A's "
          f"samples, {100 * fresh[1] / tb:.1f} % of B's.")


if __name__ == "__main__":
    main()
