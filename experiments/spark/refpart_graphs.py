"""Do lowband's random k-regular graphs follow networkx's distribution (the authors' generator)?

    python experiments/spark/refpart_graphs.py

For M = 10 and M = 30 nodes, degree 5: draws graphs with lowband's generator
(``lowband.topology._random_regular_edges``) and with ``networkx.random_regular_graph`` (what
the NTK-DFL authors' ``fedlearning/topology.py`` calls each round) and compares two statistics
that matter to gossip: the number of triangles and the second-largest eigenvalue modulus of
the uniform mixing matrix ``(A + I) / (k + 1)`` (how fast averaging mixes). Prints each
mean ± std and the difference of the means in standard errors.
"""

from __future__ import annotations

import argparse

import networkx as nx
import numpy as np

from lowband.topology import _random_regular_edges


def statistics(g: nx.Graph, k: int) -> tuple[float, float]:
    """(triangles, second-largest |eigenvalue| of (A + I) / (k + 1))."""
    tri = sum(nx.triangles(g).values()) / 3
    a = nx.to_numpy_array(g, nodelist=range(g.number_of_nodes()))
    ev = np.sort(np.abs(np.linalg.eigvalsh((a + np.eye(len(a))) / (k + 1))))[::-1]
    return float(tri), float(ev[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=2000, help="graphs per generator and size")
    args = p.parse_args()
    for n, k in ((10, 5), (30, 5)):
        rng = np.random.default_rng(0)
        ours, theirs = [], []
        for i in range(args.draws):
            g = nx.Graph()
            g.add_nodes_from(range(n))
            g.add_edges_from(map(tuple, _random_regular_edges(n, k, rng)))
            ours.append(statistics(g, k))
            theirs.append(statistics(nx.random_regular_graph(k, n, seed=i), k))
        for j, name in enumerate(("triangles", "second eigenvalue of the mixing matrix")):
            a = np.array([s[j] for s in ours])
            b = np.array([s[j] for s in theirs])
            se = np.sqrt(a.var() / a.size + b.var() / b.size)
            print(f"M={n} k={k} {name}: lowband {a.mean():.4f} ± {a.std():.4f}, networkx {b.mean():.4f} ± "
                  f"{b.std():.4f}, difference {(a.mean() - b.mean()) / se:+.2f} standard errors")


if __name__ == "__main__":
    main()
