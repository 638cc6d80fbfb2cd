"""Recorded GPU results: where they live, what they say, whether they are fresh.

``results/<gpu>.json`` holds one run of ``python -m kernels.record`` on a GPU:
its provenance (GPU, driver, library versions, date, git commit), the chip's
measured ceilings, and one record per kernel and shape. Each kernel record
carries a hash of what the kernel computes (its code without comments or docstrings,
its CUDA C++ as the compiler sees it for the kernel's own switches: :func:`source_hash`),
and each recorded measurement one of what its module declares (:func:`measured_hash`);
:func:`stale` and :func:`stale_measured` list those that have changed since, and a test
fails while any has.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import inspect
import io
import itertools
import json
import linecache
import re
import statistics
import sys
import tokenize
from pathlib import Path

import numpy as np

from .gpus import short_gpu_name
from .markdown import show, table
from .mode import device_name

ROOT = Path(__file__).resolve().parent.parent
#: the repository's results/, or, installed without the repository, the copy that
#: travels in the package (kernels/recorded, see pyproject.toml)
RESULTS_DIR = (ROOT / "results" if (ROOT / "pyproject.toml").is_file()
               else Path(__file__).parent / "recorded")
#: the GPU whose recorded run the chapters show where no GPU is at hand, and their text
#: follows; chapter 10 sets every recorded GPU's run beside it
BOOK_GPU = "NVIDIA H200"


def _py_func(obj):
    """The Python function behind a Numba kernel (GPU or simulator) or a function."""
    fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None) or obj
    if callable(fn):
        fn = inspect.unwrap(fn)  # a cached kernel factory
    return fn if inspect.isfunction(fn) else None


def _in_chapter_module(f) -> bool:
    from . import CHAPTERS, chapter_module_name

    return f.__module__ in {chapter_module_name(n) for n in CHAPTERS}


def _char_column(line: str, byte_offset: int) -> int:
    """The character column of an AST node's column (which counts UTF-8 bytes)."""
    return len(line.encode()[:byte_offset].decode(errors="ignore"))


_CODE: dict = {}  # file name -> (its text, its code lines, {first line: last} of its defs)


def _code_lines(filename: str) -> tuple[tuple, dict]:
    """A Python file's lines as its code: comments and docstrings (every statement that is
    a string alone) blanked, trailing whitespace stripped, each line that is left empty
    None; and where each function and class of the file starts (its first decorator) and
    ends, {first line: last line}, 1-based. Text, not tokens or ``ast.dump``: the same
    under every Python version."""
    linecache.checkcache(filename)
    lines = linecache.getlines(filename)
    text = "".join(lines)
    if _CODE.get(filename, ("",))[0] == text:
        return _CODE[filename][1:]
    cut = [[] for _ in lines]  # per line: (start, end) character spans to blank
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0] - 1].append((tok.start[1], None))
    defs = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[min([node.lineno] + [d.lineno for d in node.decorator_list])] = node.end_lineno
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            first, last = node.lineno - 1, node.end_lineno - 1
            start = _char_column(lines[first], node.col_offset)
            end = _char_column(lines[last], node.end_col_offset)
            if first == last:
                cut[first].append((start, end))
            else:
                cut[first].append((start, None))
                cut[last].append((0, end))
                for i in range(first + 1, last):
                    cut[i].append((0, None))
    out = []
    for line, spans in zip(lines, cut):
        for start, end in sorted(spans, reverse=True):
            line = line[:start] + ("" if end is None else line[end:])
        line = line.rstrip()
        out.append(line if line.strip() else None)
    _CODE[filename] = (text, tuple(out), defs)
    return tuple(out), defs


def code_text(obj) -> str:
    """The code of a function or class without its comments, docstrings, blank lines and
    trailing whitespace (indentation kept): what it does, not what it says."""
    code, defs = _code_lines(inspect.getsourcefile(obj))
    first = obj.__code__.co_firstlineno if inspect.isfunction(obj) else None
    if first in defs:
        last = defs[first]
    else:  # a class, or a lambda
        lines, first = inspect.getsourcelines(obj)
        first, last = max(first, 1), max(first, 1) + len(lines) - 1
    return "\n".join(x for x in code[first - 1:last] if x is not None)


#: a C++ comment, or a string or character literal (which may hold "//" or "/*")
_C_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
#: what makes a string setting CUDA C++ (or PTX in it), whose comments are no code
_CUDA_TEXT = re.compile(r"__global__|__device__|\basm\b|^\s*#\s*(if|define|include|pragma)\b",
                        re.M)


def _without_c_comments(source: str) -> str:
    return _C_TOKEN.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else
                        " " + "\n" * m.group(0).count("\n"), source)


@functools.lru_cache(maxsize=256)
def _directive_names(source: str) -> frozenset:
    """The names a source's ``#if``, ``#ifdef`` and ``#elif`` lines read."""
    return frozenset(re.findall(r"[A-Za-z_]\w*", "\n".join(
        re.findall(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)$", source, re.M))))


def cuda_text(source: str, macros: tuple = ()) -> str:
    """CUDA C++ as the compiler sees it: comments gone, each line's whitespace folded,
    blank lines dropped, and, given ``macros`` ((name, value) pairs: one compile's ``-D``
    switches), each ``#if`` whose condition names only those resolved
    (:func:`kernels.source_steps.preprocess`; the others, such as ``__CUDA_ARCH__``'s,
    kept whole)."""
    read = _directive_names(source)
    return _cuda_text(source, tuple((k, v) for k, v in macros if k in read))


@functools.lru_cache(maxsize=4096)
def _cuda_text(source: str, macros: tuple) -> str:
    from .source_steps import preprocess

    text = _without_c_comments(source)
    if macros:
        try:
            text = "\n".join(preprocess(text, dict(macros), unknown="keep"))
        except ValueError:  # an #if this piece opens and another closes: kept whole
            pass
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def _kernel_compiles(fn) -> tuple[str, list[tuple]]:
    """(name, its compiles' ``-D`` switches) of a step of a CUDA C++ chapter that
    builds its steps from one source (a ``kernels.api.kernel_function`` whose chapter
    has ``nvrtc_options(config, D, dtype, ...)`` and the step in ``CONFIGS`` or
    ``STEPS``): every head dim it takes, every dtype, each flag of ``nvrtc_options``
    (``negative_scale``, ``phases``) off and on. ("", []) for other kernels."""
    from .source_steps import defines

    launch, name = getattr(fn, "launch", None), getattr(fn, "__name__", "")
    module = sys.modules.get(getattr(_py_func(launch), "__module__", ""), None)
    configs = getattr(module, "CONFIGS", None) or getattr(module, "STEPS", None) or {}
    options = getattr(module, "nvrtc_options", None)
    if name not in configs or options is None:
        return "", []
    dims = module.head_dims(name) if hasattr(module, "head_dims") else module.HEAD_DIMS
    flags = [p.name for p in inspect.signature(options).parameters.values()
             if p.default is False]
    compiles = []
    for D in dims:
        for dtype in module.DTYPES:
            for on in itertools.product((False, True), repeat=len(flags)):
                switches = tuple(sorted(defines(options(configs[name], D, dtype,
                                                        **dict(zip(flags, on)))).items()))
                if switches not in compiles:
                    compiles.append(switches)
    return name, compiles


def setting_text(obj, classes: set, compiles=(), functions: list | None = None) -> str | None:
    """The text of a module-level value a kernel's code reads, where it is a setting:
    plain data (None, numbers, strings, numpy dtypes, and tuples, lists, sets, dicts and
    dataclass instances of them), written the same in every process (sets sorted); None
    for anything else (functions, modules, classes, live objects). A CUDA C++ string is
    written as :func:`cuda_text` makes it, once for each of ``compiles`` (a kernel's
    ``-D`` switches) that gives another listing. The classes of the dataclass instances
    go into ``classes``: their code (defaults, methods such as a configuration's ``at``)
    decides what an instance means. Given a list ``functions``, a function in the value
    (a table of what a measurement runs) is written as its name and goes into it."""
    if functions is not None and _py_func(obj) is not None:
        functions.append(obj)
        return f"{_py_func(obj).__module__}.{_py_func(obj).__qualname__}"
    if isinstance(obj, str) and "\n" in obj and _CUDA_TEXT.search(obj):
        listings = list(dict.fromkeys(cuda_text(obj, m) for m in compiles or [()]))
        return "\n----\n".join(listings)
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, np.dtype)):
        return repr(obj)
    if isinstance(obj, (tuple, list, set, frozenset)):
        items = [setting_text(x, classes, compiles, functions) for x in obj]
        if None in items:
            return None
        if isinstance(obj, (set, frozenset)):
            return "{" + ", ".join(sorted(items)) + "}"
        if isinstance(obj, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(obj, dict):
        items = [(setting_text(k, classes, compiles, functions),
                  setting_text(v, classes, compiles, functions)) for k, v in obj.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = [(f.name, setting_text(getattr(obj, f.name), classes, compiles, functions))
                  for f in dataclasses.fields(obj)]
        if any(v is None for _, v in fields):
            return None
        classes.add(type(obj))
        return f"{type(obj).__qualname__}(" + ", ".join(f"{n}={v}" for n, v in fields) + ")"
    return None


def _code_names(code) -> list[str]:
    """The global and attribute names a code object and the functions inside it read."""
    names = list(code.co_names) + list(code.co_freevars)
    for const in code.co_consts:
        if inspect.iscode(const):
            names += _code_names(const)
    return names


def code_parts(roots, follow: set, kernel: str = "", compiles=(), hashed=(),
               roots_settings: bool = True, tables: bool = False,
               kernel_hashes: dict | None = None) -> list[str]:
    """The texts a hash covers, from ``roots`` (functions, kernels, classes, settings)
    down the call graph: each function's :func:`code_text`, and that of each function
    or kernel factory of the modules named in ``follow`` it calls (by name, or as an
    attribute of such a module: ``launch.attention``) or closes over, followed
    recursively; the settings those functions read (:func:`setting_text`, the CUDA C++
    ones resolved for ``compiles``; of a table keyed by kernel names, ``kernel``'s entry
    alone) and those their module lists in ``HASHED_SETTINGS`` (read at import, say, by
    no function); the code of the dataclasses of those settings. A root that is one of
    ``hashed`` (the chapters' kernels) stands as its :func:`source_hash`; with
    ``roots_settings``, a root function's settings count as a followed function's do;
    with ``tables``, the functions in a setting (a table of what a measurement runs) are
    followed as if called. Private module state (a leading underscore: caches) is left
    out."""
    from . import all_kernels

    seen, parts, classes, todo = set(), [], set(), []
    followed = [m for m in map(sys.modules.get, sorted(follow)) if m is not None]

    def setting(label: str, obj) -> None:
        if (label, id(obj)) in seen:
            return
        seen.add((label, id(obj)))
        if kernel and isinstance(obj, dict) and kernel in obj:  # a kernel reads its own entry
            obj = {kernel: obj[kernel]}
        functions = [] if tables else None
        text = setting_text(obj, classes, compiles, functions)
        if text is not None:
            parts.append(f"{label} = {text}")
            todo.extend((g, False) for g in functions or () if _py_func(g).__module__ in follow)

    kernel_names = {id(fn): name for _, name, fn in all_kernels()} if hashed else {}
    memo = {} if kernel_hashes is None else kernel_hashes
    for root in roots:
        if id(root) in kernel_names and root in hashed:
            if id(root) not in memo:
                memo[id(root)] = source_hash(root)
            parts.append(f"kernel {kernel_names[id(root)]}: {memo[id(root)]}")
        elif inspect.isclass(root):
            classes.add(root)
            todo += [(m, roots_settings) for m in vars(root).values()  # not dataclass-made
                     if inspect.isfunction(m)
                     and m.__code__.co_filename == inspect.getsourcefile(root)]
        elif _py_func(root) is not None:
            todo.append((root, roots_settings))
        else:
            functions = []
            text = setting_text(root, classes, functions=functions)
            if text is None:
                raise TypeError(f"cannot hash {root!r}: not a function, kernel, class or setting")
            parts.append(text)
            todo.extend((g, roots_settings) for g in functions)
    while todo:
        obj, root = todo.pop()
        f = _py_func(obj)
        if f is None or f in seen:
            continue
        seen.add(f)
        parts.append(code_text(f))
        own = root or f.__module__ in follow
        names = _code_names(f.__code__)
        closure = inspect.getclosurevars(f).nonlocals.items()
        attributes = [(name, getattr(m, name)) for m in followed
                      if m.__name__.rsplit(".", 1)[-1] in names
                      for name in names if hasattr(m, name)]
        named = [(name, f.__globals__[name]) for name in names if name in f.__globals__]
        for name, value in [(f"{f.__qualname__}.{n}", v) for n, v in closure] + named + attributes:
            g = _py_func(value)
            if g is not None:
                if g.__module__ in follow:
                    todo.append((value, False))
            elif inspect.isclass(value):
                if value.__module__ in follow:
                    classes.add(value)
            elif own and not name.startswith("_"):  # private state: caches
                setting(name, value)
        for name in f.__globals__.get("HASHED_SETTINGS", ()) if own else ():
            setting(name, f.__globals__[name])
    parts += [code_text(c) for c in classes if c.__module__ in follow or c in roots]
    return parts


def _hash(parts) -> str:
    return hashlib.sha256("\n".join(sorted(set(parts))).encode()).hexdigest()[:16]


def source_hash(fn) -> str:
    """sha256 of what a kernel computes (:func:`code_parts` from it, following the
    chapter modules): its code and that of every chapter function it calls, without
    comments or docstrings, the settings they read, with the CUDA C++ sources as the
    compiler sees them for this kernel's own switches (:func:`_kernel_compiles`: an
    edit inside another step's ``#if`` leaves it alone), and those switches. The harness
    the kernel calls is left out: it changes no result."""
    from . import CHAPTERS, all_kernels, chapter_module_name

    name, compiles = _kernel_compiles(fn)
    name = name or next((n for _, n, f in all_kernels() if f is fn), "")
    parts = code_parts([fn], {chapter_module_name(n) for n in CHAPTERS}, name, compiles,
                       roots_settings=False)  # the kernel API's wrapper: its name, its doc
    parts += ["compiled with " + " ".join(f"-D{k}={v}" for k, v in c) for c in compiles]
    return _hash(parts)


def measured_objects(module) -> tuple:
    """What a measuring module's recorded measurements depend on, as it declares them
    (its ``MEASURES``: functions, the kernels they measure, settings), else its
    ``gpu_measurements`` alone: every recorded measurement is guarded."""
    return tuple(getattr(module, "MEASURES", None) or (module.gpu_measurements,))


def measurement_follows() -> set:
    """The modules whose functions a measurement's hash follows from what it declares:
    the chapters', the lean call's (kernels.launch) and the measuring modules'."""
    from . import CHAPTERS, MEASURED_BY, chapter_module_name

    return ({chapter_module_name(n) for n in CHAPTERS} | {"kernels.launch"}
            | {path for paths in MEASURED_BY.values() for path in paths.values()})


def measured_parts(module, kernel_hashes: dict | None = None) -> list[str]:
    """The texts a measuring module's hash covers (:func:`code_parts` from its
    :func:`measured_objects`, the chapters' kernels among them by their
    :func:`source_hash`, read from ``kernel_hashes`` ({id: hash}) where it has them)."""
    from . import all_kernels

    roots = measured_objects(module)
    kernels = tuple(fn for _, _, fn in all_kernels() if any(fn is r for r in roots))
    return code_parts(roots, measurement_follows() | {getattr(module, "__name__", "")},
                      hashed=kernels,
                      tables=True, kernel_hashes=kernel_hashes)


def measured_hash(module, kernel_hashes: dict | None = None) -> str:
    """The hash that guards a measuring module's recorded measurements."""
    return _hash(measured_parts(module, kernel_hashes))


def stale_measured(results: dict, *, missing: bool = True) -> dict[str, str]:
    """{name: why} of the chapters' recorded measurements whose code (what the measuring
    module declares, :func:`measured_hash`) changed after they were recorded; with
    ``missing``, also of those not recorded at all (a page that says "not recorded"
    where they are missing passes False). ``name`` is what ``kernels.record --only``
    takes."""
    from . import measuring_modules

    out, kernel_hashes = {}, {}  # the kernels several measure, hashed once
    for name, module in measuring_modules().items():
        recorded = results.get("measurements", {}).get(name)
        if recorded is None:
            if missing:
                out[name] = f"{name}: measurements not recorded"
            continue
        now = measured_hash(module, kernel_hashes)
        if recorded.get("source_hash") != now:
            out[name] = (f"{name}'s measurements: recorded {recorded.get('source_hash')}, "
                         f"code now {now}")
    return out


def stale_measurements(results: dict, *, missing: bool = True) -> list[str]:
    """Why each stale measurement is stale (:func:`stale_measured`), one line each."""
    return list(stale_measured(results, missing=missing).values())


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def results_files() -> list[Path]:
    return sorted(RESULTS_DIR.glob("*.json"))


def recorded_elsewhere(data: dict, gpu: str | None) -> str | None:
    """The GPU a results file was recorded on, where that is not ``gpu`` (else None):
    one GPU's records never go into another's file."""
    theirs = data["provenance"]["gpu"]
    return theirs if gpu_slug(theirs) != gpu_slug(gpu or "") else None


def recorded_on(gpu: str | None) -> list[tuple[Path, dict]]:
    """(path, results) of every results file whose run names ``gpu``."""
    runs = [(p, json.loads(p.read_text())) for p in results_files()]
    return [(p, r) for p, r in runs if gpu and not recorded_elsewhere(r, gpu)]


def load(path: Path | None = None, gpu: str | None = None) -> dict | None:
    """One results file; by default the one recorded on ``gpu`` (the GPU at hand, where
    there is one, else :data:`BOOK_GPU`) if there is such a file, else the most recently
    recorded one (None if none). Every chapter prints the provenance of what it shows."""
    if path is None:
        runs = [json.loads(p.read_text()) for p in results_files()]
        if not runs:
            return None
        gpu = gpu or device_name() or BOOK_GPU
        mine = [r for r in runs if not recorded_elsewhere(r, gpu)]
        return max(mine or runs, key=lambda r: r["provenance"]["date"])
    return json.loads(Path(path).read_text())


def save(results: dict, path: str | Path | None = None) -> Path:
    """Write a results file; by default ``results/<gpu>.json``."""
    if path is None:
        RESULTS_DIR.mkdir(exist_ok=True)
        path = RESULTS_DIR / f"{gpu_slug(results['provenance']['gpu'])}.json"
    path = Path(path)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return path


def stale_records(results: dict) -> list[tuple[int | None, str, str]]:
    """(chapter, kernel, why) of each kernel record whose kernel's source no longer matches
    the recorded hash, and of each record in a dtype other than fp16 with SDPA's times
    beside it from fp16. ``chapter`` is the kernel's now (the record's where it has gone):
    the chapter whose timings a recording must make again."""
    from . import all_kernels

    chapter_of = {name: chapter for chapter, name, _ in all_kernels()}
    current = {name: source_hash(fn) for _, name, fn in all_kernels()}
    out = []
    for rec in results["records"]:
        if rec["kernel"].startswith("sdpa_"):
            continue
        now = current.get(rec["kernel"])
        dtype = rec.get("dtype", "float16")
        if now is None:
            why = f"{rec['kernel']}: no such kernel any more"
        elif now != rec.get("source_hash"):
            why = f"{rec['kernel']}: recorded {rec.get('source_hash')}, source now {now}"
        elif rec.get("sdpa_default_ms") and rec.get("sdpa_dtype", "float16") != dtype:
            why = (f"{rec['kernel']} in {dtype}: SDPA beside it timed in "
                   f"{rec.get('sdpa_dtype', 'float16')}")
        else:
            continue
        out.append((chapter_of.get(rec["kernel"], rec.get("chapter")), rec["kernel"], why))
    return out


def stale(results: dict) -> list[str]:
    """Why kernel records are stale (:func:`stale_records`), each reason once, sorted."""
    return sorted({why for _, _, why in stale_records(results)})


def chapter_run(results: dict, chapter: int | None = None) -> dict:
    """The run that recorded ``chapter`` (its provenance, tests, ceilings): the last
    merged run that holds it (a shape set, or some of its kernels, recorded alone aside:
    each of their records names its own run, ``merged_run``), else the file's own run."""
    run = results
    for merged in results.get("merged_runs", []):
        # not a shape set, nor some of the chapter's kernels, recorded alone
        if chapter in merged["chapters"] and not merged.get("shape_set") \
                and not merged.get("kernels"):
            run = merged
    return run


def provenance_line(results: dict, chapter: int | None = None) -> str:
    """One sentence naming what produced a results file (or, with ``chapter``,
    the run that recorded that chapter, when it was merged in later, and how that run
    timed the chapter's kernels: :func:`timing_sentence`)."""
    line = provenance_sentence(chapter_run(results, chapter)["provenance"])
    timing = timing_sentence(results, chapter) if chapter is not None else ""
    return f"{line} {timing}" if timing else line


def timing_sentence(results: dict, chapter: int) -> str:
    """How the recording timed ``chapter``'s kernels: each shape's kernels in turns with
    SDPA's backends (records ``timed`` "in turns": :func:`kernels.bench.run_suite`; "on
    its own" where a call failed in turns), or, in records made before it timed that way
    (no ``timed``), each kernel over all its shapes on its own, SDPA's backends before
    them, so that records at one shape were timed minutes apart. Empty where the chapter
    has no timed records."""
    timed = [r for r in results.get("records", [])
             if r.get("chapter") == chapter and r.get("status") == "ok"]
    if not timed:
        return ""
    if any("timed" not in r for r in timed):
        return ("Each kernel was timed over its shapes on its own, after SDPA's backends: "
                "timings at one shape were made minutes apart.")
    alone = {(r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"], r.get("dtype"))
             for r in timed if r["timed"] != "in turns"}
    return "Each shape's kernels were timed in turns with SDPA's backends" + (
        f", but at {len(alone)} shape{'s' * (len(alone) > 1)} and dtype, where a call failed "
        "in turns, each on its own." if alone else ".")


def provenance_sentence(p: dict) -> str:
    """One sentence naming the GPU, driver, libraries and commit of a run's (or a
    measurement's) ``provenance``."""
    return (f"Recorded on an {p['gpu']} (compute capability {p['compute_capability']}, "
            f"driver {p['driver']}, CUDA runtime {p['cuda_runtime']}) on {p['date'][:10]} "
            f"with torch {p['torch']}, cuDNN {p['cudnn']}, numba {p['numba']}, "
            f"numba-cuda {p['numba_cuda']}, CuPy {p['cupy']}; commit {p['git_commit'][:10]}.")


def sdpa_tflops(record: dict, backend: str) -> float | None:
    """TFLOPS of SDPA's ``backend`` ("flash" or "default") on a kernel record's shape,
    from the time measured beside that kernel in its run (None if none was)."""
    ms = record.get(f"sdpa_{backend}_ms")
    return record["flops"] / ms / 1e9 if ms else None


def smooth(losses, window) -> np.ndarray:
    """The moving average of ``losses`` over ``window`` steps: ``len(losses) - window +
    1`` values, the i-th the mean of steps i to i + window - 1."""
    losses = np.asarray(losses, dtype=np.float64)
    if not 1 <= window <= len(losses):
        raise ValueError(f"smooth: window {window} for {len(losses)} steps")
    return np.convolve(losses, np.ones(window) / window, mode="valid")


def show_table(records, columns=None, headers=None) -> None:
    """Show records as a table (:func:`table`); by default every column any record
    has, in the order first seen."""
    records = list(records)
    if not records:
        print("(nothing to show)")
        return
    show(table(records, columns or list(dict.fromkeys(c for r in records for c in r)), headers))


def faster_or_slower(time: float, than: float, within: float = 0.02, *,
                     compared_with: str | None = None) -> str:
    """How a time compares with another, in words: "1.25x faster", "1.10x slower", or
    "as fast" where they are ``within`` that fraction of each other; with
    ``compared_with``, the comparison's other side too: "1.25x faster than SDPA",
    "as fast as SDPA"."""
    if abs(time - than) <= within * than:
        return "as fast" + (f" as {compared_with}" if compared_with else "")
    words = f"{than / time:.2f}x faster" if time < than else f"{time / than:.2f}x slower"
    return words + (f" than {compared_with}" if compared_with else "")


def value_range(values, spec: str = ".3f", unit: str = "x") -> str:
    """The smallest and largest of ``values`` as "0.952-0.983x", or the one value,
    "0.979x", where they are equal once formatted (a live run's single shape)."""
    low, high = format(min(values), spec), format(max(values), spec)
    return (low if low == high else f"{low}-{high}") + unit


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` things in words: "1 shape", "4 shapes" (``many``: the plural, where it is
    not ``one`` + "s")."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def side_by_side(runs: dict, key, values) -> list[dict]:
    """Rows of several runs side by side: ``runs`` is {label: rows}; rows with equal
    ``key`` columns (a name or a list of names) become one row, in the order first
    seen, holding each of ``values`` once per run as ``"<value> on <label>"`` (empty
    where a run lacks the row)."""
    keys = [key] if isinstance(key, str) else list(key)
    merged: dict = {}
    for label, rows in runs.items():
        for row in rows:
            out = merged.setdefault(tuple(row[k] for k in keys), {k: row[k] for k in keys})
            for value in values:
                out[f"{value} on {label}"] = row.get(value)
    columns = keys + [f"{value} on {label}" for value in values for label in runs]
    return [{c: row.get(c) for c in columns} for row in merged.values()]


def recorded_label(results: dict, chapter: int | None = None) -> str:
    """The GPU of the run that recorded ``chapter``, short, to head its column beside
    a live one: "H200 (recorded)" (:func:`kernels.gpus.live_label` heads the other)."""
    return f"{short_gpu_name(chapter_run(results, chapter)['provenance']['gpu'])} (recorded)"


#: why warps did not issue, as Nsight Compute names the reasons
STALL_REASONS = {"long_scoreboard": "waiting for a global load",
                 "short_scoreboard": "waiting for shared memory or a special function",
                 "barrier": "waiting at a barrier",
                 "not_selected": "ready, another warp issued",
                 "wait": "fixed-latency dependency", "math_pipe_throttle": "its execution pipe busy",
                 "mio_throttle": "shared-memory queue full"}


def stall_counters(reasons) -> dict:
    """{metric: label} for Nsight Compute's average stall cycles per issued
    instruction, for each of ``reasons`` (keys of STALL_REASONS, or "gmma")."""
    labels = dict(STALL_REASONS, gmma="waiting for a wgmma to finish")
    return {f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": f"{r} ({labels[r]})"
            for r in reasons}


def largest_launch(counted: dict) -> dict:
    """The launch of a profiled kernel (``ncu_counts``' answer for one kernel) that
    executed the most instructions: the attention kernel, where a call launches more."""
    return max(counted["launches"], key=lambda x: x.get("smsp__inst_executed.sum") or 0)


def counter_rows(runs, labels: dict) -> list[dict]:
    """Nsight Compute's counts (``record.ncu_counts`` answers, one a shape) as table
    rows: one a shape and kernel, one column a counter of ``labels`` ({metric: label}).
    A kernel of several launches is read at its largest launch (most instructions)."""
    from .bench import Shape

    rows = []
    for run in runs:
        shape = Shape(**run["shape"]).label() if "shape" in run else ""
        for name, k in run.get("kernels", {}).items():
            if k.get("status") != "ok" or not k["launches"]:
                rows.append({"shape": shape, "kernel": name, "status": k.get("status")})
                continue
            launch = largest_launch(k)
            row = {"shape": shape, "kernel": name}
            for metric, label in labels.items():
                v = launch.get(metric)
                if v is not None:  # a counter this launch lacks is left blank
                    row[label] = (f"{v:,.0f}" if metric.endswith(".sum") else
                                  f"{v:.2f}" if metric.endswith(".ratio") else f"{v:.0f}")
            rows.append(row)
    return rows


def records_at(records, shape, dtype: str = "float16"):
    """The records, of every kernel, on ``shape`` (a :class:`kernels.bench.Shape`) in
    ``dtype``."""
    key = (shape.B, shape.H, shape.S_q, shape.S_k, shape.D, shape.causal)
    return (r for r in records if r.get("dtype", "float16") == dtype
            and (r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"]) == key)


def find(records, kernel: str, shape, dtype: str = "float16") -> dict | None:
    """The record of ``kernel`` on ``shape`` in ``dtype``, if any."""
    return next((r for r in records_at(records, shape, dtype) if r["kernel"] == kernel), None)


def timed(records, kernel: str, shape, dtype: str = "float16") -> dict | None:
    """``kernel``'s timed record on ``shape`` in ``dtype``, else in fp16 (a kernel
    recorded in fp16 only is read there), else None."""
    for d in dict.fromkeys((dtype, "float16")):
        record = find(records, kernel, shape, d)
        if record and record["status"] == "ok":
            return record
    return None


def speedup(records, slow: str, fast: str, shape) -> float | None:
    """How many times faster ``fast`` ran than ``slow`` on ``shape`` (None unless
    both were timed there)."""
    a, b = find(records, slow, shape), find(records, fast, shape)
    if a and b and a["status"] == b["status"] == "ok":
        return a["median_ms"] / b["median_ms"]
    return None


def timing_table(records, shapes, kernels, sdpa=("sdpa_default", "sdpa_flash")) -> str:
    """Markdown table of the kernels' and SDPA's records on the given shapes."""
    rows = [r for s in shapes for name in list(kernels) + list(sdpa)
            if (r := find(records, name, s)) is not None]

    def shape(r):
        s = f"{r['S_q']}" if r["S_q"] == r["S_k"] else f"{r['S_q']}/{r['S_k']}"
        return f"{r['B']}x{r['H']}x{s}x{r['D']}" + (" causal" if r["causal"] else "")

    cols = ["kernel", shape, "status", "median_ms", "tflops",
            lambda r: (f"{r['median_ms'] / r['sdpa_default_ms']:.1f}x"
                       if r.get("sdpa_default_ms") and r.get("median_ms") else ""),
            lambda r: f"{r['rel_err']:.1e}" if "rel_err" in r else ""]
    heads = ["kernel", "B x H x S x D", "status", "median ms", "TFLOPS",
             "time / SDPA default", "rel err"]
    return table(rows, cols, heads)


def suite_kernels(records) -> dict[int, str]:
    """{chapter: its kernel} (``kernels.main_kernels()``) for every chapter whose kernel
    was timed on the standard suite: the kernels the book compares over it, the last of
    them the book's final kernel."""
    from . import main_kernels
    from .bench import STANDARD_SUITE

    return {chapter: kernel for chapter, kernel in main_kernels().items()
            if any(find(records, kernel, s) for s in STANDARD_SUITE)}


def provenance_lines(results: dict, chapters) -> list[str]:
    """One line for each run that recorded some of ``chapters``: which chapters it
    recorded (of those), and what recorded it (:func:`provenance_line`)."""
    runs: dict[int, tuple[dict, list]] = {}
    for chapter in chapters:
        run = chapter_run(results, chapter)
        runs.setdefault(id(run), (run, []))[1].append(chapter)
    lines = []
    for _, recorded in runs.values():
        names = ", ".join(str(c) for c in recorded)
        lines.append(f"Chapter{'s' if len(recorded) > 1 else ''} {names}: "
                     + provenance_line(results, recorded[-1]))
    return lines


def sdpa_default_backend(results: dict) -> str | None:
    """The library behind SDPA's default choice in a recorded run, read from the name of
    the kernel Nsight Compute saw it launch (a chapter's counters beside "sdpa_default"):
    "cuDNN", "FlashAttention-2" or "memory-efficient"; None where no counter names it."""
    for measured in results.get("measurements", {}).values():
        for run in measured.get("counters", []) if isinstance(measured, dict) else []:
            for launch in run.get("kernels", {}).get("sdpa_default", {}).get("launches", []):
                name = launch.get("kernel", "").lower()
                if "cudnn" in name:  # before "flash": cuDNN's kernel names say flash too
                    return "cuDNN"
                if "flash" in name:
                    return "FlashAttention-2"
                if "efficient" in name or "fmha" in name:
                    return "memory-efficient"
    return None


def peer_labels(results: dict) -> dict[str, str]:
    """{name in the records: what a table calls it} for the kernels the book measures
    itself against: SDPA's default backend (named by its library where the run's
    counters say it), SDPA's FlashAttention-2 backend, and Triton's tutorial kernel."""
    backend = sdpa_default_backend(results)
    return {"sdpa_default": "SDPA default" + (f" ({backend})" if backend else ""),
            "sdpa_flash": "SDPA FlashAttention-2", "triton_attention": "Triton"}


def peer_ms(records, kernel: str, peer: str, shape) -> float | None:
    """The time of ``peer`` on ``shape`` to set beside ``kernel``'s: SDPA's backends
    ("sdpa_default", "sdpa_flash") as timed beside ``kernel`` in its own run; another
    kernel from its own record, which may come from another run. None where either was
    not timed there."""
    mine = find(records, kernel, shape)
    if not (mine and mine["status"] == "ok"):
        return None
    if peer.startswith("sdpa_"):
        return mine.get(f"{peer}_ms")
    other = find(records, peer, shape)
    return other["median_ms"] if other and other["status"] == "ok" else None


def versus(records, kernel: str, peer: str, shape) -> float | None:
    """How many times faster ``kernel`` ran than ``peer`` on ``shape`` (below 1: slower):
    the peer's time over the kernel's (:func:`peer_ms`)."""
    theirs = peer_ms(records, kernel, peer, shape)
    return theirs / find(records, kernel, shape)["median_ms"] if theirs else None


def versus_rows(records, kernel: str, shapes, peers, labels: dict | None = None) -> list[dict]:
    """Table rows: one a shape where ``kernel`` was timed, with its TFLOPS, and each of
    ``peers``' TFLOPS and the kernel's speed relative to it (:func:`versus`: "1.10x" is
    10% faster than the peer)."""
    labels = labels or {}
    rows = []
    for shape in shapes:
        mine = find(records, kernel, shape)
        if not (mine and mine["status"] == "ok"):
            continue
        row = {"shape": shape.label(), f"{kernel} TFLOPS": f"{mine['tflops']:.0f}"}
        for peer in peers:
            label = labels.get(peer, peer)
            ms, ratio = peer_ms(records, kernel, peer, shape), versus(records, kernel, peer, shape)
            row[f"{label} TFLOPS"] = f"{shape.flops / ms / 1e9:.0f}" if ms else ""
            row[f"speed vs {label}"] = f"{ratio:.2f}x" if ratio else ""
        rows.append(row)
    return rows


def standing(records, kernel: str, peer: str, shapes) -> dict:
    """Where ``kernel`` stands against ``peer`` over ``shapes``: {"ratios": {shape:
    speed relative to the peer}, "faster": shapes where it ran faster, "slower": where
    slower, "best" and "worst": (shape, ratio)}; shapes without both timings left out."""
    ratios = {s: r for s in shapes if (r := versus(records, kernel, peer, s)) is not None}
    ranked = sorted(ratios.items(), key=lambda x: x[1])
    return {"ratios": ratios, "faster": [s for s, r in ratios.items() if r > 1],
            "slower": [s for s, r in ratios.items() if r < 1],
            "worst": ranked[0] if ranked else None, "best": ranked[-1] if ranked else None}


def standing_line(records, kernel: str, peer: str, shapes, label: str | None = None) -> str:
    """:func:`standing` as a sentence: at how many of ``shapes`` ``kernel`` ran faster
    than ``peer``, from which S on it was faster at every shape, and its slowest and
    fastest ratio, with their shapes."""
    label = label or peer
    st = standing(records, kernel, peer, shapes)
    if not st["ratios"]:
        return f"{kernel} against {label}: not timed on the same shapes"
    lengths = sorted({s.S_q for s in st["ratios"]})
    ahead_from = next((S for S in lengths
                       if all(r > 1 for s, r in st["ratios"].items() if s.S_q >= S)), None)
    text = (f"{kernel} against {label}: faster at {len(st['faster'])} of "
            f"{len(st['ratios'])} shapes")
    if ahead_from is not None:
        text += " (all of them)" if ahead_from == lengths[0] else \
            f" (every one with S >= {ahead_from})"
    (worst, w), (best, b) = st["worst"], st["best"]
    return text + (f"; its speed {w:.2f}x that of {label} at {worst.label()}, "
                   f"up to {b:.2f}x at {best.label()}")


_BACKWARD_PEERS = {"flash": "FlashAttention-2", "cudnn": "cuDNN"}


def backward_speed_lines(measured: dict, D: int | None = None, at_least: float = 1.0,
                         peers=tuple(_BACKWARD_PEERS)) -> list[str]:
    """Chapter 9's recorded backward (``results["measurements"]["backward_pass"]``)
    against SDPA's two backward backends: the speed of the step the lean call takes over
    each of ``peers``' (above 1: the book's is faster) over the timed shapes (``D``:
    those of that head dim), and at how many it is at least ``at_least`` times it, as
    sentences."""
    lines = []
    for peer in peers:
        label = _BACKWARD_PEERS[peer]
        speed = [r["ms"][peer] / r["ms"][r["book"]] for r in measured["timings"]
                 if r["ms"].get(peer) and (D is None or r["shape"][3] == D)]
        if speed:
            count = sum(s >= at_least for s in speed)
            lines.append(f"speed / SDPA's {label} backward"
                         + (f" at D = {D}" if D is not None else "")
                         + f": {value_range(speed, '.2f')} (median "
                         f"{statistics.median(speed):.2f}x), "
                         + ("no slower" if at_least == 1.0 else f"at least {at_least}x")
                         + f" at {count} of {len(speed)} shapes")
    return lines


def training_line(name: str, m: dict, learned_loss: float | None = None) -> str:
    """One training comparison of chapter 9's record (``kernels.training``) as a
    sentence: whether the book's loss curve stayed within the spread of SDPA's from
    two initialisations, with the two gaps that decide it (the largest between the
    book's smoothed curve and SDPA's from the same weights, and between SDPA's from
    two initialisations: ``kernels.training.agreement``); given ``learned_loss``, the step from which each run's loss was
    below it (``runs[name]["learned_at"]``: the curves' largest gaps are on the way down,
    where a run that learns a step sooner or later is far from the other); the step times
    of the two paths stepped taking turns (kernels.training.step_times), and where
    recorded their steps in a CUDA graph (kernels.training.graphed_step_times)."""
    agree, graphed_ms = m["agreement"], m.get("graphed_ms")
    learned = {n: r.get("learned_at") for n, r in m.get("runs", {}).items()}
    return (f"{name}, {m['config']['steps']} steps: the book's loss curve "
            f"{'within' if agree['within'] else 'outside'} the spread of SDPA's from two "
            f"initialisations (the smoothed curves' largest gap: {agree['book_vs_sdpa']:.3f} "
            f"from SDPA's from the same weights, against {agree['seed_spread']:.3f} between "
            "SDPA's from the two)"
            + (f"; the loss below {learned_loss} from step {learned['book']}, SDPA's from "
               f"{learned['sdpa']}, from other weights {learned['sdpa_seed_1']}"
               if learned_loss is not None and learned.get("book") else "")
            + "; a step, the two paths taking turns, "
            f"{m['step_ms']['book']:.1f} ms against SDPA's {m['step_ms']['sdpa']:.1f}"
            + (f"; in a CUDA graph, {graphed_ms['book']:.2f} ms against {graphed_ms['sdpa']:.2f}"
               if graphed_ms else ""))


def model_rows(models: dict | None) -> list[dict]:
    """Chapter 8's recorded measurements of the lean call and the model
    (``results["measurements"]["models"]``) as one table: what was timed, the book's
    path, SDPA's, and the book's time over SDPA's (below 1: the book's is faster)."""
    if not models:
        return []
    rows = []

    def add(what, book, sdpa, unit):
        digits = 1 if unit == "µs" else 2
        rows.append({"what": what, "book": f"{book:.{digits}f} {unit}",
                     "SDPA": f"{sdpa:.{digits}f} {unit}", "book / SDPA": f"{book / sdpa:.2f}"})

    calls = models.get("host_calls", {})
    if "lean call" in calls and "SDPA default" in calls:
        add("host time of a call, back to back (B=1 H=8 S=512 D=64)",
            calls["lean call"]["back_to_back_us"], calls["SDPA default"]["back_to_back_us"], "µs")
    for small in models.get("small_shapes", []):
        us = small["us"]
        best = min(("SDPA default", "SDPA flash"), key=lambda k: us[k])
        add(f"device time at {small['shape']} (against {best}, the faster)",
            us["lean call"], us[best], "µs")
    for row in models.get("model", {}).get("forward", []):
        add(f"GPT-2-small forward, batch {row['batch']}, S={row['S']}, graphed",
            row["ms"]["book graphed"], row["ms"]["sdpa graphed"], "ms")
    generation = models.get("model", {}).get("generation")
    if generation:
        add(f"generation: prefill of {generation['prompt']} tokens, batch {generation['batch']}",
            generation["prefill_ms"]["book"], generation["prefill_ms"]["sdpa"], "ms")
        add(f"generation: per token, batch {generation['batch']}",
            generation["per_token_ms"]["book"], generation["per_token_ms"]["sdpa"], "ms")
        device = generation["device_per_token_ms"]
        add(f"generation: the device's time per token, batch {generation['batch']}",
            device["book"], device["sdpa"], "ms")
    return rows


def launch_totals(counted: dict) -> dict:
    """A profiled kernel's counts (``ncu_counts``' answer for one kernel) over the whole
    call: the ``.sum`` counters added over its launches (a call of several kernels, such
    as chapter 1's unfused one, moves the bytes of all of them)."""
    totals: dict = {}
    for launch in counted["launches"]:
        for metric, value in launch.items():
            if metric.endswith(".sum") and isinstance(value, (int, float)):
                totals[metric] = totals.get(metric, 0) + value
    return totals


def traffic_rows(profile: dict, kernels, against: str) -> list[dict]:
    """The recording's profile (``results["profile"]``: Nsight Compute at one shape) as
    one row a kernel of ``kernels`` ({label: kernel}): the bytes read from DRAM over
    those of q, k and v, the bytes through L2 over the fewest a forward pass moves
    (:func:`kernels.bench.min_bytes`), and warp instructions, also over ``against``'s."""
    from .bench import Shape, min_bytes

    shape = Shape(**profile["shape"])
    inputs = 2 * shape.B * shape.H * shape.D * (shape.S_q + 2 * shape.S_k)  # fp16 q, k, v
    counted = {k: v for k, v in profile.get("kernels", {}).items()
               if v and v.get("status") == "ok" and v.get("launches")}
    base = launch_totals(counted[against])["smsp__inst_executed.sum"] if against in counted else None
    rows = []
    for label, kernel in kernels.items():
        if kernel not in counted:
            continue
        t = launch_totals(counted[kernel])
        inst = t.get("smsp__inst_executed.sum")
        rows.append({"kernel": label,
                     "DRAM read / q, k, v": f"{t['dram__bytes_read.sum'] / inputs:.2f}",
                     "L2 bytes / fewest": f"{t['lts__t_bytes.sum'] / min_bytes(shape.B, shape.H, shape.S_q, shape.S_k, shape.D):.1f}",
                     "warp instructions (millions)": f"{inst / 1e6:,.1f}",
                     f"instructions / {against}'s": "" if not base else
                         f"{inst / base:.2f}" if inst < 10 * base else f"{inst / base:,.0f}"})
    return rows


#: Nsight Compute's names of what :func:`beside_rows` reads
BUSY = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"
ACTIVE = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
ISSUED = "smsp__issue_active.avg.pct_of_peak_sustained_active"
WAITED = "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"


def beside(run: dict, kernel: str, other: str) -> dict | None:
    """One profiled shape of a chapter's counters (``ncu_counts``' answer, with a
    "shape"), ``kernel`` beside ``other``: {"shape", "ns": (kernel's, other's) time, "busy":
    (each one's) nanoseconds the tensor pipe was busy, "idle": the rest of each one's
    time, and the counters ACTIVE, ISSUED, WAITED and instructions, each a pair}; None
    unless both were counted."""
    from .bench import Shape

    launches = {name: largest_launch(k) for name, k in run.get("kernels", {}).items()
                if k.get("status") == "ok" and k.get("launches")}
    if not {kernel, other} <= set(launches):
        return None
    pair = (launches[kernel], launches[other])
    ns = tuple(x["gpu__time_duration.sum"] for x in pair)
    busy = tuple(t * x[BUSY] / 100 for t, x in zip(ns, pair))
    return {"shape": Shape(**run["shape"]), "ns": ns, "busy": busy,
            "idle": tuple(t - b for t, b in zip(ns, busy)),
            **{m: tuple(x.get(m) for x in pair)
               for m in (ACTIVE, ISSUED, WAITED, "smsp__inst_executed.sum")}}


def beside_rows(runs, kernel: str, other: str, other_label: str | None = None) -> list[dict]:
    """:func:`beside` over a chapter's counted shapes, as table rows: the times, the
    tensor pipe's busy and idle time of each, and what the multiprocessors did."""
    other_label = other_label or other
    rows = []
    for run in runs:
        b = beside(run, kernel, other)
        if b is None:
            continue
        (t, u), (bt, bu), (it, iu) = b["ns"], b["busy"], b["idle"]
        pair = lambda m, spec: " / ".join(format(x, spec) for x in b[m])  # noqa: E731
        rows.append({"shape": b["shape"].label(),
                     "time (µs)": f"{t / 1e3:.0f} / {u / 1e3:.0f}",
                     "tensor pipe busy (µs)": f"{bt / 1e3:.0f} / {bu / 1e3:.0f}",
                     "tensor pipe idle (µs)": f"{it / 1e3:.0f} / {iu / 1e3:.0f}",
                     "multiprocessors active (%)": pair(ACTIVE, ".0f"),
                     "issuing (% of cycles)": pair(ISSUED, ".0f"),
                     "warp instructions (millions)": " / ".join(
                         f"{x / 1e6:.0f}" for x in b["smsp__inst_executed.sum"]),
                     "'wait' stalls an instruction": pair(WAITED, ".2f")})
    return rows
