"""Measures of gpuctl's import graph (grimp, the library import-linter is built on):

- import loops: groups of modules that import each other in a cycle (strongly connected
  components of more than one module), overall and inside `gpuctl.core`;
- import levels inside a package: the longest chain of imports between its modules, loops
  collapsed (one level: nothing of the package imports anything else of it), and between its
  parts (its own modules and sub-packages, each sub-package one part: how the package is layered);
- imports from a lower layer to a higher one, and between independent siblings of one layer
  (`cli | tui | testing > ops | bench | lab > config | adapters > core > errors | checkpoint`, the
  layers contract in pyproject.toml: config and adapters do not import each other, nor do cli and
  tui), counted on the whole graph (the contract's commented ignore_imports count here);
- packages with more than 25 modules of their own and no sub-package.

    python benchmarks/import_graph.py [--package gpuctl] [-o json]

Type-checking-only imports count (grimp sees them), as they are part of what a reader follows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import grimp

# The layers contract of pyproject.toml, highest first; the packages of one layer are independent.
LAYERS = (
    ("cli", "tui", "testing"),
    ("ops", "bench", "lab"),
    ("config", "adapters"),
    ("core",),
    ("errors", "checkpoint"),
)


def sccs(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in nodes:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(sorted(comp))
    return out


def levels(nodes: set[str], edges: dict[str, set[str]]) -> int:
    """The longest import chain among `nodes`, each loop counted as one module."""
    comps = sccs(nodes, edges)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    dag: dict[int, set[int]] = defaultdict(set)
    for a in nodes:
        for b in edges.get(a, ()):
            if b in nodes and comp_of[a] != comp_of[b]:
                dag[comp_of[a]].add(comp_of[b])
    depth: dict[int, int] = {}

    def walk(c: int) -> int:
        if c not in depth:
            depth[c] = 1 + max((walk(d) for d in dag.get(c, ())), default=0)
        return depth[c]

    sys.setrecursionlimit(10000)
    return max((walk(i) for i in range(len(comps))), default=0)


def top_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _child(pkg: str, module: str) -> str:
    """The direct child of `pkg` that holds `module` (a sub-package counts as one part)."""
    return ".".join(module.split(".")[: pkg.count(".") + 2])


def layer_of(module: str, package: str) -> int | None:
    top = top_of(module)
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return None


def measure(package: str) -> dict[str, object]:
    graph = grimp.build_graph(package)
    modules = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    loops = [c for c in sccs(modules, edges) if len(c) > 1]
    core = f"{package}.core"
    core_loops = [c for c in loops if all(m == core or m.startswith(core + ".") for m in c)]
    upward = []
    sideways = []
    for a, targets in sorted(edges.items()):
        la = layer_of(a, package)
        for b in sorted(targets):
            lb = layer_of(b, package)
            if la is not None and lb is not None and lb < la:
                upward.append(f"{a} -> {b}")
            elif la is not None and la == lb and top_of(a) != top_of(b):
                sideways.append(f"{a} -> {b}")
    packages: dict[str, dict[str, object]] = {}
    for pkg in sorted(m for m in modules if graph.find_children(m)):
        children = graph.find_children(pkg)
        own = {c for c in children if not graph.find_children(c)}
        subs = {c for c in children if graph.find_children(c)}
        inside = {m for m in modules if m == pkg or m.startswith(pkg + ".")}
        child_of = {m: _child(pkg, m) for m in inside - {pkg}}
        between: dict[str, set[str]] = defaultdict(set)
        for m, c in child_of.items():
            for t in edges.get(m, ()):
                if t in child_of and child_of[t] != c:
                    between[c].add(child_of[t])
        packages[pkg] = {
            "modules": len(own),
            "subpackages": len(subs),
            "levels": levels(inside - {pkg}, edges),
            "part_levels": levels(set(child_of.values()), between),
        }
    crowded = [p for p, v in packages.items() if v["modules"] > 25 and not v["subpackages"]]
    return {
        "modules": len(modules),
        "loops": len(loops),
        "loop_members": loops,
        "loops_in_core": len(core_loops),
        "upward_imports": upward,
        "sibling_imports": sideways,
        "packages": packages,
        "crowded_packages": crowded,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="gpuctl")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = parser.parse_args()
    m = measure(args.package)
    if args.output == "json":
        print(json.dumps(m, indent=2))
        return 0
    print(f"modules: {m['modules']}")
    print(f"import loops: {m['loops']} (inside core: {m['loops_in_core']})")
    for loop in m["loop_members"]:  # type: ignore[attr-defined]
        print(f"  loop of {len(loop)}: {', '.join(loop)}")
    upward = m["upward_imports"]
    print(f"imports from a lower layer to a higher one: {len(upward)}")  # type: ignore[arg-type]
    for line in upward:  # type: ignore[attr-defined]
        print(f"  {line}")
    sideways = m["sibling_imports"]
    print(f"imports between independent siblings of a layer: {len(sideways)}")  # type: ignore[arg-type]
    for line in sideways:  # type: ignore[attr-defined]
        print(f"  {line}")
    print("package: own modules, sub-packages, import levels (modules; parts)")
    for pkg, v in m["packages"].items():  # type: ignore[attr-defined]
        levels_ = f"{v['levels']}; {v['part_levels']}"
        print(f"  {pkg}: {v['modules']}, {v['subpackages']}, {levels_}")
    print(f"packages over 25 modules without sub-packages: {m['crowded_packages'] or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
