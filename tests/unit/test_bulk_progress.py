"""How a bulk job's progress reads where nobody watches a terminal (a log file, a CI job)."""

from __future__ import annotations

import pytest


def test_a_bulk_jobs_progress_off_a_terminal_is_a_line_of_rows_rate_and_time_left(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from duetime.cli.row_progress import RowReport as _RowReport

    with _RowReport("scheduling") as report:
        report.LOG_EVERY = 0.0
        report.started -= 10  # ten seconds in
        report("scheduling", 400_000, 1_000_000)
        report("writing", 50, None)  # a total it cannot know
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("scheduling: 400,000 of 1,000,000 rows (40%), ")
    assert "rows/s, about " in lines[0] and lines[0].endswith(" left")
    assert (
        lines[1].startswith("writing: 50 rows, ") and lines[-1] == lines[1]
    )  # and the last, again at the end
