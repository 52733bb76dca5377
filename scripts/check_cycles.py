"""No import circles among the package's modules, imports under ``TYPE_CHECKING`` included.

A circle hidden behind ``TYPE_CHECKING`` is still a circle of design: two modules that each need
the other cannot be read, tested or replaced apart. import-linter's layer contracts see packages,
not every module pair; this check builds the whole module graph with grimp (installed with
import-linter) and reports each strongly connected component: the modules in it and one import
chain that closes the circle. Run by ``scripts/lint.sh``; exits 1 when a circle is found.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import grimp

PACKAGE = "osmosis_harbor"


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm, iterative (a deep package would overflow the recursion limit):
    every component of more than one module, or of one module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges[node]:
                        found.append(sorted(component))
    return sorted(found)


def closing_chain(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """One circle through the component's first module: a way out to a neighbour and back."""
    first = component[0]
    for neighbour in sorted(graph.find_modules_directly_imported_by(first)):
        if neighbour in component:
            back = graph.find_shortest_chain(importer=neighbour, imported=first)
            if back is not None:
                return [first, *back]
    return [first, first]


def main() -> int:
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=False, cache_dir=None)
    components = strongly_connected(graph)
    for component in components:
        print(f"import circle among {len(component)} modules: {', '.join(component)}")
        chain = closing_chain(graph, component)
        for importer, imported in zip(chain, chain[1:], strict=False):
            lines = sorted({d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)})
            where = importer.replace(".", "/") + ".py"
            print(f"  {where}:{','.join(map(str, lines)) or '?'}: {importer} -> {imported}")
    if components:
        print(f"{len(components)} import circle(s), TYPE_CHECKING imports included")
    return 1 if components else 0


if __name__ == "__main__":
    sys.exit(main())
