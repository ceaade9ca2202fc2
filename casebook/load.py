"""Case YAML to a validated `Case`, with every problem reported as `file:line: field: message`.

The YAML is read event by event (SafeLoader's parser only: no constructor ever runs), building plain
dicts, lists and scalars beside a map from each field's path to its line, so that pydantic's error
locations become line numbers. The dialect is deliberately small:

- only `true`/`false` (any case) are booleans; `yes`, `no`, `on`, `off` stay text;
- numbers are YAML 1.2 (`1e-3` is a float, `1:20` is text, no dates);
- no anchors or aliases: a case is written out in full (this also refuses alias bombs before anything
  is expanded), and no tags beyond the standard `!!str`, `!!int`, ... (`!!python/...` is refused);
- at most 1 MiB and 32 levels of nesting, one document, a mapping at the top, no duplicate keys.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import BaseModel, ValidationError

from casebook import case as case_format

MAX_BYTES = 2**20
"""Largest case file read, in bytes (the largest real case is about 12 KB)."""

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists accepted (a case needs about 6)."""

MIGRATIONS: dict[int, Callable[[dict], dict]] = {}
"""`version -> function` taking a case dict written for `version` to `version + 1`, applied in memory.

Empty while the format is at its first version; the mechanism is tested with a patched version.
"""

Loc = tuple  # a field's path: keys (str) and list indices (int)


class CaseError(Exception):
    """One located problem in a case: `file:line: field: message`."""

    def __init__(self, path: str | Path, line: int, field: str, message: str, warning: bool = False):
        super().__init__(path, line, field, message, warning)
        self.path, self.line, self.field, self.message, self.warning = str(path), line, field, message, warning
        self.errors: list[CaseError] = [self]
        """Every problem found in the file, this one first (a file can have several)."""
        self.source: tuple[dict, Lines] | None = None
        """The file's plain data and line map, when it parsed but did not validate (for the other checks)."""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {'warning: ' * self.warning}{self.message}"


class Lines:
    """The line of every field of one case file, to locate errors found after parsing."""

    def __init__(self, path: str | Path, lines: dict[Loc, int]):
        self.path, self.lines = str(path), lines

    def line(self, loc: Loc) -> int:
        """Line of the field at `loc`, or of its nearest enclosing field that is written in the file."""
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return 1

    def error(self, loc: Loc, message: str, warning: bool = False) -> CaseError:
        """A CaseError for the field at `loc`."""
        return CaseError(self.path, self.line(loc), _dotted(loc), message, warning)


def load_case(path: str | Path) -> case_format.Case:
    """Load and validate one case file; raise CaseError (all problems in `.errors`)."""
    return read_case(path)[0]


def read_case(path: str | Path) -> tuple[case_format.Case, Lines]:
    """Load and validate one case file, with the line of every field; raise CaseError."""
    data, lines = read_yaml(path)
    data = _migrate(data, lines)
    errors: list[CaseError] = []
    case = None
    try:
        case = case_format.Case.model_validate(data)
    except ValidationError as e:
        # a default computed from a field that failed (a variant's fn from its name) repeats that error
        errors = [located for err in e.errors() if err["type"] != "default_factory_not_called"
                  for located in _located_all(err, lines)]
    stem = Path(path).stem
    if isinstance(data.get("id"), str) and data["id"] != stem:
        errors.append(lines.error(("id",), f"id {data['id']!r} differs from the file name {Path(path).name!r}; "
                                           f"they must be equal"))
    if errors:
        first = _first(_unique(errors))
        first.source = (data, lines)  # what the file holds, for the checks that need no valid case
        raise first
    assert case is not None
    return case, lines


def read_yaml(path: str | Path) -> tuple[dict, Lines]:
    """Parse a case file into plain data (a mapping at the top) and its line map; raise CaseError."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise CaseError(path, 1, "file", f"is {size:,} bytes; a case is at most {MAX_BYTES:,} (1 MiB)")
        raw = p.read_bytes()
    except OSError as e:
        raise CaseError(path, 1, "file", f"cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise CaseError(path, line, "file", f"is not UTF-8: byte 0x{raw[e.start]:02x} at line {line}") from None
    text = text.removeprefix("\ufeff")
    data, lines = parse(text, path)
    if data is None:
        raise CaseError(path, 1, "file", "is empty: a case is a YAML mapping of fields (schema_version, id, ...)")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({data!r:.40})"
        raise CaseError(path, 1, "file",
                        f"top level is {kind}; a case is a mapping of fields (schema_version, id, ...)")
    return data, Lines(path, lines)


# --- YAML events to plain data ------------------------------------------------------------------

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STD = "tag:yaml.org,2002:"
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$")
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


class _Events:
    """Builds plain data from a safe loader's parser, event by event, with the line of each field."""

    def build(self, path: str | Path) -> tuple[Any, dict[Loc, int]]:
        """The single document as dicts, lists and scalars, and `{field path: line}`; raise CaseError."""
        lines: dict[Loc, int] = {(): 1}
        stack: list[list] = []  # open containers: [container, its loc, pending key (mappings), is a mapping]
        root: Any = None
        documents = 0
        get_event = self.get_event

        def fail(line: int, message: str) -> typing.NoReturn:
            loc: Loc = ()
            if stack:
                container, loc, key, is_map = stack[-1]
                loc += (key,) if is_map and key is not None else ()
            raise CaseError(path, line, _dotted(loc) or "file", message)

        while True:  # one pass, no recursion: depth and aliases are refused as they arrive
            ev = get_event()
            kind = type(ev)
            line = ev.start_mark.line + 1
            if kind is yaml.ScalarEvent:
                if ev.anchor is not None or ev.tag is not None:
                    _check_node(ev, lambda m: fail(line, m))
                if ev.tag is None:
                    value = _plain(ev.value) if ev.implicit[0] else ev.value
                else:
                    try:
                        value = _tagged(ev.value, ev.tag)
                    except ValueError as e:
                        fail(line, str(e))
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                if ev.anchor is not None or ev.tag is not None:
                    _check_node(ev, lambda m: fail(line, m))
                if stack and stack[-1][3] and stack[-1][2] is None:
                    fail(line, "a mapping or list used as a key; keys are names")
                if len(stack) >= MAX_DEPTH:
                    fail(line, f"nested deeper than {MAX_DEPTH} levels")
                value = {} if kind is yaml.MappingStartEvent else []
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                stack.pop()
                continue
            elif kind is yaml.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    fail(line, "several YAML documents (---) in one file; a case file holds exactly one")
                continue
            elif kind is yaml.AliasEvent:
                fail(line, f"alias *{ev.anchor} refused: anchors and aliases are not allowed, write the value out "
                           "(this also stops alias bombs)")
            elif kind is yaml.StreamEndEvent:
                return root, lines
            else:
                continue
            # Attach the value to the open container (or make it the root).
            if not stack:
                root, here = value, ()
            else:
                frame = stack[-1]
                container, loc, key, is_map = frame
                if not is_map:
                    here = loc + (len(container),)
                    lines[here] = line
                    container.append(value)
                elif key is None:  # this scalar is a key
                    if type(value) is not str:
                        fail(line, f"key {value!r} is not a name; keys are text (quote it, or rename it)")
                    if value in container:
                        raise CaseError(path, line, _dotted(loc + (value,)),
                                        f"duplicate key {value!r} (first at line {lines[loc + (value,)]})")
                    lines[loc + (value,)] = line
                    frame[2] = value
                    continue
                else:
                    here = loc + (key,)
                    container[key] = value
                    frame[2] = None
            if kind is not yaml.ScalarEvent:
                stack.append([value, here, None, kind is yaml.MappingStartEvent])


class CaseLoader(_Events, _BaseLoader):  # type: ignore[misc,valid-type]
    """SafeLoader (libyaml's when present), read event by event: plain data and the line of each field."""


class _PureLoader(_Events, yaml.SafeLoader):
    """The pure-Python SafeLoader, read the same way: slower, but clearer syntax-error messages."""


def parse(text: str, path: str | Path) -> tuple[Any, dict[Loc, int]]:
    """Plain data and line map of one YAML document; YAML syntax errors become CaseError."""
    try:
        return _build(CaseLoader, text, path)
    except yaml.YAMLError as fast:
        error = fast
    if _BaseLoader is not yaml.SafeLoader:
        # libyaml is terse, and scans ahead: read again, in order. A CaseError found on the way (as
        # with flow collections nested past MAX_DEPTH, which libyaml 0.2.5 refuses 1000 levels in,
        # before an event reaches the depth check) is the file's first problem, with its field.
        try:
            _build(_PureLoader, text, path)
        except yaml.YAMLError as slow:
            error = slow
    raise _syntax_error(error, text, path)


def _build(loader_class: type, text: str, path: str | Path) -> tuple[Any, dict[Loc, int]]:
    loader = loader_class(text)
    try:
        return loader.build(path)
    finally:
        loader.dispose()


def _syntax_error(e: yaml.YAMLError, text: str, path: str | Path) -> CaseError:
    """A YAML syntax error as a CaseError at the line of its mark."""
    if isinstance(e, yaml.reader.ReaderError):
        line = text[: e.position].count("\n") + 1
        return CaseError(path, line, "yaml", f"character #x{e.character:04x} is not allowed in YAML ({e.reason})")
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = mark.line + 1 if mark else 1
    problem = getattr(e, "problem", None) or str(e)
    message = problem
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cmark and cmark.line + 1 != line:
        message += f" ({context} at line {cmark.line + 1})"
    rows = text.splitlines()
    row = rows[line - 1] if line <= len(rows) else ""
    if "\\t" in problem or "\t" in row[: len(row) - len(row.lstrip())]:
        message += "; tabs cannot indent YAML, use spaces"
    return CaseError(path, line, "yaml", message)


def _check_node(ev: yaml.NodeEvent, fail: Callable[[str], Any]) -> None:
    """Refuse anchors and every tag but the standard plain-data ones; nothing is ever built from a tag."""
    if ev.anchor is not None:
        fail(f"anchor &{ev.anchor} refused: anchors and aliases are not allowed, write the value out")
    tag = ev.tag
    if tag is None or tag == "!":
        return
    name = tag.removeprefix(_STD)
    if name in ("str", "int", "float", "bool", "null", "map", "seq"):
        return
    shown = "!!" + name if tag.startswith(_STD) else tag
    if name.startswith("python/"):
        fail(f"tag {shown} refused: Python tags could run code; a case is plain data and nothing in it is executed")
    fail(f"tag {shown} is not allowed: a case is plain data (text, numbers, true/false, lists, mappings)")


_NOT_TEXT_START = frozenset("-+.0123456789~tTfFnN")
"""First characters of a plain scalar that may be something other than text."""


def _plain(value: str) -> Any:
    """A plain (unquoted, untagged) scalar: null, true/false, an integer, a float, or else text."""
    if not value:
        return None
    if value[0] not in _NOT_TEXT_START:
        return value
    if _NULL.match(value):
        return None
    if _BOOL.match(value):
        return value[0] in "tT"
    if _INT.match(value):
        return _int(value)
    if _FLOAT.match(value):
        return _float(value)
    return value


def _tagged(value: str, tag: str) -> Any:
    """A scalar with an explicit standard tag (`!!str 12`, `!!float 1`), checked against it."""
    name = tag.removeprefix(_STD)
    if name == "str" or tag == "!":
        return value
    if name == "null" and _NULL.match(value):
        return None
    if name == "bool" and _BOOL.match(value):
        return value[0] in "tT"
    if name == "int" and _INT.match(value):
        return _int(value)
    if name == "float" and (_FLOAT.match(value) or _INT.match(value)):
        return _float(value)
    if name in ("map", "seq"):
        raise ValueError(f"tag !!{name} on a single value")
    raise ValueError(f"{value!r} is not a valid !!{name}")


def _int(value: str) -> int:
    digits = value.replace("_", "")
    if digits[:2] in ("0x", "0o"):
        return int(digits[2:], 16 if digits[1] == "x" else 8)
    return int(digits, 10)


def _float(value: str) -> float:
    bare = value.lstrip("+-").lower()
    if bare == ".inf":
        return -math.inf if value.startswith("-") else math.inf
    if bare == ".nan":
        return math.nan
    return float(value.replace("_", ""))


# --- versions -------------------------------------------------------------------------------------


def _migrate(data: dict, lines: Lines) -> dict:
    """Bring an older case up to SCHEMA_VERSION in memory; refuse a newer one."""
    version, current = data.get("schema_version"), case_format.SCHEMA_VERSION
    if not isinstance(version, int) or isinstance(version, bool) or version == current:
        return data  # a missing or mistyped version is reported by the schema
    if version > current:
        raise lines.error(("schema_version",), f"the case is written for schema_version {version}, this casebook "
                                               f"reads up to {current}: upgrade casebook")
    while version < current:
        step = MIGRATIONS.get(version)
        if step is None:
            raise lines.error(("schema_version",), f"no migration from schema_version {version} "
                                                   f"(this casebook reads {current})")
        data = step(dict(data))
        version += 1
        data["schema_version"] = version
    return data


# --- pydantic errors to located messages ------------------------------------------------------------

_PREFIX = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*): (.*)$", re.S)
_KEEP_LAST = {"missing", "union_tag_not_found", "union_tag_invalid"}


def _located_all(err: dict, lines: Lines) -> list[CaseError]:
    """One pydantic error as located problems: a cross-field check reports several, one per line."""
    msg = str(err.get("msg", ""))
    if err.get("type") == "value_error" and "\n" in msg:
        prefix = "Value error, " if msg.startswith("Value error, ") else ""
        parts = msg.removeprefix(prefix).split("\n")
        return [_located({**err, "msg": prefix + part}, lines) for part in parts if part.strip()]
    return [_located(err, lines)]


def _located(err: dict, lines: Lines) -> CaseError:
    """One pydantic error as `file:line: field: message`."""
    loc: tuple = tuple(p for p in err["loc"] if p != "[key]")
    kind = err["type"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        loc += (err["ctx"]["discriminator"].strip("'"),)
    # Keep the parts of the loc written in the file; drop pydantic's union tags (e.g. `speedup`).
    path: tuple = ()
    for i, part in enumerate(loc):
        if path + (part,) in lines.lines or (i == len(loc) - 1 and kind in _KEEP_LAST):
            path += (part,)
    message = _message(err, path)
    m = _PREFIX.match(message)
    if m and kind in ("value_error", "assertion_error"):  # "levels.kernel.shapes.0: ..." names the field
        sub = tuple(int(p) if p.isdigit() else p for p in m.group(1).split("."))
        if path + sub[:1] in lines.lines:
            path, message = path + sub, m.group(2)
    return CaseError(lines.path, lines.line(path), _dotted(path) or "case", message)


def _message(err: dict, path: tuple) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "extra_forbidden":
        key = err["loc"][-1]
        fields = _fields_at(err["loc"][:-1])
        close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
        if close:
            return f"unknown field {key!r}; did you mean {close[0]!r}?"
        return f"unknown field {key!r}; fields here: {', '.join(fields)}" if fields else f"unknown field {key!r}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", ctx.get("expected", ""))
        close = difflib.get_close_matches(str(value), expected, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{value!r} is not one of {ctx.get('expected')}{hint}"
    if kind == "union_tag_invalid":
        tags = re.findall(r"'([^']*)'", ctx.get("expected_tags", ""))
        close = difflib.get_close_matches(str(ctx.get("tag")), tags, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{ctx.get('tag')!r} is not one of {ctx.get('expected_tags')}{hint}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == case_format.IDENT:
        return f"{value!r} is not a name: use lower_snake_case (a-z, 0-9 and _, starting with a letter)"
    message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind.endswith("_type") or kind.endswith("_parsing"):
        message += f", got {_describe(value)}"
    return message


def _describe(value: Any) -> str:
    """How a wrong value reads to the author, with the usual fix."""
    if isinstance(value, str):
        if value.lower() in ("yes", "no", "on", "off", "y", "n"):
            return f"the text {value!r} (only true and false are booleans)"
        if _INT.match(value) or _FLOAT.match(value):
            return f"the text {value!r} (remove the quotes)"
        return f"the text {value!r:.60}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def _fields_at(loc: tuple) -> list[str]:
    """Field names of the model at `loc` in a Case (for "did you mean"), or [] if it is not a model."""
    t: Any = case_format.Case
    for part in loc:
        t = _step(t, part)
        if t is None:
            return []
    t = _unwrap(t)
    return list(t.model_fields) if isinstance(t, type) and issubclass(t, BaseModel) else []


def _step(t: Any, part: Any) -> Any:
    t = _unwrap(t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        field = t.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):  # a discriminated union: the tag names the member
        for member in map(_unwrap, typing.get_args(t)):
            kind = getattr(member, "model_fields", {}).get("kind")
            if kind is not None and part in typing.get_args(kind.annotation):
                return member
        return None
    if origin is list and isinstance(part, int):
        return typing.get_args(t)[0]
    if origin is dict and isinstance(part, str):
        return typing.get_args(t)[1]
    return None


def _unwrap(t: Any) -> Any:
    """Strip `Annotated[...]` and `X | None` down to X."""
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(t) if a is not type(None)]
            if len(members) != 1:
                return t
            t = members[0]
        else:
            return t


def _dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def _unique(errors: list[CaseError]) -> list[CaseError]:
    seen, out = set(), []
    for e in sorted(errors, key=lambda e: e.line):
        if (e.line, e.field) not in seen:
            seen.add((e.line, e.field))
            out.append(e)
    return out


def _first(errors: list[CaseError]) -> CaseError:
    first = errors[0]
    first.errors = errors
    return first
