"""Could Ray ever place a trial's bundles on the cluster's nodes? Ray's four placement strategies
as one rule over each node's total resources, and why not in one clause that names the fix.

Ray itself never refuses a placement group it cannot place: the group waits, and so would the
trial, for good. This rule is what the cluster check (``execution/driver/cluster.py``) asks before
a trial starts, so that such a trial is refused instead, naming the bundle or the strategy.

- one bundle, or ``STRICT_PACK``: one node must hold the sum;
- ``STRICT_SPREAD``: each bundle needs a node of its own that holds it;
- ``PACK`` and ``SPREAD`` (best effort): each bundle must fit on some node, and all of them on the
  nodes together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from airflow_trials.core.resources import Resources

#: How many placements the search for PACK and SPREAD tries before it stops deciding and leaves
#: the group to Ray (which waits rather than refuses): a refusal must be sure.
SEARCH_BUDGET = 2_000
#: Above this many bundles the search is not tried (its depth is the number of bundles).
SEARCH_MAX_BUNDLES = 256


def placement_refusal(request: Resources, nodes: Sequence[Resources]) -> str | None:
    """None when Ray could place ``request``'s placement group on ``nodes`` (each node's total
    resources) with nothing else running; otherwise why it never could, as a clause that names the
    fix, e.g. ``"no node of the Ray cluster holds its bundle 1 (4 GPU) (nodes: 2 x [2 GPU]); ..."``.
    """
    bundles = request.placed_bundles()
    if not bundles:
        return None
    shown = _nodes_string(request, nodes)
    if len(bundles) == 1 or request.strategy == "STRICT_PACK":
        if any(request.fits_in(node) for node in nodes):
            return None
        if len(bundles) == 1:
            return (
                f"no node of the Ray cluster holds it ({shown}); lower it or add a node that does"
            )
        return (
            f"STRICT_PACK puts all its bundles on one node and no node of the Ray cluster holds "
            f"them ({shown}); use strategy PACK, lower the bundles, or add a node that holds them"
        )
    first = 1 if request.head_bundle_is_empty else 0  # the user's numbering of the bundles
    for i, bundle in enumerate(bundles):
        if not any(bundle.fits_in(node) for node in nodes):
            return (
                f"no node of the Ray cluster holds its bundle {i + first} "
                f"({_amounts(bundle, bundle)}) ({shown}); lower or split that bundle, or add a "
                f"node that holds it"
            )
    if request.strategy == "STRICT_SPREAD":
        if len(bundles) > len(nodes) or not _one_node_each(bundles, nodes):
            return (
                f"STRICT_SPREAD puts each of its {len(bundles)} bundles on a node of its own and "
                f"no {len(bundles)} nodes of the Ray cluster hold one each ({shown}); use strategy "
                f"SPREAD or PACK, fewer bundles, or add nodes"
            )
        return None
    if _packs(bundles, nodes) is False:
        return (
            f"its bundles fit on the Ray cluster's nodes one by one but not all together "
            f"({shown}); lower the bundles or add a node"
        )
    return None


def _one_node_each(bundles: Sequence[Resources], nodes: Sequence[Resources]) -> bool:
    """Can each bundle have a node of its own that holds it? (A bipartite matching, Kuhn's.)"""
    fits = [[bundle.fits_in(node) for node in nodes] for bundle in bundles]
    owner: dict[int, int] = {}  # node -> the bundle on it

    def assign(b: int, seen: set[int]) -> bool:
        for n, holds in enumerate(fits[b]):
            if holds and n not in seen:
                seen.add(n)
                if n not in owner or assign(owner[n], seen):
                    owner[n] = b
                    return True
        return False

    return all(assign(b, set()) for b in range(len(bundles)))


def _packs(bundles: Sequence[Resources], nodes: Sequence[Resources]) -> bool | None:
    """Do all the bundles fit on the nodes together (several to a node)? None when the search
    ran out of its budget, or was not tried: undecided."""
    if len(bundles) > SEARCH_MAX_BUNDLES:
        return None
    order = sorted(bundles, key=lambda b: (b.gpu, b.cpu, b.memory), reverse=True)
    free = list(nodes)
    tries = 0

    def place(i: int, first_node: int) -> bool | None:
        nonlocal tries
        if i == len(order):
            return True
        tried: set[Resources] = set()
        for n in range(first_node, len(free)):
            room = free[n]
            if room in tried or not order[i].fits_in(room):
                continue  # a node like one tried already gives the same answer
            tried.add(room)
            tries += 1
            if tries > SEARCH_BUDGET:
                return None
            free[n] = room - order[i]
            # Alike bundles go to nodes in order: their other orders are the same placements.
            alike = i + 1 < len(order) and order[i + 1] == order[i]
            placed = place(i + 1, n if alike else 0)
            free[n] = room
            if placed is not False:
                return placed
        return False

    return place(0, 0)


def _nodes_string(request: Resources, nodes: Sequence[Resources]) -> str:
    """The nodes, in the resources ``request`` asks for, alike ones counted:
    ``nodes: 2 x [2 CPU, 2 GPU], 1 x [4 CPU, 0 GPU]``."""
    if not nodes:
        return "it has no node"
    counts = Counter(_amounts(node, request) for node in nodes)
    return "nodes: " + ", ".join(f"{count} x [{shape}]" for shape, count in counts.items())


def _amounts(amount: Resources, asked: Resources) -> str:
    """``amount`` in the resources ``asked`` asks for (``2 CPU, 1 GPU``)."""
    names = Resources.to_ray_bundle(asked)
    have = Resources.to_ray_bundle(amount)
    return ", ".join(
        f"{have.get(k, 0) / 2**30:g} GiB memory" if k == "memory" else f"{have.get(k, 0):g} {k}"
        for k in names
    )
