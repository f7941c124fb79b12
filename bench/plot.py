#!/usr/bin/env python3
"""Plots the CSVs of one results folder: rate, CPU per operation (both
nodes; and each node apart, A solid and B dashed), wire bytes per
operation and peak sender memory against writers, one panel per
operation, one line per variant; and for the fanout mode's fanout.csv, delivered messages a
second per point, one bar per variant.
Usage: bench/plot.py bench/results/<date>-<host> [label]"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = [
    ("rate", "achieved ops/s", "rate"),
    ("cpu_us_per_op", "CPU µs per operation (both nodes)", "cpu"),
    (("cpu_a_us_per_op", "cpu_b_us_per_op"), "CPU µs per operation, A solid, B dashed", "cpu-nodes"),
    ("wire_bytes_per_op", "bytes on the wire per operation (both ways)", "wire"),
    ("peak_mem_mb", "peak erlang:memory(total) on A, MB", "memory"),
]


def main():
    folder = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else None
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".csv") or (label and not name.startswith(label)):
            continue
        rows = list(csv.DictReader(open(os.path.join(folder, name))))
        if rows and "msgs_per_s" in rows[0] and "targets" in rows[0]:
            fanout(folder, name[: -len(".csv")], rows)
            continue
        # Only the throughput matrices have these plots (latency.csv is a
        # table of its own).
        if not rows or "op" not in rows[0]:
            continue
        ops = sorted({r["op"] for r in rows}, key=["send", "cast", "call"].index)
        base = name[: -len(".csv")]
        for key, title, suffix in METRICS:
            keys = key if isinstance(key, tuple) else (key,)
            # A CSV of an older bench lacks the newer columns.
            if any(k not in rows[0] for k in keys):
                continue
            fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
            for ax, op in zip(axes[0], ops):
                for i, variant in enumerate(sorted({r["variant"] for r in rows})):
                    for k, style in zip(keys, ["-", "--"]):
                        pts = sorted(
                            (int(r["writers"]), float(r[k]))
                            for r in rows
                            if r["op"] == op and r["variant"] == variant
                        )
                        if pts:
                            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                                    color=f"C{i}", label=variant if style == "-" else None)
                if key == "rate":
                    pts = sorted({(int(r["writers"]), float(r["intended"])) for r in rows if r["op"] == op})
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "k:", label="intended")
                ax.set_title(op)
                ax.set_xlabel("writers")
                ax.set_ylabel(title)
                ax.grid(True, alpha=0.3)
            axes[0][0].legend(fontsize=8)
            save(fig, f"{base}: {title}", folder, f"{base}-{suffix}.png")


def fanout(folder, base, rows):
    """Delivered messages a second, per point (peers, targets, message
    size), one bar per variant, on a log scale."""
    points = sorted({(int(r["peers"]), int(r["targets"]), int(r["msg_bytes"])) for r in rows})
    variants = [v for v in ["native", "ecall_send", "manifold", "send_many", "local"]
                if any(r["variant"] == v for r in rows)]
    label = {"local": "local (each peer's own ! loop, no network)"}
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / max(1, len(variants))
    for i, variant in enumerate(variants):
        rate = {(int(r["peers"]), int(r["targets"]), int(r["msg_bytes"])): float(r["msgs_per_s"])
                for r in rows if r["variant"] == variant}
        xs = [j + i * width for j in range(len(points))]
        ax.bar(xs, [rate.get(p, 0) for p in points], width, label=label.get(variant, variant),
               **({"hatch": "//", "fill": False} if variant == "local" else {}))
    ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(points))])
    ax.set_xticklabels([f"{p} peer{'s' if p > 1 else ''}\n{t:,} targets\n{b} B" for p, t, b in points],
                       fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("delivered messages a second")
    ax.grid(True, axis="y", alpha=0.3)
    # Room above the bars for the legend in one row.
    ax.set_ylim(top=ax.get_ylim()[1] * 8)
    ax.legend(fontsize=8, ncol=len(variants), loc="upper center")
    save(fig, f"{base}: one sender to many targets", folder, f"{base}-rate.png")


def save(fig, title, folder, name):
    """Titles the figure and writes it to folder/name."""
    fig.suptitle(title)
    fig.tight_layout()
    out = os.path.join(folder, name)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    print("plot:", out)


if __name__ == "__main__":
    main()
