"""Layers point one way (issue 17): the import graph of otel_rl's own modules, read from the
source with `ast` — module-level imports and imports inside functions alike (an import that
runs only when a function is called is still a dependency), and for what a module reaches, the
packages Python imports first (``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``). ``if
TYPE_CHECKING:`` blocks never run and are left out of what a module reaches, but not of the
cycle check: a type-only cycle is still two modules that cannot be understood apart. No
exception is allowed by name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import otel_rl

PACKAGE = Path(otel_rl.__file__).parent
INTERNAL = "otel_rl._internal."

#: The hot path and the process state it runs on: what timing a block (and shipping its record
#: across threads and processes) needs. Anything that imports one of these is on the write
#: side, so checking these few also catches every module built on them.
HOT_PATH = {INTERNAL + name for name in (
    "recorder", "runtime", "propagation", "relay", "pipeline", "threads", "gpu", "components",
    "placement", "contribute", "windows", "metrics_export")}


def _is_read_side(module: str) -> bool:
    """Reading a file or a backend and drawing what it holds: the readers, the tree rebuilt
    from spans or aggregates, the renderers, and every CLI command but ``run``/``demo``."""
    if module.startswith((INTERNAL + "readers", "otel_rl.renderers")):
        return True
    if module.startswith(INTERNAL + "cli"):
        return module not in (INTERNAL + "cli.run", INTERNAL + "cli.demo")
    return module in (INTERNAL + "treebuild", INTERNAL + "aggregates")


#: The model: the one tree node and the tree, what both sides share. It imports no reader.
MODEL = {INTERNAL + "node", INTERNAL + "tree", INTERNAL + "shapes", INTERNAL + "wholerun"}


def _never_run(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def _in_functions(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            skip.update(id(n) for n in ast.walk(node) if n is not node)
    return skip


def _imported(path: Path, module: str, body_only: bool = False,
              type_only: bool = False) -> set[str]:
    """Every name `module` imports (absolute), anywhere in it but under TYPE_CHECKING (with
    `type_only`: there too; with `body_only`: only what running the module itself imports,
    not its functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip = (set() if type_only else _never_run(tree)) | (
        _in_functions(tree) if body_only else set())
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


#: Suffix of a package's node that stands for running its ``__init__`` (see `module_graph`).
BODY = " (body)"


def module_graph(packages: bool = False, type_only: bool = False) -> dict[str, set[str]]:
    """otel_rl module -> the otel_rl modules it imports. With `packages`, every module also
    reaches what running the packages that contain it imports (Python runs ``a/__init__``
    and ``a/b/__init__`` before ``a.b.c``), as nodes ``"a.b (body)"``: only their module-
    level imports, since importing a package calls none of its functions. (A package that
    imports its own modules is no cycle, so the cycle check leaves these edges out.) With
    `type_only`, imports under ``if TYPE_CHECKING:`` count too."""
    paths: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(targets: set[str], name: str) -> set[str]:
        return {target for target in targets if target in paths and target != name}

    graph = {name: known(_imported(path, name, type_only=type_only), name)
             for name, path in paths.items()}
    if packages:
        for name in list(graph):
            parts = name.split(".")
            graph[name] |= {".".join(parts[:i]) + BODY for i in range(1, len(parts))}
            if paths[name].name == "__init__.py":
                graph[name + BODY] = known(_imported(paths[name], name, body_only=True), name)
                graph[name + BODY] |= {".".join(parts[:i]) + BODY for i in range(1, len(parts))}
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module `start` imports, directly or not -> the module that imports it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        for target in graph[name]:
            if target not in via:
                via[target] = name
                todo.append(target)
    return via


def _chain(via: dict[str, str], start: str, end: str) -> str:
    chain = [end]
    while chain[-1] != start:
        chain.append(via[chain[-1]])
    return " -> ".join(name.removeprefix(INTERNAL) for name in reversed(chain))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:  # otel_rl's graph is ~15 levels deep
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                found.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_the_graph_sees_imports_inside_functions_and_every_module() -> None:
    graph = module_graph()
    assert len(graph) > 60
    assert HOT_PATH <= set(graph)  # a renamed hot-path module must be renamed here too
    # `aggregates.build` imports `wholerun` inside the function; `cli/__init__` imports none of
    # its subcommands (they are loaded by name when chosen).
    assert INTERNAL + "wholerun" in graph[INTERNAL + "aggregates"]
    assert not any(name.startswith(INTERNAL + "cli.") for name in graph[INTERNAL + "cli"]
                   if name != INTERNAL + "cli._output")
    assert sum(_is_read_side(name) for name in graph) > 15


def test_the_read_side_imports_nothing_of_the_hot_path() -> None:
    graph = module_graph(packages=True)
    wrong = []
    for name in sorted(filter(_is_read_side, graph)):
        via = _reach(graph, name)
        wrong += [_chain(via, name, hot) for hot in sorted(HOT_PATH & set(via))]
    assert wrong == []


def test_the_model_imports_no_reader_renderer_or_command() -> None:
    graph = module_graph(packages=True)
    wrong = []
    for name in sorted(MODEL):
        via = _reach(graph, name)
        wrong += [_chain(via, name, target) for target in sorted(via)
                  if _is_read_side(target) or target in HOT_PATH]
    assert wrong == []


def test_otel_rl_modules_import_each_other_without_cycles() -> None:
    # Type-only imports (``if TYPE_CHECKING:``) included: a protocol names what a module needs
    # of one above it (`ledger_hooks.Runtime`) instead of importing it.
    assert _cycles(module_graph(type_only=True)) == []


def test_the_graph_sees_type_only_imports_when_asked() -> None:
    # `otel_rl/__init__` imports its lazy re-exports only for type checkers.
    name = "otel_rl"
    assert INTERNAL + "readers" not in module_graph()[name]
    assert INTERNAL + "readers" in module_graph(type_only=True)[name]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    via = _reach(graph, "d")
    assert _chain(via, "d", "c") == "d -> a -> b -> c"


def test_loading_the_whole_read_side_loads_no_hot_path_module() -> None:
    # What the graph says, checked where Python decides: one interpreter imports every
    # read-side module (a command that only reads never pays for the hot path's imports).
    read_side = sorted(filter(_is_read_side, module_graph()))
    code = ("import importlib, json, sys\n"
            f"for name in {read_side!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('otel_rl'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    loaded = set(__import__("json").loads(out.stdout))
    assert set(read_side) <= loaded
    assert loaded & HOT_PATH == set()


def _private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, module globals, class
    attributes, ``self._x`` attributes, ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Name):
                        names.add(part.id)
                    elif (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                          and part.value.id in ("self", "cls")):
                        names.add(part.attr)
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                names.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def private_uses_across_modules() -> list[str]:
    """Every ``x._name`` and ``from m import _name`` in an otel_rl module where ``_name`` is
    private to another otel_rl module (defined there, not here). Privates of other packages
    (``sys._getframe``, Ray's) and otel_rl's marks on foreign objects (``_otel_rl``) are not
    otel_rl modules' privates; a module named ``_x`` is its package's own."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}
    defined = {path: _private_names(tree) for path, tree in trees.items()}
    everywhere = set().union(*defined.values())
    found = []
    for path, tree in sorted(trees.items()):
        own = defined[path]
        for node in ast.walk(tree):
            used = []
            if (isinstance(node, ast.Attribute) and node.attr in everywhere
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                used.append(node.attr)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("otel_rl"):
                used += [alias.name for alias in node.names if alias.name in everywhere]
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}"
                      for name in used if name not in own]
    return found


#: Private names of other packages' objects that an otel_rl module also happens to define
#: (the check cannot see an object's type): Ray Client's stubs' ``_name`` (`ray_support.client`)
#: is not the recorder's ``_name`` slot.
FOREIGN = {"_internal/ray_support/client.py": {"_name"}}


def test_no_module_uses_another_modules_privates() -> None:
    found = [use for use in private_uses_across_modules()
             if use.rpartition(": ")[2] not in FOREIGN.get(use.partition(":")[0], set())]
    assert found == []


def test_the_private_use_check_sees_one() -> None:
    # Its own data: names private to one module, as the other modules would see them.
    tree = ast.parse("class A:\n    __slots__ = ('_x',)\n\n_g = 1\n\ndef _f():\n    pass\n")
    assert _private_names(tree) == {"_x", "_g", "_f"}
