"""Markdown for every generated page of the book's cases, indexes and machines, from the Jinja templates
(`render.templates`)."""

from __future__ import annotations

import re
from collections import Counter

from markupsafe import Markup

from casebook.render import figures, links, outlook, text, views
from casebook.render.book import Book, Entry, Notebook, kernel_source
from casebook.render.templates import front_matter, render
from casebook.render.words import BOTTLENECKS, CLAIM_MARK, PATTERNS
from casebook.result import Environment, Hardware

# --- the case page ---------------------------------------------------------------------------


def case_page(entry: Entry, book: Book, images: dict[tuple[str, str], str]) -> str:
    c = entry.case
    page = links.case_page(c.id)
    machines = []
    for stored in entry.results:
        mine = {kind: links.rel(page, path) for (slug, kind), path in images.items() if slug == stored.slug}
        m = views.machine(entry, stored, mine)
        m.hardware_url = links.rel(page, links.HARDWARE, stored.slug)
        machines.append(m)
    tags = list(dict.fromkeys([c.operator, c.bottleneck.kind, *c.patterns, *c.tags]))
    source = kernel_source(c.kernel.module)
    return render(
        "case",
        c=c,
        front_matter=front_matter(c.title, description=text.plain(c.summary)[:300], tags=tags,
                                  hide=["navigation"]),  # the page is wide tables and charts
        bottleneck_title=BOTTLENECKS[c.bottleneck.kind][0],
        ridges=[r for r in (views.ridge(entry, s) for s in entry.results) if r],
        patterns=[{"title": PATTERNS[p][0], "gloss": PATTERNS[p][1],
                   "url": links.rel(page, links.BY_PATTERN, p)} for p in c.patterns],
        transfers=[_transfer(t, page, book) for t in c.transfers],
        machines=machines,
        shapes_words="; ".join(text.shape(s) for s in c.levels.kernel.shapes),
        claims=_claims(entry, machines),
        projected=outlook.case_projections(entry, book),
        projections_url=links.rel(page, outlook.PROJECTIONS),
        counters=any(m.counters for m in machines),
        notes=text.markdown_html(c.writeup.notes) if c.writeup.notes.strip() else None,
        notebooks=[{"title": book.notebooks[n].title, "url": links.rel(page, links.notebook_page(n))}
                   for n in entry.notebooks],
        source=text.code_html(source) if source is not None else None,
        source_lines=source.count("\n") + 1 if source else 0,
    )


def _transfer(t, page: str, book: Book) -> dict:
    target = book.get(t.case) if t.case else None
    return {"operator": t.operator, "why": t.why,
            "url": links.rel(page, links.BY_OPERATOR, t.operator),
            "case": target.case.title if target else None,
            "case_url": links.rel(page, links.case_page(target.id)) if target else None}


def _claims(entry: Entry, machines: list[views.Machine]) -> list[dict]:
    """One row per claim of the case, one outcome per machine (matched by claim text)."""
    rows = []
    for claim in entry.case.claims:
        outcomes = []
        for m in machines:
            found = next((o for o in m.claims if o["text"] == claim.text), None)
            if found is None:
                outcomes.append({"mark": "·", "word": "not checked", "css": "cb-na", "detail": ""})
                continue
            word, css, mark = CLAIM_MARK[found["held"]]
            outcomes.append({"mark": mark, "word": word, "css": css, "detail": found["detail"]})
        rows.append({"text": claim.text, "outcomes": outcomes})
    return rows


# --- ways in ---------------------------------------------------------------------------------


WIDE = ["navigation"]
"""What a page of wide case tables hides at 1280 px: the section's page list (the header's tabs name it too),
so that the tables fit beside the table of contents."""


def notebook_page(notebook: Notebook, book: Book) -> str:
    page = links.notebook_page(notebook.name)
    cases = [{"title": book.get(c).case.title, "url": links.rel(page, links.case_page(c))} for c in notebook.cases]
    return render("notebook", front_matter=front_matter(notebook.title, description=f"The notebook of "
                                                       f"{', '.join(notebook.cases) or notebook.name}: floors, "
                                                       "predictions and measurements, in order"),
                  title=notebook.title, cases=cases,
                  sections=[{"marks": Markup("#" * level), "heading": heading, "html": html}
                            for level, heading, html in text.markdown_sections(notebook.body)])


def notebooks_index(book: Book) -> str:
    page = links.NOTEBOOK_INDEX
    return render("notebooks", front_matter=front_matter("Notebooks", hide=["toc"]),
                  notebooks=[{"title": n.title, "url": links.rel(page, links.notebook_page(n.name)),
                              "cases": [{"id": c, "url": links.rel(page, links.case_page(c))} for c in n.cases]}
                             for n in book.notebooks.values()])


def case_index(book: Book) -> str:
    """All cases in one wide table; the page has no sections, so no table of contents beside it."""
    page = links.CASE_INDEX
    return render("cases", front_matter=front_matter("All cases", hide=["toc"]),
                  rows=[views.case_row(e, page) for e in book.entries],
                  browse={k: links.rel(page, v) for k, v in _browse().items()})


def by_bottleneck(book: Book) -> str:
    page = links.BY_BOTTLENECK
    groups = []
    for kind, (title, gloss) in BOTTLENECKS.items():
        entries = [e for e in book.entries if e.case.bottleneck.kind == kind]
        groups.append({"kind": kind, "title": title, "gloss": gloss,
                       "rows": [views.case_row(e, page) for e in entries],
                       "stages": {e.id: e.case.bottleneck.stages for e in entries}})
    return render("by-bottleneck", front_matter=front_matter("Cases by bottleneck", hide=WIDE), groups=groups)


def by_pattern(book: Book) -> str:
    page = links.BY_PATTERN
    groups = [{"pattern": p, "anchor": links.anchor(p), "title": title, "gloss": gloss,
               "rows": [views.case_row(e, page) for e in book.entries if p in e.case.patterns]}
              for p, (title, gloss) in PATTERNS.items()]
    return render("by-pattern", front_matter=front_matter("Cases by pattern", hide=WIDE), groups=groups)


def by_operator(book: Book) -> str:
    page = links.BY_OPERATOR
    groups = [{"operator": op, "anchor": links.anchor(op),
               "rows": [views.case_row(e, page) for e in d["cases"]],
               "incoming": [{"case": views.case_row(e, page), "why": t.why} for e, t in d["incoming"]]}
              for op, d in views.operators(book).items()]
    return render("by-operator", front_matter=front_matter("Cases by operator", hide=WIDE), groups=groups)


def by_hardware(book: Book) -> str:
    page = links.BY_HARDWARE
    groups = []
    titles = views.machine_titles(book)
    for slug, results in book.hardware().items():
        rows = []
        for stored in results:
            entry = book.get(stored.result.case_id)
            m = views.machine(entry, stored, {})
            rows.append({"case": views.case_row(entry, page), "date": stored.result.started_at[:10],
                         "best": m.best or "–", "roof": text.pct(m.best_roof), "claims": m.claims_held,
                         "caveat": views.caveat(stored)})
        groups.append({"slug": slug, "name": titles[slug], "anchor": links.anchor(slug),
                       "hardware_url": links.rel(page, links.HARDWARE, slug), "rows": rows})
    return render("by-hardware", front_matter=front_matter("Cases by hardware"), groups=groups,
                  unmeasured=[views.case_row(e, page) for e in book.entries if not e.results])


def claims(book: Book) -> str:
    """Every claim of the book with its state: missed (with the number that missed), held, or not yet measured on
    the hardware it names; the missed ones first (what is open)."""
    page = links.CLAIMS
    keys = {id(r): key for key, results in book.hardware().items() for r in results}
    titles = views.machine_titles(book)
    judged, unmeasured, states = [], [], []
    for entry in book.entries:
        case = views.case_row(entry, page)
        for claim in views.claim_states(entry):
            states.append(claim["state"])
            judged += [{"case": case, "hardware": titles[keys[id(stored)]], "text": claim["text"],
                        "hardware_url": links.rel(page, links.BY_HARDWARE, links.anchor(keys[id(stored)])),
                        "detail": o.detail, "held": o.held, "caveat": views.caveat(stored)}
                       for stored, o in claim["judged"]]
            if claim["state"] == "unmeasured":
                unmeasured.append({"case": case, "text": claim["text"],
                                   "named": ", ".join(claim["hardware"] or ["any machine"]),
                                   "results": ", ".join(r.slug for r in entry.results) or "none"})
    judged.sort(key=lambda r: (r["held"], r["case"]["title"], r["hardware"]))
    return render("claims", front_matter=front_matter("Claims, held and open"), total=len(states),
                  counts={s: states.count(s) for s in views.CLAIM_STATES},
                  open=[r for r in judged if not r["held"]], held=[r for r in judged if r["held"]],
                  unmeasured=unmeasured)


def shown_by(book: Book, source: Entry, t) -> list[Entry]:
    """The cases that show a transfer: the one it names, else every other case of its operator in the book."""
    if t.case and book.get(t.case):
        return [book.get(t.case)]
    return [e for e in book.entries if e.case.operator == t.operator and e.id != source.id]


def transfers(book: Book) -> str:
    page = links.TRANSFERS
    rows = []
    for e in book.entries:
        for t in e.case.transfers:
            rows.append({"case": views.case_row(e, page), "operator": t.operator, "why": t.why,
                         "operator_url": links.rel(page, links.BY_OPERATOR, t.operator),
                         "targets": [views.case_row(x, page) for x in shown_by(book, e, t)]})
    return render("transfers", front_matter=front_matter("Transfer graph", hide=["toc"]), rows=rows,
                  graph=Markup(mermaid_graph(book)))


def mermaid_graph(book: Book) -> str:
    """case -> operator (or -> case) edges. Labels are reduced to safe characters: Mermaid has its own syntax."""
    # At its own size (its labels legible), scrolling inside its box where the page is narrower than the graph.
    lines = ['%%{init: {"flowchart": {"useMaxWidth": false}, "themeVariables": {"fontSize": "12px"}}}%%',
             "flowchart LR"]
    ops: dict[str, str] = {}
    for e in book.entries:
        lines.append(f'  c_{e.id}(["{_mermaid_label(e.id)}"]):::case')
    shown: set[tuple[str, str]] = set()
    for e in book.entries:
        for t in e.case.transfers:
            if t.case and book.get(t.case):
                lines.append(f"  c_{e.id} --> c_{t.case}")
                continue
            key = links.anchor(t.operator)
            if key not in ops:
                ops[key] = f"o{len(ops)}"
                lines.append(f'  {ops[key]}["{_mermaid_label(t.operator)}"]:::operator')
            lines.append(f"  c_{e.id} --> {ops[key]}")
            for x in shown_by(book, e, t):  # the operator's own cases: where the transfer is already shown
                if (ops[key], x.id) not in shown:
                    shown.add((ops[key], x.id))
                    lines.append(f"  {ops[key]} -. shown by .-> c_{x.id}")
    lines.append("  classDef case fill:#e8f0fe,stroke:#3f51b5,color:#1a237e")
    lines.append("  classDef operator fill:#fff8e1,stroke:#b28704,color:#4e3b00")
    return "\n".join(lines)


def _mermaid_label(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9 _.+/-]", " ", text.plain(s))[:48].strip() or "?"


def tags_page() -> str:
    return render("tags", front_matter=front_matter("Tags"))


def atlas(book: Book, images: dict[str, str]) -> str:
    page = links.ATLAS
    machines = []
    titles = views.machine_titles(book)
    for slug, results in book.hardware().items():
        rows = []
        for stored in results:
            entry = book.get(stored.result.case_id)
            m = views.machine(entry, stored, {})
            if m.best:
                rows.append({"case": views.case_row(entry, page), "best": m.best, "roof": text.pct(m.best_roof),
                             "caveat": views.caveat(stored), "off_plot": figures.off_atlas(entry, stored)})
        machines.append({"name": titles[slug], "anchor": links.anchor(slug), "rows": rows,
                         "image": links.rel(page, images[slug]) if slug in images else None})
    return render("atlas", front_matter=front_matter("Atlas"), machines=machines)


def home(book: Book, images: dict[str, str]) -> str:
    """The book on the home page: how many cases, a card per case with its headline number, the atlas of one
    machine that has one: a GPU before a CPU, then the one with the most cases drawn, then the one the book's
    claims name most (where an H100 and the H200 the claims are written for have as many cases, the H200). A
    fragment for docs/index.md, relative to it."""
    page = "index.md"
    named = Counter(slug for e in book.entries for c in e.case.claims for slug in c.hardware or [])

    def drawn(results) -> int:
        return sum(bool(figures.atlas_points(book.get(r.result.case_id), r)) for r in results)

    candidates = [(slug, results, drawn(results)) for slug, results in book.hardware().items() if slug in images]
    atlas_of = min(candidates, default=None, key=lambda c: (c[1][0].result.hardware.kind != "gpu", -c[2],
                                                            -named[c[1][0].slug], c[0]))
    atlas_view = None
    if atlas_of:
        slug, _, count = atlas_of
        atlas_view = {"name": views.machine_titles(book)[slug], "image": links.rel(page, images[slug]),
                      "url": links.rel(page, links.ATLAS, slug), "drawn": count}
    return render("home", cases=[views.card(e, page) for e in book.entries], atlas=atlas_view)


def hardware(book: Book, images: dict[str, str]) -> str:
    page = links.HARDWARE
    machines = []
    titles = views.machine_titles(book)
    for slug, results in book.hardware().items():
        latest = max(results, key=lambda r: r.result.started_at)
        hw = latest.result.hardware
        machines.append({"name": titles[slug], "slug": slug, "anchor": links.anchor(slug),
                         "kind": hw.kind or "–",
                         "rows": _ceiling_rows(hw, [r.result.hardware for r in results], latest.result.environment),
                         **_source(hw.datasheet.source if hw.datasheet is not None else None),
                         "environment": views._items(_environment(latest.result.environment)),
                         "date": latest.result.started_at, "cases": len(results),
                         "image": links.rel(page, images[slug]) if slug in images else None})
    return render("hardware", front_matter=front_matter("Hardware"), machines=machines)


def _source(source: object) -> dict:
    """A datasheet source: its leading http(s) URL as a link (nothing else may become one), the rest as text."""
    words = text.plain(source or "").split(" ", 1)
    if re.fullmatch(r"https?://[^\s\"'<>]+", words[0]):
        return {"source_url": words[0], "source_note": words[1] if len(words) > 1 else ""}
    return {"source_url": None, "source_note": " ".join(words)}


def _environment(env: Environment) -> dict:
    """What the hardware page shows of a run's environment."""
    values = {"device_name": env.device_name, "cpu": env.cpu, "cpu_count": env.cpu_count, "sm_count": env.sm_count,
              "memory_gb": env.memory_gb, "driver": env.driver_version, "cuda": env.cuda, "torch": env.torch,
              "triton": env.triton, "python": env.python, "platform": env.platform}
    return {shown: value or None for shown, value in values.items() if value or shown in ("driver", "cuda")}


def _ceiling_rows(hw: Hardware, every: list[Hardware], environment: Environment | None = None) -> list[dict]:
    """The latest result's ceilings beside their datasheet peaks, and the range each took over every stored
    result of the machine (a ceiling is measured once per run, and a GPU's clock moves with its load)."""
    d = hw.datasheet
    peaks = (d.peak_tflops if d is not None else None) or {}
    sheet_gbps = d.bandwidth_gbps if d is not None else None
    ceilings = [("copy bandwidth", "GB/s", lambda m: m.copy_gbps, sheet_gbps)]
    ceilings += [(f"{what} stream bandwidth", "GB/s", lambda m, key=key: getattr(m, key), sheet_gbps)
                 for what, key in (("read-only", "read_gbps"), ("write-only", "write_gbps"))
                 if any(getattr(h.measured, key) is not None for h in every)]
    for dtype in dict.fromkeys([*hw.measured.matmul_tflops, *peaks]):
        ceilings.append((f"{dtype} matmul", "TFLOP/s", lambda m, dtype=dtype: m.matmul_tflops.get(dtype),
                         peaks.get(dtype)))
    ceilings += [("kernel launch", "µs", lambda m: m.launch_us, None),
                 ("CUDA-graph launch", "µs", lambda m: m.graph_launch_us, None)]
    rows = [_ceiling(what, unit, measured(hw.measured), peak, [measured(h.measured) for h in every])
            for what, unit, measured, peak in ceilings]
    topo = hw.topology  # a multi-device run: the interconnect's ceiling, a large all-reduce's bus bandwidth
    if topo is not None and topo.bus_gbps:
        rows.append(_ceiling(f"interconnect ({topo.link or '?'}, {topo.devices} devices): all-reduce "
                             "bus bandwidth", "GB/s", topo.bus_gbps, d.link_gbps if d is not None else None,
                             [h.topology.bus_gbps if h.topology is not None else None for h in every]))
    l2 = environment.l2_mb if environment is not None else None  # the device reports its L2 size: recorded by the run
    sheet_l2 = d.l2_mb if d is not None else None
    if sheet_l2 or l2:
        rows.append(_ceiling("L2 cache (size the device reports)", "MB", l2, sheet_l2, []))
    return rows


def _ceiling(what: str, unit: str, measured: object, datasheet: object, every: list[object]) -> dict:
    numbers = isinstance(measured, (int, float)) and isinstance(datasheet, (int, float))
    ratio = text.pct(measured / datasheet) if numbers and datasheet else "–"
    values = [v for v in every if isinstance(v, (int, float)) and v > 0]
    spread = (f"{text.num(min(values))}–{text.num(max(values))} over {len(values)}"
              if len(values) > 1 and max(values) > 1.005 * min(values) else "–")
    return {"what": what, "unit": unit, "measured": text.num(measured), "datasheet": text.num(datasheet),
            "ratio": ratio, "spread": spread}


def _browse() -> dict[str, str]:
    return {"bottleneck": links.BY_BOTTLENECK, "pattern": links.BY_PATTERN, "operator": links.BY_OPERATOR,
            "hardware": links.BY_HARDWARE, "transfers": links.TRANSFERS, "tags": links.TAGS, "claims": links.CLAIMS,
            "atlas": links.ATLAS}
