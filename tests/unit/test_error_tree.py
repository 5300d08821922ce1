"""The tree drawn at the top of ``duetime.errors`` is the classes' own: every error class is in it,
under the parent it subclasses, and every class in it exists."""

from __future__ import annotations

import inspect
import re

import duetime.errors as errors


def _drawn() -> dict[str, str | None]:
    """Each class of the drawing, with the class drawn above it (None for the root)."""
    doc = errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        found = re.match(r"^(?P<lead>[\s│├└─]*)(?P<name>[A-Z]\w+)(\s|$)", line)
        if not found or not re.search(r"[├└]|^    DuetimeError", line):
            continue
        depth = len(found["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[found["name"]] = stack[-1][1] if stack else None
        stack.append((depth, found["name"]))
    return parents


def test_the_drawn_tree_is_the_error_classes() -> None:
    drawn = _drawn()
    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, errors.DuetimeError) and cls.__module__ == errors.__name__
    }
    assert set(drawn) == set(classes), set(drawn) ^ set(classes)
    for name, parent in drawn.items():
        duetime_bases = [b.__name__ for b in classes[name].__bases__ if issubclass(b, errors.DuetimeError)]
        assert duetime_bases == ([parent] if parent else []), (name, duetime_bases, parent)


def test_the_store_and_the_transport_each_have_a_family() -> None:
    for member in (
        errors.StoreNotReady,
        errors.StorageFull,
        errors.DuplicateMessageId,
        errors.MessageInFlight,
    ):
        assert issubclass(member, errors.StoreError)
    for member in (errors.DestinationNotFound, errors.MessageRefused, errors.DestinationUnavailable):
        assert issubclass(member, errors.TransportError)
