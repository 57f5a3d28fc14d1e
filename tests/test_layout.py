"""The shape of farm/ itself (issue 17): no import cycle, no module past 600 lines without a
reason, every error in farm/errors.py, every FARM_* setting in farm/settings.py and the README."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from farm import errors, settings

ROOT = Path(__file__).resolve().parent.parent
FARM = ROOT / "farm"
MAX_LINES = 600
LONG_REASON = "longer than 600 lines because"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(FARM.rglob("*.py"))}


def _imports(tree: ast.Module):
    """Every import statement of a module, those inside functions included: a lazy import that
    closes a loop is still a cycle between two modules (issue 17 found build -> verify -> repair
    -> windows -> build running only through such imports). `if TYPE_CHECKING:` blocks never run."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        else:
            todo += list(ast.iter_child_nodes(node))


def _with_packages(name: str, importer: str) -> list[str]:
    """farm.a.b -> [farm.a, farm.a.b]: importing a submodule runs its package's __init__ first;
    not the importer's own packages, which are already being imported when it runs."""
    parts = name.split(".")
    found = [".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in MODULES]
    return [m for m in found if not importer.startswith(m + ".")]


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(t for a in node.names for t in _with_packages(a.name, name))
            elif node.level == 0 and node.module and (node.module == "farm" or node.module.startswith("farm.")):
                targets.update(_with_packages(node.module, name))
                # `from farm.x import y` imports the submodule farm.x.y when there is one
                targets.update(t for a in node.names for t in _with_packages(f"{node.module}.{a.name}", name))
        targets.discard(name)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}    # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_farm_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_is_longer_than_600_lines_without_saying_why():
    long = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and LONG_REASON not in " ".join(lines[:5]):
            long.append(f"{name} ({len(lines)} lines)")
    assert not long, f"over {MAX_LINES} lines without '{LONG_REASON}' in its first 5 lines: {', '.join(long)}"


def test_every_farm_error_is_declared_in_farm_errors():
    error_names = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.FarmError)}
    elsewhere = []
    for name, path in MODULES.items():
        if name == "farm.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] in error_names for b in node.bases):
                elsewhere.append(f"{name}.{node.name}")
    assert not elsewhere, f"FarmError subclasses outside farm/errors.py: {elsewhere}"


def test_every_error_states_its_exit_code_in_farm_errors():
    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.FarmError):
            assert "exit_code" in vars(cls), f"{name} inherits its exit code; farm/errors.py should state it"


def test_farm_settings_are_read_only_through_farm_settings():
    by_name = re.compile(r"""environ(?:\.get\(|\[)\s*["']FARM_""")
    readers = [name for name, path in MODULES.items()
               if name != "farm.settings" and by_name.search(path.read_text())]
    assert not readers, f"read FARM_* from the environment by name instead of through farm.settings: {readers}"


def test_every_farm_variable_in_the_code_is_a_setting_or_named_as_not_one():
    declared = {s.name for s in settings.SETTINGS}
    not_settings = set(re.findall(r"FARM_[A-Z_]+", (settings.__doc__ or "").split("Not settings:")[1]))
    seen = {v for p in MODULES.values() for v in re.findall(r"\bFARM_[A-Z][A-Z0-9_]*[A-Z0-9]\b", p.read_text())}
    assert seen - declared - not_settings == set()


def test_readme_settings_section_is_what_farm_settings_generates():
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"<!-- settings: generated from farm/settings.py -->\n(.*?)<!-- settings: end -->", readme, re.S)
    assert section, "README.md has no generated Settings section"
    generated = subprocess.run([sys.executable, "-m", "farm.settings", "--markdown"], capture_output=True,
                               text=True, check=True, cwd=ROOT).stdout
    assert section.group(1) == generated, "README's Settings table is stale: paste `python -m farm.settings --markdown`"


def _stage_table() -> dict[str, str]:
    """docs/design.md §1.1's table: package folder -> its `modules` cell."""
    rows = {}
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[2].startswith("`farm/"):
            rows[cells[2].strip("`").rstrip("/")] = cells[3]
    return rows


def test_the_design_stage_table_names_every_module_of_every_stage_package():
    # A newcomer finds any stage's code from this table alone: a module added to a stage package
    # without a row entry, or a row naming a module that moved, fails here.
    table = _stage_table()
    packages = {p.parent.relative_to(ROOT).as_posix() for p in FARM.glob("*/__init__.py")}
    assert set(table) == packages, "stage packages: " + str(set(table) ^ packages)
    for package, cell in table.items():
        if package == "farm/commands":
            continue   # "one module per command group"
        named = set(re.findall(r"`([a-z_]+)/?`", cell))
        folder = ROOT / package
        present = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        present |= {p.parent.name for p in folder.glob("*/__init__.py")}
        present |= {p.stem for p in folder.glob("*/*.py") if p.stem != "__init__"}
        missing, stale = present - named, named - present
        assert not missing and not stale, f"{package}: not in the table {sorted(missing)}, gone {sorted(stale)}"


def test_every_farm_path_the_readme_and_design_name_exists():
    for doc in (ROOT / "README.md", ROOT / "docs" / "design.md"):
        for path in re.findall(r"(?<![\w./~-])farm/[\w/]*[\w]+(?:\.py)?/?", doc.read_text()):
            assert (ROOT / path).exists(), f"{doc.name} names {path}, which does not exist"


# ---------------------------------------------------------------- the stage order (design.md §1.1, issue 36)

COMMAND_LINE = {"farm.cli", "farm.__main__"}   # the command line's entry, above every stage with farm/commands/


def _stage_ranks() -> dict[str, int]:
    """docs/design.md §1.1's table in its order: stage package -> rank (1 the first row); the command
    line, numbered '-', comes after every stage."""
    ranks: dict[str, int] = {}
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[2].startswith("`farm/"):
            ranks[cells[2].strip("`").rstrip("/").replace("/", ".")] = len(ranks) + 1
    return ranks


def stage_rank(module: str, ranks: dict[str, int]) -> int:
    """0 for a shared top-level module, else the rank of the stage package it belongs to."""
    if module in COMMAND_LINE:
        return ranks["farm.commands"]
    package = ".".join(module.split(".")[:2])
    return ranks[package] if package in ranks else 0


def direct_imports(name: str, path: Path) -> set[str]:
    """The farm modules `name` imports by name, each the most specific module meant (`from farm.build
    import cell` is farm.build.cell; `from farm.build.cell import x` is farm.build.cell), lazy ones too."""
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("farm."))
        elif node.level == 0 and node.module and (node.module == "farm" or node.module.startswith("farm.")):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    found.discard(name)
    return {m for m in found if m in MODULES}


def order_violations(ranks: dict[str, int] | None = None) -> list[str]:
    """Every import of a module from a stage listed below the importer's (or, from a shared module, of
    any stage), as 'importer -> imported'."""
    ranks = ranks or _stage_ranks()
    out = []
    for name, path in MODULES.items():
        own = stage_rank(name, ranks)
        out += [f"{name} -> {m}" for m in sorted(direct_imports(name, path)) if stage_rank(m, ranks) > own]
    return out


def test_the_order_checker_sees_an_import_against_the_order():
    ranks = {"farm.matrix": 1, "farm.build": 2, "farm.commands": 3}
    assert stage_rank("farm.errors", ranks) == 0 and stage_rank("farm.cli", ranks) == 3
    assert stage_rank("farm.build.source.git", ranks) == 2
    # the real modules with two rows swapped: the build's imports of its recipes now point down the table
    swapped = {**_stage_ranks(), "farm.build": 1, "farm.recipes": 2}
    assert "farm.build.cell -> farm.recipes.model" in order_violations(swapped)


def test_no_stage_imports_one_listed_below_it():
    # design.md §1.1: data flows down the table; a stage imports the stages above it and the shared
    # top-level modules, and a shared module imports no stage at all.
    violations = order_violations()
    assert not violations, f"{len(violations)} imports against design.md §1.1's order:\n" + "\n".join(violations)


def _subprocess_importers() -> set[str]:
    found = set()
    for name, path in MODULES.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "subprocess" or n.startswith("subprocess.") for n in names):
                found.add(name)
    return found


def test_only_farm_process_starts_processes_or_each_exception_says_why():
    # issue 36: farm/process.py is the one way to start a child; a module that still imports subprocess
    # is named in its docstring with the reason, and a name there that no longer needs it is stale.
    from farm import process

    named = dict(re.findall(r"^- (farm/[\w/]+\.py): (\S.*)$", (process.__doc__ or "").partition("Exceptions")[2], re.M))
    exceptions = {module_name(ROOT / path) for path in named}
    importers = _subprocess_importers() - {"farm.process"}
    assert importers <= exceptions, f"import subprocess without a reason in farm/process.py: {sorted(importers - exceptions)}"
    assert exceptions <= importers, f"named in farm/process.py but no longer importing subprocess: {sorted(exceptions - importers)}"
