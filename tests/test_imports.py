"""Every name the tree imports from the package exists: each ``from kernels... import
NAME`` and ``import kernels.X`` in the tracked Python files of kernels/, tools/,
benchmarks/ and tests/ resolves (the module imports, and NAME is its attribute or a
submodule). A script nothing runs in CI would otherwise keep a removed name unnoticed."""

import ast
import importlib
import subprocess
from pathlib import Path

import pytest

import kernels

ROOT = Path(kernels.__file__).resolve().parent.parent
FOLDERS = ("kernels", "tools", "benchmarks", "tests")


def _tracked_python() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--", *(f"{d}/*.py" for d in FOLDERS)],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in listed.splitlines()]


def _package_of(path: Path) -> str | None:
    """The dotted package a module of kernels/ is in (where its relative imports start)."""
    rel = path.relative_to(ROOT)
    return ".".join(rel.parent.parts) if rel.parts[0] == "kernels" else None


def _imported(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of each import of the package in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names
                      if a.name.split(".")[0] == "kernels"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(path).split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "kernels":
                found += [(module, a.name, node.lineno) for a in node.names if a.name != "*"]
    return found


def _resolves(module: str, name: str | None) -> bool:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return False
    if name is None or hasattr(mod, name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return False
    return True


def test_the_files_are_found():
    paths = _tracked_python()
    assert any(p.parts[-2] == "tests" for p in paths) and any(
        p.parts[-2] == "kernels" for p in paths), "git ls-files found no Python files"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_imported_name_exists(folder):
    missing = [f"{p.relative_to(ROOT)}:{line}: {module}" + (f".{name}" if name else "")
               for p in _tracked_python() if p.relative_to(ROOT).parts[0] == folder
               for module, name, line in _imported(p) if not _resolves(module, name)]
    assert not missing, "imports of names that do not exist:\n" + "\n".join(missing)
