#!/usr/bin/env python3
"""Fuzz a node for longer than the suite does: tests/security/test_fuzz.py with many more
examples (JSON bodies, paths, queries and protobuf requests against a node on loopback), then
a count of the outcomes. Exits non-zero when any example made the node fail (a 5xx, an
INTERNAL / UNKNOWN gRPC status) or hang.

    python scripts/fuzz.py --examples 20000
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=20000, help="examples per test")
    ap.add_argument("--max-seconds", type=float, default=3600,
                    help="time bound of the whole run")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "outcomes")
        env = {**os.environ, "DOQ_FUZZ_EXAMPLES": str(a.examples), "DOQ_FUZZ_STATS": stats}
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "--timeout", str(int(a.max_seconds)),
                                   "tests/security/test_fuzz.py"], cwd=REPO, env=env,
                                  timeout=a.max_seconds + 60)
            code = done.returncode
        except subprocess.TimeoutExpired:
            print("the run did not finish in time: a hang?")
            code = 1
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        if os.path.exists(stats):
            with open(stats, encoding="utf-8") as f:
                counts.update(tuple(line.split()) for line in f if line.strip())  # type: ignore[misc]
    print(f"{sum(counts.values())} requests")
    for (kind, outcome), n in sorted(counts.items()):
        print(f"  {kind:11} {outcome:20} {n}")
    return code


if __name__ == "__main__":
    sys.exit(main())
