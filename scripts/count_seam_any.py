"""Count `Any` at otel_rl's module seams (issue 10's measure).

A *seam* is a signature other modules call: a module-level function or a method of a
module-level class whose name does not start with an underscore (dunder methods count), in
every module under ``otel_rl/``. Each parameter or return annotation that mentions ``Any`` counts
once. ``--all`` also counts private functions. Usage: ``python scripts/count_seam_any.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _mentions_any(node: ast.expr | None) -> bool:
    if node is None:
        return False
    return any((isinstance(n, ast.Name) and n.id == "Any") or
               (isinstance(n, ast.Attribute) and n.attr == "Any") or
               (isinstance(n, ast.Constant) and isinstance(n.value, str) and "Any" in n.value)
               for n in ast.walk(node))


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def count(root: Path, include_private: bool) -> dict[str, int]:
    result: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        n = 0
        scopes: list[tuple[ast.AST, bool]] = [(tree, True)]
        while scopes:
            scope, public_scope = scopes.pop()
            for node in ast.iter_child_nodes(scope):
                if isinstance(node, ast.ClassDef):
                    scopes.append((node, public_scope and (include_private or _public(node.name))))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if not (public_scope and (include_private or _public(node.name))):
                        continue
                    args = node.args
                    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                    params += [a for a in (args.vararg, args.kwarg) if a is not None]
                    n += sum(_mentions_any(a.annotation) for a in params)
                    n += _mentions_any(node.returns)
        if n:
            result[str(path)] = n
    return result


def main() -> int:
    counts = count(Path(sys.argv[-1] if len(sys.argv) > 1 and not sys.argv[-1].startswith("-")
                        else "otel_rl"), "--all" in sys.argv)
    for path, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"{n:4d}  {path}")
    print(f"{sum(counts.values()):4d}  total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
