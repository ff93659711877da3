"""The frontier plot: every swept config by token-staleness p95 and efficiency,
coloured by waste, the Pareto set outlined, the user's config and the
recommended one marked (``asyncrl simulate --frontier``). Frontier points have
a black edge and a label; with three objectives they need not form a curve in
this projection."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from asyncrl.metrics.plots import _plt, _save


def plot_frontier(front: Any, out: Path, *, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))

    def xy(p: Any) -> tuple[float, float]:
        eff = p.result.efficiency
        return float(p.result.token_staleness_p95), 100 * (eff if math.isfinite(eff) else 0.0)

    points = front.points
    waste = [100 * p.result.waste_frac for p in points]
    xs, ys = zip(*(xy(p) for p in points))
    dots = ax.scatter(xs, ys, c=waste, cmap="viridis_r", vmin=0, vmax=max(max(waste), 1.0),
                      s=[60 if p.on_frontier else 22 for p in points],
                      edgecolors=["black" if p.on_frontier else "none" for p in points],
                      linewidths=0.8, zorder=3)
    fig.colorbar(dots, ax=ax, label="waste (% of groups evicted or aborted)")
    middle = (min(xs) + max(xs)) / 2
    for k, p in enumerate(front.frontier):
        x, y = xy(p)
        # Alternate above and below (neighbours on the frontier often sit close),
        # and write towards the middle so that no label leaves the axes.
        right = x > middle
        ax.annotate(p.candidate.label, (x, y), textcoords="offset points",
                    xytext=(-8 if right else 6, -10 if k % 2 else 5), fontsize=6.5,
                    color="#333333", ha="right" if right else "left")
    ux, uy = xy(front.user)
    ax.scatter([ux], [uy], marker="*", s=260, color="tab:red", edgecolors="black", zorder=4,
               label=f"your config: {front.user.candidate.label}")
    if not front.user.is_closest:
        cx, cy = xy(front.closest)
        ax.scatter([cx], [cy], marker="o", s=240, facecolors="none", edgecolors="tab:red",
                   linewidths=1.6, zorder=4, label=f"closest frontier: {front.closest.candidate.label}")
        ax.annotate("", (cx, cy), (ux, uy), arrowprops={"arrowstyle": "->", "color": "tab:red"})
    ax.set_xlabel("token-staleness p95 (versions)")
    ax.set_ylabel("efficiency (% of the physical bound)")
    ax.set_title(title or "frontier")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    return _save(fig, out)
