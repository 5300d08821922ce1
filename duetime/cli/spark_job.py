"""The bulk commands as a file ``spark-submit`` runs: the cluster's master and settings win.

spark-submit --master spark://host:7077 $(python -m duetime.cli.spark_job --path) migrate --from … --to …
"""

from __future__ import annotations

import sys

from duetime.cli.bulk import bulk_app


def main() -> None:
    if sys.argv[1:] == ["--path"]:
        print(__file__)
        return
    bulk_app()


if __name__ == "__main__":
    main()
