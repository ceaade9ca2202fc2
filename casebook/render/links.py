"""Where each generated page and image lives in the docs tree (source paths, as Markdown links use)."""

from __future__ import annotations

import posixpath
import re

from markupsafe import Markup

from casebook.result import slug

_SAFE = re.compile(r"^[A-Za-z0-9_./#-]*$")

CASES = "cases"
BROWSE = "browse"
BY_BOTTLENECK = f"{BROWSE}/bottleneck.md"
BY_PATTERN = f"{BROWSE}/pattern.md"
BY_OPERATOR = f"{BROWSE}/operator.md"
BY_HARDWARE = f"{BROWSE}/hardware.md"
TRANSFERS = f"{BROWSE}/transfers.md"
CLAIMS = f"{BROWSE}/claims.md"
TAGS = f"{BROWSE}/tags.md"
CASE_INDEX = f"{CASES}/index.md"
NOTEBOOKS = "notebooks"
NOTEBOOK_INDEX = f"{NOTEBOOKS}/index.md"
ATLAS = "atlas.md"
HARDWARE = "hardware.md"
IMAGES = "img"


def case_page(case_id: str) -> str:
    return f"{CASES}/{case_id}.md"


def notebook_page(name: str) -> str:
    return f"{NOTEBOOKS}/{name}.md"


def image(name: str) -> str:
    return f"{IMAGES}/{name}.svg"


def safe(url: str) -> Markup:
    """A link built from ids and slugs only, so it can go into the page unescaped (checked, not trusted)."""
    if not _SAFE.match(url):
        raise ValueError(f"unsafe characters in a generated link: {url!r}")
    return Markup(url)


def rel(from_page: str, to: str, fragment: str | None = None) -> Markup:
    """A Markdown link from one source page to another source path (mkdocs checks and rewrites it),
    optionally to the heading whose text is `fragment`."""
    url = posixpath.relpath(to, posixpath.dirname(from_page) or ".")
    return safe(url + (f"#{anchor(fragment)}" if fragment is not None else ""))


def anchor(text: str) -> Markup:
    """The id of an operator, pattern or hardware heading."""
    return safe(slug(text) or "x")
