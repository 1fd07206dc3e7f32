"""What the reference worker's requests cost on the host beside their kernels' device time, from
the records ``KERNFORGE_REFWORKER_PROFILER=torch`` leaves (bench/h200.sh ``routinet``): per
request (``ref.<op>``), its count, host and device milliseconds per request and their ratio, and
the ops that took the most device time. A request whose device time is near its host time is
bound by the GPU (memory traffic: drawing, copying, comparing); one whose device time is a small
share of it is bound by launching its kernels and by Python.

    python bench/refworker_profile.py prof/              # every refworker-*.torch.json there
    python bench/refworker_profile.py prof/ --ops 20     # and the 20 ops with the most device time
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def merged(folder: Path) -> dict[str, dict[str, float]]:
    """Every record's rows in ``folder``, summed by name (count, microseconds)."""
    total: dict[str, dict[str, float]] = {}
    for path in sorted(folder.glob("refworker-*.torch.json")):
        for name, row in json.loads(path.read_text()).items():
            into = total.setdefault(name, {"count": 0, "cpu_us": 0.0, "self_cpu_us": 0.0, "device_us": 0.0, "self_device_us": 0.0})
            for key in into:
                into[key] += float(row.get(key) or 0)
    return total


def requests_table(rows: dict[str, dict[str, float]]) -> list[tuple[Any, ...]]:
    """(request, count, host ms each, device ms each, device share of host) for each ``ref.<op>``, most host time first."""
    out = []
    for name, row in rows.items():
        if not name.startswith("ref.") or not row["count"]:
            continue
        n = row["count"]
        host, device = row["cpu_us"] / n / 1e3, row["device_us"] / n / 1e3
        out.append((name, int(n), host, device, device / host if host else 0.0))
    return sorted(out, key=lambda r: -r[1] * r[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--ops", type=int, default=12, help="how many ops to list by device time")
    args = parser.parse_args()
    rows = merged(args.folder)
    if not rows:
        raise SystemExit(f"no refworker-*.torch.json in {args.folder} (run with KERNFORGE_REFWORKER_PROFILER=torch)")
    print(f"{'request':24s} {'count':>6s} {'host ms':>9s} {'device ms':>10s} {'device/host':>12s}")
    for name, n, host, device, share in requests_table(rows):
        print(f"{name:24s} {n:6d} {host:9.2f} {device:10.2f} {share:12.0%}")
    ops = sorted(((k, r) for k, r in rows.items() if not k.startswith("ref.")),
                 key=lambda kr: (-kr[1]["self_device_us"], -kr[1]["self_cpu_us"]))
    print(f"\n{'op':40s} {'count':>7s} {'device ms':>10s} {'host ms':>9s}")
    for name, row in ops[:args.ops]:
        print(f"{name[:40]:40s} {int(row['count']):7d} {row['self_device_us'] / 1e3:10.1f} {row['self_cpu_us'] / 1e3:9.1f}")


if __name__ == "__main__":
    main()
