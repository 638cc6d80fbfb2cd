"""A step of a CUDA C++ chapter as the lines it changes, and its kernel as one listing.

Chapters 5-8 build one source whose ``#if`` switches each step sets (``-D`` options). A
reader evaluates those switches in their head; :func:`step_changes` does it for them:
it keeps the lines a compiler given one step's switches would keep, does the same for
the step before, and shows what differs, as a unified diff, beside the switches that
changed. :func:`steps_markdown` does that for every step of a chapter, and
:func:`listing` shows one step's kernel with every switch resolved: the code the
compiler sees, and nothing the other steps need.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


def defines(options) -> dict[str, int]:
    """{name: value} of the ``-DNAME=VALUE`` options NVRTC is given (others ignored)."""
    out = {}
    for opt in options:
        m = re.fullmatch(r"-D(\w+)(?:=(-?\d+))?", opt)
        if m:
            out[m.group(1)] = int(m.group(2) or 1)
    return out


def _value(expression: str, macros: dict[str, int], unknown: str = "zero") -> bool | None:
    """An ``#if`` expression of integer macros, as the preprocessor reads it: names that
    are not defined count as 0 (with ``unknown="keep"``, the value is None instead: a
    macro the source defines, or the compiler's, such as ``__CUDA_ARCH__``); ``!``,
    ``&&``, ``||``, comparisons and arithmetic."""
    text = expression.split("//")[0].strip()
    names = re.findall(r"defined\s*\(?\s*(\w+)|([A-Za-z_]\w*)", text)
    if unknown == "keep" and any((a or b) not in macros for a, b in names if a or b != "defined"):
        return None
    text = re.sub(r"defined\s*\(?\s*(\w+)\s*\)?",
                  lambda m: "1" if m.group(1) in macros else "0", text)
    text = re.sub(r"[A-Za-z_]\w*", lambda m: str(macros.get(m.group(0), 0)), text)
    text = text.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    return bool(eval(text, {"__builtins__": {}}, {}))  # digits and operators only


def preprocess(source: str, macros: dict[str, int], unknown: str = "zero") -> list[str]:
    """The lines of ``source`` that the preprocessor keeps given ``macros``: conditional
    directives resolved (and dropped), every other line as written. A name not in
    ``macros`` counts as 0; with ``unknown="keep"``, an ``#if`` that names one is left
    as it is, directives and every branch (one whose value is not known here)."""
    kept, stack = [], []  # per #if: (this branch is kept, some branch was taken); None: unknown
    for line in source.splitlines():
        m = _DIRECTIVE.match(line)
        if not m:
            if all(k is not False for k, _ in stack):
                kept.append(line)
            continue
        word, rest = m.groups()
        if word in ("if", "ifdef", "ifndef"):
            outer = stack
            name = rest.split("//")[0].strip()
            if word == "if":
                value = _value(rest, macros, unknown)
            else:
                value = None if unknown == "keep" and name not in macros else \
                    (name in macros) == (word == "ifdef")
            entry = (value, value)
        else:
            _, taken = stack.pop()
            outer = stack
            if word == "elif":
                value = False if taken else _value(rest, macros, unknown)
                if taken is None and value is not False:
                    value = None
                entry = (value, None if None in (taken, value) else taken or value)
            elif word == "else":
                entry = (None, None) if taken is None else (not taken, True)
            else:
                entry = None
        if all(k is not False for k, _ in outer) and (
                taken is None if entry is None else None in entry):
            kept.append(line)  # a directive whose value is not known here
        if entry is not None:
            stack.append(entry)
    if stack:
        raise ValueError("unbalanced #if in the source")
    return kept


def step_changes(source: str, before, after, *, context: int = 1) -> tuple[dict, str]:
    """What one step changes: ({switch: (before, after)} for the ``-D`` switches that
    differ, and a unified diff of the kernel source as the compiler sees it after each
    step's switches). ``before`` and ``after`` are the two steps' NVRTC options."""
    a, b = defines(before), defines(after)
    switches = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    diff = difflib.unified_diff(preprocess(source, a), preprocess(source, b),
                                "before", "after", n=context, lineterm="")
    return switches, "\n".join(list(diff)[2:])  # without the file-name header


#: a macro defined empty, object-like (``#define TURN_END``) or function-like
#: (``#define PHASE(i)``)
_EMPTY_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)(\([^)]*\))?\s*(//.*)?$")
_UNDEF = re.compile(r"^\s*#\s*undef\s+\w+\s*$")
_INVOCATION = re.compile(r"([A-Za-z_]\w*)\s*(\(.*\))?")


def listing(source: str, options) -> str:
    """The source as the compiler sees it with these NVRTC options: every ``#if``
    resolved, and the macros defined empty (a switch's no-op branch) dropped with the
    lines that only invoke them."""
    lines = preprocess(source, defines(options))
    empty = {m.group(1) for line in lines if (m := _EMPTY_DEFINE.match(line))}
    keep = []
    for line in lines:
        bare = line.strip().rstrip(";").strip()
        call = _INVOCATION.fullmatch(bare)
        if _EMPTY_DEFINE.match(line) or _UNDEF.match(line) or (call and call.group(1) in empty):
            continue
        keep.append(line)
    text = "\n".join(keep)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def body(source: str) -> str:
    """``source`` without the comment block it opens with: a chapter's list of its
    switches, which a listing with the switches resolved has no use for."""
    lines = source.splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("//")):
        lines.pop(0)
    return "\n".join(lines)


def fenced(code: str, language: str = "cuda") -> str:
    """Code as a fenced Markdown block (for a chapter's ``display(Markdown(...))``)."""
    return f"```{language}\n{code}\n```"


def config_changes(before, after) -> str:
    """The fields of two configuration dataclasses that differ, as Markdown."""
    return ", ".join(f"`{f.name}` {getattr(before, f.name)} → {getattr(after, f.name)}"
                     for f in dataclasses.fields(before)
                     if getattr(before, f.name) != getattr(after, f.name))


def steps_markdown(source: str, configs: dict, builds_on: dict, options, *,
                   describe=config_changes) -> str:
    """Every step of a chapter as the settings and the lines it changes: for each
    ``name: base`` of ``builds_on``, the configurations' differences (``describe``) and
    the diff of ``source`` from ``options(configs[base])`` to ``options(configs[name])``."""
    parts = []
    for name, base in builds_on.items():
        _, diff = step_changes(source, options(configs[base]), options(configs[name]))
        head = f"**`{name}`**, on `{base}`: {describe(configs[base], configs[name])}"
        parts.append(head + (f"\n\n{fenced(diff, 'diff')}" if diff else
                             " (the kernel's source is the same)"))
    return "\n\n".join(parts)
