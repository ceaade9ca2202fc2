"""One module per CLI command: each parses nothing, calls the library, prints, returns an exit code."""

import sys

from rich.console import Console

PIPED_WIDTH = 160
"""Columns a table takes where the output is a pipe or a file (a log), not a terminal."""


def console(stderr: bool = False, **options) -> Console:
    """A console for a command's output: a terminal's own width, else `PIPED_WIDTH` for tables and no wrapping of
    lines (a log's paths and names stay whole)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH, soft_wrap=True, **options)
