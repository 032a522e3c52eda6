#!/usr/bin/env python3
"""Prints the medians of the last criterion run as Markdown tables, with the
store/raw ratios of the summary in docs/performance.md.

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
# The backends the run measured, as its benchmark ids name them
# (`<group>/<backend>/...`): memory first, then by name. No list here: a new
# backend's figures appear once it is benched.
GROUPS = ("replay", "scale", "append", "follow", "rmcp_delivery", "bus", "tasks")
backends = sorted(
    {k.split("/")[1] for k in data if k.split("/")[0] in GROUPS and "/" in k}
    - {"observe", "disk"},
    key=lambda b: (b != "memory", b),
)

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
for full_id, (ns, elems) in sorted(data.items()):
    if full_id.startswith("append/disk/"):
        print(f"| disk | {full_id.split('/', 2)[2]} | {rate(ns, elems)} | {fmt_time(ns)} |")

print("\nSQLite replay against SQLite itself (median per replay)\n")
print("| K | store | direct_hop | direct | store/direct_hop | store/direct |")
print("|---|---|---|---|---|---|")
for k in ("1", "10", "100", "1000", "10000"):
    s, h, d = (data.get(f"replay/sqlite/{v}/{k}") for v in ("store", "direct_hop", "direct"))
    if s and h and d:
        print(f"| {int(k):,} | {fmt_time(s[0])} | {fmt_time(h[0])} | {fmt_time(d[0])} "
              f"| {s[0] / h[0]:.2f} | {s[0] / d[0]:.2f} |")


def percentiles():
    for dirpath, _, files in os.walk(os.path.join(root, "rmcp_delivery")):
        if "percentiles.json" in files:
            with open(os.path.join(dirpath, "percentiles.json")) as f:
                yield os.path.basename(dirpath), json.loads(f.readline())


rows = sorted(percentiles(), key=lambda r: (backends.index(r[1]["backend"]) if r[1]["backend"] in backends else 99, r[0]))
if rows:
    print("\nDelivery latency through the rmcp adapter (`store_event` as rmcp calls it, call by call)\n")
    print("| backend | case | p50 | p99 |")
    print("|---|---|---|---|")
    for case, p in rows:
        print(f"| {p['backend']} | {case} | {fmt_time(p['p50_ns'])} | {fmt_time(p['p99_ns'])} |")


def bus_percentiles(backend, variant):
    path = os.path.join(root, "bus", backend, variant, "latency", "percentiles.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.loads(f.readline())
    return None


bus_rows = []
for b in backends:
    store = bus_percentiles(b, "store")
    if not store:
        continue
    for variant in ("store", "notify", "publish", "xadd"):
        p = bus_percentiles(b, variant)
        if p:
            ratio = "" if variant == "store" else f"{store['median_ns'] / p['median_ns']:.2f}"
            bus_rows.append((b, variant, p, ratio))
if bus_rows:
    print("\nBus: publish on one handle to delivery on another, single deliveries (`cargo bench --bench bus`; ratio = store median / this primitive's)\n")
    print("| backend | through | p50 | p99 | store/primitive |")
    print("|---|---|---|---|---|")
    for b, variant, p, ratio in bus_rows:
        print(f"| {b} | {variant} | {fmt_time(p['median_ns'])} | {fmt_time(p['p99_ns'])} | {ratio} |")
    fanout = [data.get(f"bus/{b}/{v}/{n}") for b in backends for v in ("fanout", "listeners") for n in ("1", "1000")]
    if any(fanout):
        print("\nBus fan-out: one publish until every subscriber on the other handle has it (median); "
              "each its own subscription, or the runtime's notification listeners sharing one\n")
        print("| backend | 1 subscription | 1,000 subscriptions | 1 listener | 1,000 listeners | 1,000: subscriptions / listeners |")
        print("|---|---|---|---|---|---|")
        for b in backends:
            cells = [data.get(f"bus/{b}/{v}/{n}") for v in ("fanout", "listeners") for n in ("1", "1000")]
            if all(cells):
                print(f"| {b} | " + " | ".join(fmt_time(c[0]) for c in cells)
                      + f" | {cells[1][0] / cells[3][0]:.1f} |")

http = os.path.join(root, "http_load")
if os.path.isdir(http):
    print("\nHTTP load (the example server, one process; `cargo bench --bench http`)\n")
    print("| store | calls | resumed | server CPU per message | per call | call p50 | call p99 |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(os.listdir(http)):
        with open(os.path.join(http, name)) as f:
            h = json.loads(f.readline())
        print(f"| {name[:-5]} | {h['calls']:,} | {h['resumed']:,} | {h['cpu_per_message_us']:.0f} us "
              f"| {h['cpu_per_call_ms']:.2f} ms | {h['call_p50_s']:.3f} s | {h['call_p99_s']:.3f} s |")
