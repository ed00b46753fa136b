"""Tables and a plot from launch_spread.py --sweep results: ringtree / best peer by size, one column
(or one line) per run, so THP settings and background load can be read side by side.

    python bench/launch_spread_report.py madvise=a.json never=b.json load2=c.json \
        [--plot ratios.png] [--markdown]

Each LABEL=FILE is one sweep's JSON (-J). A ratio above 1 means ringtree was faster than the best
of the peers measured in that same run; bold (markdown) or '<' marks a ratio below 1."""
import argparse
import json
import math

COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast"]


def size_text(n):
    if n == 0:
        return "0 B (count 0)"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def load_runs(specs):
    """[(label, {(P, collective, size): cell})] from LABEL=FILE arguments."""
    runs = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"expected LABEL=FILE, got {spec!r}")
        with open(path) as f:
            data = json.load(f)
        cells = {}
        for p_key, per_collective in data["ratios"].items():
            for collective, rows in per_collective.items():
                for row in rows:
                    cells[(int(p_key.lstrip("P")), collective, row["size"])] = row
        runs.append((label, cells))
    return runs


def cell_text(row, markdown):
    if row is None or row.get("ratio") is None:
        return "n/a"
    ratio = row["ratio"]
    text = f"{ratio:.2f}"
    if ratio < 1:
        text = f"**{text}**" if markdown else f"<{text}"
    return text


def print_tables(runs, markdown):
    labels = [label for label, _ in runs]
    keys = set().union(*(cells.keys() for _, cells in runs))
    for nranks in sorted({k[0] for k in keys}):
        for collective in COLLECTIVES:
            sizes = sorted({k[2] for k in keys if k[0] == nranks and k[1] == collective})
            if not sizes:
                continue
            title = f"P={nranks} {collective}: ringtree / best peer, and ringtree's time (us)"
            if markdown:
                print(f"\n{title}\n")
                print("| size | " + " | ".join(labels) + " |")
                print("|---:|" + "---|" * len(labels))
            else:
                print(f"# {title}")
                print(f"# {'size':>10} " + " ".join(f"{label:>22}" for label in labels))
            for size in sizes:
                texts = []
                for _, cells in runs:
                    row = cells.get((nranks, collective, size))
                    us = row["median_s"]["ringtree"] * 1e6 if row else float("nan")
                    texts.append(f"{cell_text(row, markdown)} ({us:.1f})" if row else "n/a")
                if markdown:
                    print(f"| {size_text(size)} | " + " | ".join(texts) + " |")
                else:
                    print(f"  {size:>10} " + " ".join(f"{t:>22}" for t in texts))


def print_compact(runs):
    """One markdown table per P: a row per size, a column per collective, each cell the runs'
    ratios in the order given, separated by ' / '."""
    labels = " / ".join(label for label, _ in runs)
    keys = set().union(*(cells.keys() for _, cells in runs))
    for nranks in sorted({k[0] for k in keys}):
        print(f"\nP={nranks}: ringtree / best peer ({labels}); bold: below 1\n")
        print("| size | " + " | ".join(COLLECTIVES) + " |")
        print("|---:|" + "---|" * len(COLLECTIVES))
        sizes = sorted({k[2] for k in keys if k[0] == nranks})
        for size in sizes:
            row = []
            for collective in COLLECTIVES:
                texts = [cell_text(cells.get((nranks, collective, size)), True) for _, cells in runs]
                row.append(" / ".join(texts) if any(t != "n/a" for t in texts) else "")
            print(f"| {size_text(size)} | " + " | ".join(row) + " |")


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.ticker
    import matplotlib.pyplot as plt

    keys = set().union(*(cells.keys() for _, cells in runs))
    ranks = sorted({k[0] for k in keys})
    fig, axes = plt.subplots(len(ranks), len(COLLECTIVES), figsize=(4 * len(COLLECTIVES), 3.3 * len(ranks)),
                             squeeze=False, sharey=True)
    for i, nranks in enumerate(ranks):
        for j, collective in enumerate(COLLECTIVES):
            ax = axes[i][j]
            for label, cells in runs:
                points = sorted((k[2], row["ratio"]) for k, row in cells.items()
                                if k[0] == nranks and k[1] == collective and row.get("ratio"))
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, label=label)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.set_title(f"P={nranks} {collective}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(ranks) - 1:
                ax.set_xlabel("bytes")
            if j == 0:
                ax.set_ylabel("ringtree / best peer")
    legend = {}
    for row_axes in axes:
        for ax in row_axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend.keys()), loc="upper center", ncol=max(1, len(legend)))
    ymin = min((row["ratio"] for _, c in runs for row in c.values() if row.get("ratio")), default=0.5)
    for row_axes in axes:
        for ax in row_axes:
            ax.set_ylim(2 ** math.floor(math.log2(min(ymin, 0.5))), None)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=90)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=FILE")
    p.add_argument("--plot", metavar="PNG")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--compact", action="store_true", help="one markdown table per P, every run in each cell")
    args = p.parse_args()
    runs = load_runs(args.runs)
    if args.compact:
        print_compact(runs)
    else:
        print_tables(runs, args.markdown)
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
