#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS instruction: the instructions with the most warp-stall
samples in Nsight Compute's source page, each with its share of all samples and its largest stall
reasons. The input is the CSV that bench/indexer_loss_profile.py's docstring shows how to make:

  ncu -i isb.ncu-rep --page source --csv --print-source sass > isb_sass.csv
  python3 bench/ncu_stall_top.py isb_sass.csv --top 12
"""
import argparse
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    with open(a.csv, errors="replace") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and SAMPLES in r), None)
    if header_at is None:
        raise SystemExit(f"{a.csv}: no header with 'Source' and '{SAMPLES}'")
    header = rows[header_at]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    source, samples = header.index("Source"), header.index(SAMPLES)
    # Per-reason columns (stall_long_sb, ...), all samples rather than the not-issued ones.
    reasons = [i for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(number(r[samples]) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} warp-stall samples")
    for r in sorted(body, key=lambda r: -number(r[samples]))[:a.top]:
        largest = sorted(((number(r[i]), header[i]) for i in reasons), reverse=True)[:2]
        why = ", ".join(f"{name[6:]} {value / total * 100:.1f} %" for value, name in largest if value)
        print(f"{number(r[samples]) / total * 100:5.1f} %  {r[source].strip()[:64]:64s}  {why}")


if __name__ == "__main__":
    main()
