"""The tree shows the layers (docs/maintaining.md): no import circles, lazy imports included;
a few modules at the top, the rest in their layer's package; every import a lesson or a
document shows still works."""
import ast
import importlib
import re
from pathlib import Path

import pytest

import kosmoss

PACKAGE = Path(kosmoss.__file__).parent
ROOT = PACKAGE.parent
TOP_MODULES = {"__init__.py", "__main__.py", "cli.py", "model.py"}


def _modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph():
    """module -> the kosmoss modules it imports, anywhere in its code. ``from pkg import
    module`` depends on the module only; importing a package's own names depends on it."""
    modules, graph = _modules(), {}
    for name, (path, is_package) in modules.items():
        base = name.split(".") if is_package else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                parts = base[:len(base) - node.level + 1] if node.level else []
                target = ".".join(parts + ([node.module] if node.module else []))
                wanted = [f"{target}.{alias.name}" for alias in node.names]
                if not all(module in modules for module in wanted):
                    wanted.append(target)
            elif isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            else:
                continue
            deps |= {m for m in wanted if m in modules and m != name
                     and not name.startswith(m + ".")}
        graph[name] = deps
    return graph


def circles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_top_holds_only_the_entry_points_and_the_model():
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert top == TOP_MODULES, f"move {sorted(top - TOP_MODULES)} into its layer's package"


def test_every_package_says_what_it_holds():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "TODO" not in doc, f"{init.relative_to(ROOT)}: no docstring"


def _shown_imports():
    """``from kosmoss... import ...`` lines in the lessons, scripts and documents."""
    sources = [*ROOT.glob("notebooks/*.py"), *ROOT.glob("trainup_*.py"), *ROOT.glob("docs/**/*.md"),
               ROOT / "README.md"]
    pattern = re.compile(r"^\s*(?:#\s*)?from (kosmoss[\w.]*) import ([\w, ]+)$", re.M)
    for source in sources:
        for module, names in pattern.findall(source.read_text()):
            yield (source.relative_to(ROOT), module,
                   [n.split(" as ")[0].strip() for n in names.split(",") if n.strip()])


@pytest.mark.parametrize("where, module, names", list(_shown_imports()),
                         ids=lambda value: str(value))
def test_every_import_a_lesson_or_a_document_shows_works(where, module, names):
    imported = importlib.import_module(module)
    for name in names:
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"{where}: from {module} import {name} fails"


def test_what_the_tests_start_writes_its_temporary_files_in_pytests_folder(tmp_path_factory):
    """conftest's TMPDIR: a child process's temporary folder is inside this session's pytest
    folder, which pytest rotates, not in /tmp where a killed run's leftovers would stay."""
    import os
    import subprocess
    import sys
    import tempfile

    base = tmp_path_factory.getbasetemp().resolve()
    assert Path(tempfile.mkdtemp()).resolve().is_relative_to(base)
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(child).resolve().is_relative_to(base)
    # ... but torch.compile's cache stays out of it, warm from one session to the next
    assert not Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).resolve().is_relative_to(base)
