"""The dashboard's charts, SVG drawn on the server over one chart kit (:mod:`.kit`: the scales,
the plot area and its axes, the colours): :mod:`.curves` (learning curves), :mod:`.trend` (an
experiment's best per run), :mod:`.importances`, :mod:`.pareto`, :mod:`.coordinates` (parallel
coordinates and the slice plot), :mod:`.rungs` (ASHA's rungs) and :mod:`.lineage` (PBT's)."""
