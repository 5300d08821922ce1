"""Write tests/file-seconds.json from a JUnit XML report of a whole suite run: each test file's
seconds, which tests/conftest.py uses to start the longest files first (a worker that picks up a
long file last keeps the whole run waiting for it).

    bash scripts/test.sh --junitxml=/tmp/suite.xml && .venv/bin/python scripts/file-seconds.py /tmp/suite.xml
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def main(
    report: str, out: Path = Path(__file__).resolve().parent.parent / "tests" / "file-seconds.json"
) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for case in ElementTree.parse(report).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        module = max((i for i, part in enumerate(parts) if part.startswith("test_")), default=-1)
        if module >= 0:
            seconds["/".join(parts[: module + 1]) + ".py"] += float(case.get("time") or 0)
    ranked = {name: round(value, 1) for name, value in seconds.most_common()}
    out.write_text(json.dumps(ranked, indent=1) + "\n")
    print(f"{out}: {len(ranked)} files, {sum(ranked.values()):.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1])
