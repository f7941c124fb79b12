"""Where node A's resident set goes, per point of a sweep run with
ECALL_BENCH_CARRIERS=1: peak erlang:memory(total), peak allocator
carriers, peak VmRSS (MB), and the differences. Peaks are sampled every
100 ms, not at the same instant, so a difference of a few MB either way
is sampling. Usage: python3 gap.py sweep-map.csv"""
import csv
import sys

print(f"{'op':5} {'variant':13} {'writers':>7} {'memory':>7} {'carriers':>8} {'rss':>6} "
      f"{'start':>6} {'carr-mem':>8} {'rss-carr':>8}")
for r in csv.DictReader(open(sys.argv[1])):
    m, c, rss = (float(r[k]) for k in ("peak_mem_mb", "peak_carriers_mb", "peak_rss_mb"))
    print(f"{r['op']:5} {r['variant']:13} {r['writers']:>7} {m:7.0f} {c:8.0f} {rss:6.0f} "
          f"{float(r['start_rss_mb']):6.0f} {c - m:8.0f} {rss - c:8.0f}")
