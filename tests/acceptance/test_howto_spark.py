"""The Spark page's shell commands, run as written (see test_howto.py, which runs every other
how-to page's): in a file of its own because its jobs take minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.test_howto import OWN_FILE, pages, run_page

pytestmark = pytest.mark.spark


def test_it_is_a_page_with_commands_and_this_is_its_file() -> None:
    assert "spark.md" in pages() and OWN_FILE["spark.md"].endswith(Path(__file__).name)


@pytest.mark.timeout(600)
def test_the_spark_pages_commands_run_as_written(tmp_path: Path) -> None:
    said = run_page("spark.md", tmp_path)
    # the page's dispatcher had nothing due: its delivery log folder exists and holds no file yet
    assert "holds no deliveries yet: no lateness to show" in said, said[-3000:]
