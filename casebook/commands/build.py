"""`casebook build` and `casebook serve`: the mkdocs-material site from cases and stored results."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

CONFIG = "mkdocs.yml"


def _config_file() -> Path:
    """mkdocs.yml in the working directory (the repository root), else beside the package."""
    here = Path.cwd() / CONFIG
    return here if here.is_file() else Path(__file__).resolve().parents[2] / CONFIG


def main(out: Path, strict: bool = True) -> int:
    """Build the site into `out`; 0 on success, 1 when a case, a result or a link is broken."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")  # the theme's banner is not about this site
    logging.basicConfig(format="%(levelname)-7s -  %(message)s", level=logging.INFO)
    logging.getLogger("mkdocs").setLevel(logging.WARNING)  # warnings and errors only; strict counts them
    start = time.perf_counter()
    try:
        config = load_config(str(_config_file()), site_dir=str(Path(out).resolve()), strict=strict)
        build(config)
    except (MkDocsException, SystemExit) as err:
        msg = str(err) if not isinstance(err, SystemExit) or not isinstance(err.code, int) else ""
        print(f"casebook build failed{': ' + msg if msg else ''}", file=sys.stderr)
        return 1
    print(f"site written to {out} in {time.perf_counter() - start:.1f} s")
    return 0


def serve(port: int = 8000) -> int:
    """Build and serve on 127.0.0.1:port, rebuilding when docs, cases, results or kernels change."""
    from mkdocs.commands.serve import serve as mkdocs_serve

    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    print(f"serving the site at http://127.0.0.1:{port}/ (rebuilt when docs, cases, results or kernels change; "
          "Ctrl-C stops)", flush=True)
    try:
        mkdocs_serve(config_file=str(_config_file()), dev_addr=f"127.0.0.1:{port}", livereload=True)
    except KeyboardInterrupt:
        pass
    return 0
