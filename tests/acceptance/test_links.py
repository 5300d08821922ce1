"""Every relative link and anchor in the README, the docs, the CHANGELOG and deploy/ leads somewhere.

mkdocs' strict build checks the pages of the site against each other; this checks what it does not
see: the README, the CHANGELOG, the files in deploy/ (the systemd unit's ``Documentation=``), and
links from the docs out of the site (to ``bench/RESULTS.md``, to a source file)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where deploy/duetime.service expects duetime's clone (its ExecStart runs /opt/duetime/.venv/bin/duetime)
INSTALLED = "file:/opt/duetime/"


def slug(heading: str) -> str:
    """A heading's anchor as mkdocs (Python-Markdown's toc) and GitHub make it."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors a page has: its headings, its ``id=``s, those of the files it includes
    (``--8<-- "bench/RESULTS.md"``) and, for the API reference, ``duetime.Name`` below ``::: duetime``."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    found = {slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M)}
    found |= set(re.findall(r'id="([^"]+)"', text))
    for included in re.findall(r'^--8<-- "([^"]+)"', text, flags=re.M):
        found |= anchors(ROOT / included)
    for documented in re.findall(r"^::: ([\w.]+)", text, flags=re.M):
        module = __import__(documented)
        found |= {f"{documented}.{name}" for name in getattr(module, "__all__", [])}
    return found


def links(path: Path) -> list[str]:
    text = path.read_text()
    if path.suffix == ".md":
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("Documentation=")]


def sources() -> list[Path]:
    return [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted(p for p in (ROOT / "deploy").iterdir() if p.is_file()),
    ]


def broken(source: Path, link: str) -> str | None:
    if re.match(r"[a-z]+://|mailto:", link) and not link.startswith(INSTALLED):
        return None  # absolute: not this repository's to check
    target, _, anchor = link.removeprefix(INSTALLED).partition("#")
    if link.startswith(INSTALLED):
        page = ROOT / target
    else:
        page = (source.parent / target).resolve() if target else source
    if not page.exists():
        return f"{link}: no such file"
    if anchor and page.suffix == ".md" and anchor not in anchors(page):
        return f"{link}: no heading #{anchor} in {page.relative_to(ROOT)}"
    return None


def test_every_relative_link_and_anchor_leads_somewhere() -> None:
    checked = 0
    problems = []
    for source in sources():
        for link in links(source):
            checked += 1
            problem = broken(source, link)
            if problem:
                problems.append(f"{source.relative_to(ROOT)}: {problem}")
    assert checked > 100
    assert not problems, "\n".join(problems)


def test_the_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    page = ROOT / "docs" / "install.md"
    assert broken(page, "tutorial.md#0-install") is None
    assert broken(page, "tutorial.md#no-such-step")
    assert broken(page, "no-such-page.md")
    assert broken(ROOT / "deploy" / "duetime.service", "file:/opt/duetime/docs/how-to/service.md") is None
    assert slug("Files: any filesystem the cluster has") == "files-any-filesystem-the-cluster-has"
    assert slug("`duetime run`, in **production**") == "duetime-run-in-production"


def test_every_how_to_page_is_reachable_from_the_home_page() -> None:
    """`how-to/load.md` was in the navigation but linked from no page: a reader of the site's home
    page (or the README on GitHub) never found it."""
    home = (ROOT / "docs" / "index.md").read_text() + (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs" / "how-to").glob("*.md")):
        assert f"how-to/{page.name}" in home, (
            f"{page.name} is linked from neither docs/index.md nor README.md"
        )
