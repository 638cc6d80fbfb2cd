"""The package's layout: generated chapter modules apart from the hand-written harness,
no module importing in a circle, none below a floor importing what sits above it, and no
module reaching into another's private names."""

import ast
import re
from pathlib import Path

import pytest

import kernels

PACKAGE = Path(kernels.__file__).resolve().parent
GENERATED = "# Generated from book/"


def _modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict, leaving_out=()) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its text (at the top or
    inside a function; ``leaving_out``: top-level functions whose imports are not
    counted), resolved to modules: ``from .x import y`` is ``x.y`` where y is a module,
    else ``x``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    tree.body = [node for node in tree.body
                 if not (isinstance(node, ast.FunctionDef) and node.name in leaving_out)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for a in node.names:
                found.add(f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source)
    return {m for m in found if m in modules and m != name}


def test_generated_modules_live_in_chapters_and_nowhere_else():
    for path in PACKAGE.rglob("*.py"):
        generated = path.read_text().startswith(GENERATED)
        in_chapters = path.parent.name == "chapters" and re.fullmatch(r"ch\d\d_\w+\.py", path.name)
        assert generated == bool(in_chapters), path
    assert set(kernels.CHAPTERS) == {int(p.name[2:4]) for p in (PACKAGE / "chapters").glob("ch*.py")}


def test_every_chapter_module_is_named_for_its_chapter():
    book = PACKAGE.parent / "book"
    for number, name in kernels.CHAPTERS.items():
        assert (book / f"{number:02d}_{name}.md").is_file()
        first = (PACKAGE / "chapters" / f"ch{number:02d}_{name}.py").read_text().splitlines()[0]
        assert first == f"{GENERATED}{number:02d}_{name}.md by tools/sync_chapters.py: edit the chapter,"


def test_nothing_imports_in_a_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


#: (module, a module it does not import, the functions of it that still do: what they
#: serve has not moved yet)
FLOORS = [
    # what a GPU is and needs sits below the records read of it
    ("kernels.gpus", "kernels.results", ()),
    # the plots draw what they are given; they run no training
    ("kernels.plots", "kernels.training", ()),
]


@pytest.mark.parametrize("module, below, leaving_out", FLOORS)
def test_floors_between_layers(module, below, leaving_out):
    modules = _modules()
    assert below not in _imports(module, modules[module], modules, leaving_out)
    for name in leaving_out:  # each still imports it, else it leaves the list
        assert below in _imports(module, modules[module], modules,
                                 {n for n in leaving_out if n != name}), name


def test_the_circle_finder_finds_one(tmp_path):
    """A package of two modules that import each other, inside functions: found."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("from pkg import a\n")
    modules = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": tmp_path / "pkg" / "a.py",
               "pkg.b": tmp_path / "pkg" / "b.py"}
    assert _imports("pkg.a", modules["pkg.a"], modules) == {"pkg.b"}
    assert _imports("pkg.b", modules["pkg.b"], modules) == {"pkg.a"}


def test_no_module_uses_another_modules_private_names():
    """``from x import _y`` and ``x._y`` of the package's own modules: neither."""
    modules = _modules()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("kernels")):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{name} imports {private} from {node.module}"
        aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                   for a in node.names
                   if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("kernels"))
                   or isinstance(node, ast.Import) and a.name.startswith("kernels")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.value.id != "self"):
                raise AssertionError(f"{name} uses {node.value.id}.{node.attr}")


def test_every_subpackage_is_installed():
    """A package directory missing from pyproject's list is left out of a (non-editable)
    install: a notebook runtime would fail to import it."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts)
             for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"not installed: {sorted(found - listed)}"


def test_every_test_file_the_scripts_and_readme_name_exists():
    """A renamed test file leaves no script running a file that is gone (pytest exits 4
    on a missing path, and the CUDA 12 check with it)."""
    root = PACKAGE.parent
    texts = [p.read_text() for p in [root / "README.md", root / "CONTRIBUTING.md",
                                     *sorted((root / "tools").glob("*.sh")), root / ".ci" / "run"]]
    named = {m for text in texts for m in re.findall(r"tests/test_\w+\.py", text)}
    assert named, "no test file named anywhere: the pattern is wrong"
    assert not [n for n in sorted(named) if not (root / n).is_file()]
