#!/usr/bin/env python3
"""One line per kernel launch of an Nsight Compute report's raw page.

Reads what `ncu --import REPORT --csv --page raw --print-units base` writes
(scripts/gpu-check.sh PROFILE=1, docs/cuda.md#kernel-profile) and prints,
per profiled launch: the kernel's short name, grid, registers, duration,
DRAM bytes and rate, the DRAM / L2 / L1 / SM throughput as a share of their
peaks, the achieved occupancy, L2 bytes per DRAM byte and the three largest
warp stall reasons. A metric the report lacks prints as "-". Standard
library only.

Usage: ncu_summary.py RAW.csv [--json OUT.json]
"""

import argparse
import csv
import json
import re
import sys

# A unit ncu prints → its factor to seconds or bytes (shares and counts
# have none, and are read as they are).
UNITS = {
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
    "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
    "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0,
}

# Each figure → the raw-page columns that may hold it, the first present
# read (ncu versions name SpeedOfLight's DRAM share differently).
METRICS = {
    "seconds": ("gpu__time_duration.sum",),
    "dram_bytes": ("dram__bytes.sum",),
    "dram_read_bytes": ("dram__bytes_read.sum",),
    "l2_bytes": ("lts__t_bytes.sum",),
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "registers": ("launch__registers_per_thread",),
    "grid": ("launch__grid_size",),
    "block": ("launch__block_size",),
    "shared_bytes": ("launch__shared_mem_per_block_dynamic",),
}

STALL = re.compile(
    r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$")


def number(text, unit):
    """The cell as a float in base units (seconds, bytes), or None."""
    text = (text or "").replace(",", "").strip()
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value * UNITS.get(unit, 1.0)


def short_name(name):
    """`void ns::(anonymous namespace)::f<4, 2>(const uint4 *, ...)` → `f<4, 2>`."""
    name = re.sub(r"^void ", "", name.strip())
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the parameter list: the first "(" outside <>
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and not name.startswith("(anonymous", i):
            cut = i
            break
    name = name[:cut]
    template = name.find("<")
    head, tail = (name, "") if template < 0 else (name[:template], name[template:])
    return head.split("::")[-1] + tail


def read(path):
    """The report's launches: a dict per row with METRICS keys and `stalls`."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        return []
    # The header is the first row that starts with "ID" (ncu may print
    # lines of its own before it).
    start = next((i for i, r in enumerate(rows) if r and r[0].strip() == "ID"), None)
    if start is None or start + 1 >= len(rows):
        return []
    header, rows = rows[start], rows[start:]
    # The units row follows the header; its ID cell is empty, where every
    # launch's holds a number.
    has_units = bool(rows[1]) and not rows[1][0].strip()
    units = rows[1] if has_units else [""] * len(header)
    data = rows[2:] if has_units else rows[1:]
    launches = []
    for row in data:
        if len(row) != len(header):
            continue
        cell = dict(zip(header, row))
        unit = dict(zip(header, units))
        launch = {"kernel": short_name(cell.get("Kernel Name", "?")),
                  "id": cell.get("ID", "")}
        for key, names in METRICS.items():
            # The first of a metric's names the report has.
            metric = next((m for m in names if m in cell), None)
            if metric is None:
                launch[key] = None
                continue
            # Times in a unit not known above (or none): nanoseconds, ncu's
            # base unit.
            given = unit.get(metric, "")
            if metric.startswith("gpu__time") and given not in UNITS:
                given = "ns"
            launch[key] = number(cell.get(metric), given)
        if launch["grid"] is None and cell.get("Grid Size"):
            launch["grid_text"] = cell["Grid Size"]
        stalls = []
        for column, text in cell.items():
            match = STALL.match(column)
            value = number(text, "") if match else None
            if value is not None:
                stalls.append((value, match.group(1)))
        launch["stalls"] = [{"reason": r, "cycles_per_issue": v}
                            for v, r in sorted(stalls, reverse=True)[:3]]
        launches.append(launch)
    return launches


def fmt(value, pattern):
    return "-" if value is None else pattern.format(value)


def render(launches):
    lines = [f"{'kernel':<44} {'grid':>7} {'regs':>4} {'us':>9} {'DRAM GB/s':>9} "
             f"{'DRAM%':>5} {'L2%':>5} {'L1%':>5} {'SM%':>5} {'occ%':>5} {'L2/DRAM':>7}  "
             "stalls (cycles per issue)"]
    for l in launches:
        seconds = l["seconds"]
        dram = l["dram_bytes"] if l["dram_bytes"] is not None else l["dram_read_bytes"]
        rate = dram / seconds / 1e9 if dram is not None and seconds else None
        ratio = l["l2_bytes"] / dram if l["l2_bytes"] is not None and dram else None
        grid = fmt(l["grid"], "{:.0f}") if "grid_text" not in l else l["grid_text"]
        stalls = ", ".join(f"{s['reason']} {s['cycles_per_issue']:.1f}" for s in l["stalls"])
        lines.append(
            f"{l['kernel'][:44]:<44} {grid:>7} {fmt(l['registers'], '{:.0f}'):>4} "
            f"{fmt(None if seconds is None else seconds * 1e6, '{:.1f}'):>9} "
            f"{fmt(rate, '{:.0f}'):>9} {fmt(l['dram_pct'], '{:.0f}'):>5} "
            f"{fmt(l['l2_pct'], '{:.0f}'):>5} {fmt(l['l1_pct'], '{:.0f}'):>5} "
            f"{fmt(l['sm_pct'], '{:.0f}'):>5} {fmt(l['occupancy_pct'], '{:.0f}'):>5} "
            f"{fmt(ratio, '{:.2f}'):>7}  {stalls or '-'}")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw_csv")
    parser.add_argument("--json", help="also write the launches as JSON here")
    args = parser.parse_args(argv)
    launches = read(args.raw_csv)
    if not launches:
        print(f"ncu_summary: no kernel launches in {args.raw_csv}")
        return 1
    print(render(launches))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(launches, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
