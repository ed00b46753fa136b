"""busbw against size, one panel per collective, one line per ringtree algorithm and
per peer (out-of-place where measured, else in place), log-log axes."""

from __future__ import annotations

import math

from .collectives import IP, OOP


def series(rows, impl: str, collective: str, dtype: str, op: str):
    """[(size, busbw)] of impl's ran cells, preferring out-of-place, sizes > 0."""
    points = []
    for row in rows:
        if (row.collective, row.dtype, row.op) != (collective, dtype, op) or row.size <= 0:
            continue
        for placement in (OOP, IP):
            cell = row.cell(impl, placement)
            if cell is not None and cell.ran and cell.seconds > 0:
                points.append((row.size, row.bw(cell)[1]))
                break
    return points


def plot_rows(rows, subjects, peers, path, nranks):
    import matplotlib

    matplotlib.use("Agg")  # no display on benchmark hosts
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(row.collective for row in rows))
    if not panels:
        return
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    # One colour per implementation across all panels.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {impl: palette[i % len(palette)] for i, impl in enumerate(subjects + peers)}
    for ax, collective in zip(axes.flat, panels):
        first = next(r for r in rows if r.collective == collective)
        # One dtype/op per panel: the first measured (float32 sum unless -d/-o say otherwise).
        for impl in subjects + peers:
            pts = series(rows, impl, collective, first.dtype, first.op)
            if not pts:
                continue
            sizes, bw = zip(*pts)
            style = "-o" if impl.startswith("ringtree") else "--s"
            ax.plot(sizes, [max(b, 1e-6) for b in bw], style, markersize=3, label=impl, color=colours[impl])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{collective} ({first.dtype} {first.op}, P={nranks})", fontsize=10)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
