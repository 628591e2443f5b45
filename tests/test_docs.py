"""The README is the overview; the reference is in docs/, one page per topic.

The README stays short and links every page under docs/, and every
relative link of the README and of the pages reaches a file that exists
and, where it names one, a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_readme_stays_an_overview() -> None:
    size = len(README.read_bytes())
    assert size < 25_000, f"README.md has {size} bytes: move reference material to docs/"


def test_the_readme_links_every_page() -> None:
    linked = {target.split("#", 1)[0] for target in LINK.findall(README.read_text())}
    missing = [f"docs/{page.name}" for page in PAGES if f"docs/{page.name}" not in linked]
    assert not missing, f"README.md's 'Where to read more' must link {missing}"


@pytest.mark.parametrize("document", [README, *PAGES], ids=lambda path: path.name)
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", document.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (document.parent / path) if path else document
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{document.relative_to(ROOT)} links to {broken}"
