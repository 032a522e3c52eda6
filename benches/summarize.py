#!/usr/bin/env python3
"""Prints the medians of the last criterion run as Markdown tables, with the
store/raw ratios the README's Performance section reports.

    python3 benches/summarize.py [CRITERION_DIR]

CRITERION_DIR defaults to $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion,
else the workspace's target/criterion (where `cargo bench -p
mcp-event-store-benches` leaves its results), from any working directory.
"""
import json
import os
import sys


def default_root():
    if os.environ.get("CRITERION_HOME"):
        return os.environ["CRITERION_HOME"]
    if os.environ.get("CARGO_TARGET_DIR"):
        return os.path.join(os.environ["CARGO_TARGET_DIR"], "criterion")
    workspace = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(workspace, "target", "criterion")


root = sys.argv[1] if len(sys.argv) > 1 else default_root()


def load():
    out = {}
    for dirpath, _, files in os.walk(root):
        if "benchmark.json" not in files or not dirpath.endswith(os.sep + "new"):
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        elems = (bench.get("throughput") or {}).get("Elements")
        out[bench["full_id"]] = (est["median"]["point_estimate"], elems)
    return out


def fmt_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def rate(ns, elems):
    return f"{elems / (ns / 1e9):,.0f}" if elems else ""


data = load()
backends = ["memory", "sqlite", "postgres", "redis", "sled"]

print("Replay the last K events of a 100,000-event stream (median per replay; ratio = raw time / store time = store throughput / raw throughput)\n")
print("| backend | K | store | raw | store/raw throughput |")
print("|---|---|---|---|---|")
for b in backends:
    for k in ("1", "10", "100", "1000", "10000"):
        s = data.get(f"replay/{b}/store/{k}")
        r = data.get(f"replay/{b}/raw/{k}")
        if s and r:
            print(f"| {b} | {int(k):,} | {fmt_time(s[0])} | {fmt_time(r[0])} | {r[0] / s[0]:.2f} |")

print("\nScale: replay the last 100 events of one stream (median per replay)\n")
print("| backend | 1k events | 100k events | 1M events | largest / smallest |")
print("|---|---|---|---|---|")
for b in backends + ["memory/rmcp_linear_vec"]:
    name = b if "/" in b else f"{b}/store"
    row = [data.get(f"scale/{name}/{size}") for size in ("1k", "10k", "100k", "1M")]
    present = [r for r in row if r]
    if not present:
        continue
    cells = [fmt_time(r[0]) if r else "" for r in (row[0], row[2], row[3])]
    label = "rmcp-style linear Vec (reference)" if "rmcp" in b else b
    print(f"| {label} | {' | '.join(cells)} | {present[-1][0] / present[0][0]:.2f}x |")

print("\nAppends (events per second, from the median time per iteration)\n")
print("| backend | benchmark | events/s | median per iteration |")
print("|---|---|---|---|")
for b in backends:
    for full_id, (ns, elems) in sorted(data.items()):
        if full_id.startswith(f"append/{b}/"):
            print(f"| {b} | {full_id.split('/', 2)[2]} | {rate(ns, elems)} | {fmt_time(ns)} |")
