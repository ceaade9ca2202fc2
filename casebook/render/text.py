"""Escaping and number formatting for generated pages.

Every string from a case or a result reaches the page through `esc`: HTML-escaped, and with the
characters Markdown (and its extensions: attr_list braces, tables' pipes, links' brackets) would
act on replaced by numeric entities, so that case text is shown as text and never becomes markup.
Backtick spans become <code>; a Markdown field (`writeup.notes`) goes through `markdown_html`.
"""

from __future__ import annotations

import html
import math
import re
import urllib.parse
import xml.etree.ElementTree as ET

import markdown
from markupsafe import Markup

_ENTITIES = {c: f"&#{ord(c)};" for c in "&<>\"'\\`*_[](){}#+-!|~^=:$"}
_CODE = re.compile(r"`([^`\n]+)`")


def _entities(text: str) -> str:
    return "".join(_ENTITIES.get(c, c) for c in text)


def esc(value: object) -> Markup:
    """Case or result text as inert HTML; `code` spans kept; newlines folded into spaces."""
    if isinstance(value, Markup):
        return value
    text = " ".join(str(value).split())
    parts = []
    last = 0
    for m in _CODE.finditer(text):
        parts.append(_entities(text[last:m.start()]))
        parts.append(f"<code>{_entities(m.group(1))}</code>")
        last = m.end()
    parts.append(_entities(text[last:]))
    return Markup("".join(parts))


def plain(value: object) -> str:
    """Text for a context that escapes by itself (YAML front matter, matplotlib labels)."""
    return " ".join(str(value).split())


_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):")
_IGNORED_IN_URLS = re.compile(r"[\x00-\x20\x7f]")  # browsers drop these inside a URL's scheme


def safe_url(url: str) -> bool:
    """True for an http(s), in-page (`#...`) or relative link, judged as the browser reads it: entities
    (`&colon;`) and percent-escapes (`%3A`) decoded first, whitespace and control characters dropped,
    backslashes read as slashes. Everything else (javascript:, data:, vbscript:, `//host`) is refused."""
    v = str(url)
    for _ in range(4):  # nested encodings: &amp;colon;, %253A
        decoded = urllib.parse.unquote(html.unescape(v))
        if decoded == v:
            break
        v = decoded
    v = _IGNORED_IN_URLS.sub("", v).replace("\\", "/").lower()
    if v.startswith(("http://", "https://")):
        return True
    if v.startswith("//"):  # another host, whatever the scheme
        return False
    return _SCHEME.match(v) is None


class _SafeLinks(markdown.treeprocessors.Treeprocessor):
    """Replace link and image targets that are not http(s), in-page or relative links with `#`."""

    def run(self, root: ET.Element) -> None:
        for el in root.iter():
            for attr in ("href", "src"):
                value = el.get(attr)
                if value is not None and not safe_url(value):
                    el.set(attr, "#")
            if el.tag == "img":  # images from case prose would be off-host requests
                el.tag = "span"
                el.text = el.get("alt", "")
                for attr in list(el.attrib):
                    del el.attrib[attr]


def markdown_html(source: str, css: str = "cb-notes") -> Markup:
    """A Markdown field rendered with raw HTML shown as text and unsafe links dropped, as inert HTML in a <div> of
    class `css`."""
    md = markdown.Markdown(extensions=["tables", "fenced_code", "sane_lists"])
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    md.treeprocessors.register(_SafeLinks(md), "casebook_safe_links", 0)
    rendered = md.convert(lists_apart(unfold_lists(source)))
    return Markup(f'<div class="{css}">\n{inert(rendered)}\n</div>')


_HEADING = re.compile(r"^(#{2,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def markdown_sections(source: str) -> list[tuple[int, str, Markup]]:
    """A long Markdown document (a case's notebook) cut at its headings (## to ######, outside fenced code), each
    section rendered as `markdown_html` renders a field: [(level, heading, html)], level 0 and no heading for what
    precedes the first. The headings go on the page as headings of its own (escaped by `esc`), so the site's
    table of contents and permalinks reach them."""
    cut: list[tuple[int, str, list[str]]] = [(0, "", [])]
    fence = ""
    for line in source.splitlines():
        m = _FENCE.match(line)
        if m and not fence:
            fence = m.group(1)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = ""
        elif not fence and (h := _HEADING.match(line)):
            cut.append((len(h.group(1)), h.group(2), []))
            continue
        cut[-1][2].append(line)
    return [(level, heading, markdown_html("\n".join(lines), "cb-notebook")) for level, heading, lines in cut
            if heading or any(line.strip() for line in lines)]


def inert(rendered_html: str) -> str:
    """HTML that the page's own Markdown pass leaves alone: the site's fences (``` and ~~~, which
    superfences finds before raw HTML is set aside, even indented) cannot open or close inside it,
    since their characters are numeric entities (shown the same by the browser)."""
    return rendered_html.replace("`", "&#96;").replace("~", "&#126;")


def code_html(source: str, language: str = "python") -> Markup:
    """Source code as a highlighted HTML listing (Pygments), never through a Markdown fence."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name

    listing = highlight(source, get_lexer_by_name(language), HtmlFormatter(cssclass="highlight", wrapcode=True))
    return Markup(inert(listing))


def unfold_lists(source: str) -> str:
    """A Markdown list that YAML folding put on one line ("Steps: - one - two") back on lines of its own.

    Only where a line holds at least two ` - item` runs after a colon or a full stop (or from its start), and
    only at dashes outside brackets, so a dash in prose ("exp(x - max)", "a - b") stays prose."""
    out = []
    for row in source.split("\n"):
        head, *items = _split_dashes(row)
        if len(items) >= 2 and (not head.strip() or head.rstrip().endswith((":", "."))) and not row.startswith("    "):
            out += ([head, ""] if head.strip() else []) + [f"- {item}" for item in items] + [""]
        else:
            out.append(row)
    return "\n".join(out)


_DASH = re.compile(r"(?:^| +)- (?=\S)")


def _split_dashes(row: str) -> list[str]:
    """The row cut at each ` - ` that is not inside parentheses or brackets."""
    cuts = [m for m in _DASH.finditer(row)
            if row.count("(", 0, m.start()) + row.count("[", 0, m.start())
            == row.count(")", 0, m.start()) + row.count("]", 0, m.start())]
    bounds = [0] + [x for m in cuts for x in (m.start(), m.end())] + [len(row)]
    return [row[a:b] for a, b in zip(bounds[::2], bounds[1::2])]


_ITEM = re.compile(r"(?:[-*+]|\d+\.) \S")


def lists_apart(source: str) -> str:
    """A blank line between a list and a paragraph at the margin right above or below it: Python-Markdown
    (unlike CommonMark) would run the list into the paragraph as text ("says: - one - two")."""
    out: list[str] = []
    in_list = fenced = False
    for line in source.split("\n"):
        fence = line.lstrip().startswith(("```", "~~~"))
        if fenced:  # inside a code block: as it is
            fenced = not fence
            out.append(line)
            continue
        item = bool(_ITEM.match(line))
        margin = bool(line.strip()) and not line[0].isspace()
        if margin and item != in_list and out and out[-1].strip():
            out.append("")
        in_list = item or (in_list and not margin)
        fenced = fence
        out.append(line)
    return "\n".join(out)


# --- numbers ---------------------------------------------------------------------------------


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(x: object, digits: int = 3) -> str:
    """A number with `digits` significant figures, thousands separated; `–` when absent."""
    if not _finite(x):
        return "–"
    x = float(x)
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:,.{decimals}f}"


def us(x: object) -> str:
    return f"{num(x)} µs" if _finite(x) else "–"


def pct(x: object) -> str:
    return f"{100 * float(x):.0f}%" if _finite(x) else "–"


def times(x: object) -> str:
    return f"{float(x):.2f}×" if _finite(x) else "–"


def nbytes(x: object) -> str:
    if not _finite(x):
        return "–"
    x = float(x)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(x) < 1000 or unit == "TB":
            return f"{num(x)} {unit}"
        x /= 1000
    return "–"


def rate(x: object, unit: str = "FLOP/s", base: float = 1e12) -> str:
    """A rate in the unit that fits it: `rate(2.1e-5)` (TFLOP/s) -> `21.0 MFLOP/s`, `rate(4245, "B/s", 1e9)`
    -> `4.25 TB/s`; a CPU's numbers read as plainly as a GPU's."""
    if not _finite(x):
        return "–"
    v = float(x) * base
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{num(v / scale)} {prefix}{unit}"
    return f"{num(v)} {unit}"


def shape(s: dict) -> str:
    """`{rows: 32768, cols: 4096}` -> `rows 32768 × cols 4096`, words kept so that search finds them."""
    return " × ".join(f"{k} {v}" for k, v in s.items())


def shape_short(s: dict) -> str:
    return "×".join(str(v) for v in s.values())
