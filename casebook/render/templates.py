"""Jinja templates of the site's pages (casebook/templates/site-*.md.j2), and the YAML front matter above each.

The environment escapes every `{{ value }}` with `text.esc` (HTML and Markdown syntax both), so a
template cannot forget to; only values built as `Markup` (notes rendered safely, source code placed
inside a fence) pass through as they are.
"""

from __future__ import annotations

import functools
import html
import re

import jinja2
import yaml
from markupsafe import Markup

from casebook.render import text


def _finalize(value: object) -> object:
    if value is None:
        return "–"
    return text.esc(value)


@functools.cache
def env() -> jinja2.Environment:
    e = jinja2.Environment(
        loader=jinja2.PackageLoader("casebook", "templates"),
        autoescape=True, finalize=_finalize, trim_blocks=True, lstrip_blocks=False,
        keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
    )
    e.filters.update(ident=_ident, shell=_shell, safe_url=text.safe_url, num=text.num, pct=text.pct,
                     times=text.times, us=text.us, shape=text.shape, shape_short=text.shape_short)
    return e


def _ident(value: object) -> Markup:
    """An id for a code span or block, where entities would show: passed raw only if it is an id."""
    s = str(value)
    if re.fullmatch(r"[A-Za-z0-9_.-]+", s):
        return Markup(s)
    return text.esc(s)


def _shell(value: object) -> Markup:
    """A command for a ```bash block: raw when it is plain words, else refused (a block shows entities)."""
    s = text.plain(value)
    if re.fullmatch(r"[A-Za-z0-9_ ./=:,+-]+", s):
        return Markup(s)
    return Markup("# (the stored command has unusual characters; see the result file)")


def render(template: str, **context) -> str:
    return env().get_template(f"site-{template}.md.j2").render(**context)


def front_matter(title: str, description: str | None = None, **extra) -> Markup:
    """YAML front matter written by the YAML dumper (never by string pasting); the title and the
    description HTML-escaped, quotes included, because the theme prints them into <title>, the
    navigation and <meta name="description" content="..."> without escaping."""
    fields = {"title": html.escape(text.plain(title))}
    if description is not None:
        fields["description"] = html.escape(text.plain(description), quote=True)
    return Markup(yaml.safe_dump({**fields, **extra}, allow_unicode=True, sort_keys=False).strip())
