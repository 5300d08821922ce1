"""The command line builds only the command it runs, and that command is the one a full build makes."""

from __future__ import annotations

import pytest

from duetime.cli import command


def names(args: list[str]) -> set[str]:
    return set(command(args).commands)


def test_only_the_command_named_is_built_after_the_apps_own_options() -> None:
    assert names(["list", "--store", "sqlite:///x.db"]) == {"list"}
    assert names(["--store", "sqlite:///x.db", "--endpoint", "e", "stats"]) == {"stats"}
    assert names(["--store=sqlite:///x.db", "bulk", "migrate"]) == {"bulk"}


@pytest.mark.parametrize(
    "args", [[], ["--help"], ["--version"], ["lisst"], ["--storex", "list"], ["--store"]]
)
def test_without_a_command_named_exactly_everything_is_built(args: list[str]) -> None:
    """--help lists every command, and a misspelling is answered with the names there are."""
    assert names(args) == names([]) and len(names([])) > 20


def test_a_command_built_alone_is_the_one_a_full_build_makes() -> None:
    full = command([])
    for name in ("schedule", "run", "recurring", "bulk"):
        alone = command([name]).commands[name]
        whole = full.commands[name]
        assert [p.opts for p in alone.params] == [p.opts for p in whole.params]
        assert [getattr(p, "help", None) for p in alone.params] == [
            getattr(p, "help", None) for p in whole.params
        ]
        assert sorted(getattr(alone, "commands", {})) == sorted(getattr(whole, "commands", {}))
