r"""An earlier revision beside the working tree, in one run: did a change make duetime slower?

    .venv/bin/python bench/before_after.py REV [--rounds 3] [--bench postgres_bench.py --only dispatch]

Checks REV out into a temporary git worktree, then runs the same bench script (this tree's copy)
alternately against REV's ``duetime`` package and this tree's, ``--rounds`` times each, so both
see the same machine noise. Prints every "ratio" line of each run and the median per line: the
ratios (duetime against the raw driver loop measured in the same run) are what to compare.
``--figure REGEX`` picks other lines (groups ``what`` and ``ratio``), e.g. the bulk benches':

    .venv/bin/python bench/before_after.py REV --rounds 2 --bench cluster_bench.py \
        --figure '(?P<what>migrate)\s+[\d.]+ s\s+= (?P<ratio>[\d.]+)x' --migrate-rounds 1 --rows 500000
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RATIO = re.compile(r"^\s*(?P<what>.+?)\s+[\d,]+ msg/s\s+ratio (?P<ratio>[\d.]+)")


def run(code: Path, bench: str, extra: list[str], figure: re.Pattern[str] = RATIO) -> dict[str, float]:
    """The bench's figures, run with ``code``'s duetime (PYTHONPATH: the benches put the
    repository's root last on their path, so it wins, in Spark's Python workers too). PYTHONSAFEPATH:
    a ``python -c`` or ``python -m`` a bench starts puts its current folder first otherwise, and
    from the repository's root that is this tree's duetime, whatever PYTHONPATH says."""
    env = os.environ | {"PYTHONPATH": str(code), "PYTHONSAFEPATH": "1"}
    out = subprocess.run(
        [sys.executable, str(HERE / bench), *extra], env=env, capture_output=True, text=True, check=True
    ).stdout
    return {m["what"].strip(): float(m["ratio"]) for line in out.splitlines() if (m := figure.search(line))}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rev", help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench", default="postgres_bench.py")
    parser.add_argument(
        "--figure",
        type=re.compile,
        default=RATIO,
        help="a regular expression with groups 'what' and 'ratio' picking the lines to compare "
        "(default: the 'NNN msg/s ratio R' lines of the scheduling and dispatch benches)",
    )
    args, extra = parser.parse_known_args()
    extra = extra or ["--quick", "--only", "scheduling,dispatch"]
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(before), args.rev], check=True
        )
        try:
            results: dict[str, dict[str, list[float]]] = {
                "before": defaultdict(list),
                "after": defaultdict(list),
            }
            for i in range(args.rounds):
                for label, code in (("before", before), ("after", ROOT)):
                    for what, ratio in run(code, args.bench, extra, args.figure).items():
                        results[label][what].append(ratio)
                        print(f"round {i + 1} {label:<6} {what:<36} ratio {ratio:.2f}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=True)
    print(f"\nmedian ratio over {args.rounds} rounds ({args.rev} -> working tree)")
    for what in results["after"]:
        b, a = statistics.median(results["before"][what]), statistics.median(results["after"][what])
        print(f"  {what:<36} before {b:.2f}   after {a:.2f}")


if __name__ == "__main__":
    main()
