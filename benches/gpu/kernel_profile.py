"""GPU time per kernel kind in the last of STEPS equal steps (docs/perf_log.md, 2026-11-29).

CubeCL writes one line per profiled launch, `| <duration> | <kernel name>...`, when cubecl.toml
holds `[profiling.logger] level = "basic"` and a `file`. Usage:
    python3 benches/gpu/kernel_profile.py PROFILE_LOG STEPS
The log is split into STEPS equal parts by launch count and the last part (a warm step) is
summed by kernel kind (the name up to its first `_`, ` `, `|`, `<` or `:`).
"""
import re
import sys
from collections import defaultdict

UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
LINE = re.compile(r"^\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)$")

rows = []
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    m = LINE.match(line.strip())
    if m:
        rows.append((float(m.group(1)) * UNITS[m.group(2)], m.group(3)))
steps = int(sys.argv[2])
last = rows[(steps - 1) * len(rows) // steps:]
totals, counts = defaultdict(float), defaultdict(int)
for ms, name in last:
    kind = re.split(r"[ _|<:]", name.strip())[0]
    totals[kind] += ms
    counts[kind] += 1
grand = sum(totals.values())
print(f"{len(rows)} launches in the log; last step: {len(last)} launches, {grand:.1f} ms")
print("| kernel | launches | GPU ms | share |")
print("|---|---|---|---|")
for kind, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(f"| {kind} | {counts[kind]} | {ms:.1f} | {100 * ms / grand:.1f} % |")
