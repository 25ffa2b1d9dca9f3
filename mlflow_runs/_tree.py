"""The family tree of a run: every individual, both parents of a crossover, the champion's path.

The graph is a networkx DiGraph (parent -> child). networkx's multipartite layout places one row
per depth (networkx's topological generations), and matplotlib draws it to SVG. Within a row,
individuals are ordered by the mean position of their parents (the barycentre heuristic), which
keeps most edges from crossing.
"""

from __future__ import annotations

import io
import math
from typing import Any

from ._values import clean


def _number(value: Any) -> float | None:
    value = clean(value)
    return float(value) if isinstance(value, int | float) and math.isfinite(float(value)) else None


def build_graph(rows: list[dict[str, Any]]):
    """One node per individual (its first evaluation), an edge from each parent in the rows."""
    import networkx as nx

    graph = nx.DiGraph()
    for row in rows:
        ind = str(row["individual_id"])
        if ind in graph and graph.nodes[ind].get("row"):
            continue
        graph.add_node(ind, row=row, generation=int(clean(row.get("generation")) or 0))
    for row in rows:
        child = str(row["individual_id"])
        for rank, parent in enumerate(clean(row.get("parent_ids")) or []):
            if str(parent) in graph and not graph.has_edge(str(parent), child):
                graph.add_edge(str(parent), child, rank=rank)
    return graph


def _order_rows(graph) -> None:
    """Give every node a ``layer`` (its depth: one below its deepest parent; a chain of edits in
    one generation makes several) and an order within it (its parents' barycentre)."""
    import networkx as nx

    position: dict[str, float] = {}
    for layer, nodes in enumerate(nx.topological_generations(graph)):
        def key(n: str) -> tuple[float, str]:
            parents = [position[p] for p in graph.predecessors(n) if p in position]
            return (sum(parents) / len(parents) if parents else -1.0, n)

        for i, node in enumerate(sorted(nodes, key=key)):
            position[node] = i / max(len(nodes) - 1, 1)
            graph.nodes[node]["layer"] = layer
            graph.nodes[node]["order"] = i


def family_tree_svg(rows: list[dict[str, Any]], highlight: list[str], caption: str) -> str:
    """The whole run as SVG: failures grey, the ``highlight`` path (seed -> champion) in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    graph = build_graph(rows)
    if graph.number_of_nodes() == 0:
        raise ValueError("no individuals to draw")
    _order_rows(graph)
    ordered = nx.DiGraph()
    for node in sorted(graph.nodes, key=lambda n: (graph.nodes[n]["layer"], graph.nodes[n]["order"])):
        ordered.add_node(node, **graph.nodes[node])
    ordered.add_edges_from(graph.edges(data=True))
    pos = nx.multipartite_layout(ordered, subset_key="layer", align="horizontal", scale=1.0)
    pos = {n: (x, -y) for n, (x, y) in pos.items()}          # generation 0 at the top

    path = [str(i) for i in highlight]
    path_edges = set(zip(path, path[1:]))
    widest = max(sum(1 for _, d in graph.nodes(data=True) if d["layer"] == g)
                 for g in {d["layer"] for _, d in graph.nodes(data=True)})   # nodes in the widest row
    layers = len({d["layer"] for _, d in graph.nodes(data=True)})
    fig, ax = plt.subplots(figsize=(max(8.0, 1.6 * widest), max(4.0, 1.5 * layers + 1)))

    passed = [n for n in ordered if clean(ordered.nodes[n]["row"].get("status")) == "PASS"]
    failed = [n for n in ordered if n not in passed]
    speedups = [(_number(ordered.nodes[n]["row"].get("speedup_vs_reference")) or 0.0) for n in passed]
    nx.draw_networkx_nodes(ordered, pos, nodelist=failed, node_color="#d9d9d9", node_size=1200, ax=ax,
                           edgecolors="#9a9a9a")
    if passed:
        nodes = nx.draw_networkx_nodes(ordered, pos, nodelist=passed, node_color=speedups, cmap="viridis",
                                       node_size=1200, ax=ax, edgecolors="black")
        fig.colorbar(nodes, ax=ax, fraction=0.03, pad=0.01, label="speedup vs XLA reference")
    on_path = [n for n in path if n in ordered]
    nx.draw_networkx_nodes(ordered, pos, nodelist=on_path, node_color="none", node_size=1600, ax=ax,
                           edgecolors="red", linewidths=2.5)
    first = [(u, v) for u, v, d in ordered.edges(data=True) if d["rank"] == 0 and (u, v) not in path_edges]
    second = [(u, v) for u, v, d in ordered.edges(data=True) if d["rank"] > 0]
    nx.draw_networkx_edges(ordered, pos, edgelist=first, ax=ax, edge_color="#555555", arrows=True,
                           node_size=1200)
    nx.draw_networkx_edges(ordered, pos, edgelist=second, ax=ax, edge_color="#1f77b4", style="dashed",
                           arrows=True, node_size=1200)
    nx.draw_networkx_edges(ordered, pos, edgelist=sorted(path_edges & set(ordered.edges)), ax=ax,
                           edge_color="red", width=2.5, arrows=True, node_size=1200)
    nx.draw_networkx_labels(ordered, pos, labels={n: _label(ordered.nodes[n]["row"]) for n in ordered},
                            font_size=6, ax=ax)
    for layer in sorted({d["layer"] for _, d in ordered.nodes(data=True)}):
        y = next(pos[n][1] for n in ordered if ordered.nodes[n]["layer"] == layer)
        ax.annotate(f"depth {layer}", (0, y), xycoords=("axes fraction", "data"), fontsize=8, color="#666666")
    ax.set_title(f"{caption}\nred: seed -> champion; dashed blue: second parent of a crossover; "
                 "grey: did not pass; gN: the generation it was bred in", fontsize=8)
    ax.axis("off")
    fig.tight_layout()
    out = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):       # text stays text: searchable, smaller
        fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue()


def _label(row: dict[str, Any]) -> str:
    ind = f"{str(row['individual_id'])[:6]} g{int(clean(row.get('generation')) or 0)}"
    status = str(clean(row.get("status")) or "?")
    if status != "PASS":
        return f"{ind}\n{status}"
    speedup, latency = _number(row.get("speedup_vs_reference")), _number(row.get("latency_s"))
    return "\n".join(x for x in (ind, f"{speedup:.2f}x" if speedup else "",
                                 f"{latency * 1e6:.0f} us" if latency else "") if x)
