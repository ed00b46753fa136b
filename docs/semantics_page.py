"""The manual's pictures of what each collective does to the ranks' buffers.

    python docs/semantics_page.py    # writes docs/semantics.md and docs/_static/semantics/*.svg

Each picture is data: the buffers of every rank before a call (small integers that say which rank
they came from: rank r's element k holds 10 r + k + 1) and after it. The buffers' sizes are the
core's (`ringtree.collective_info(name).buffer_sizes`); the values after are computed here from
the collective's definition. The tests check that the committed page and pictures are what this
prints, and that a real 3-rank run of each call, fed the "before" values, ends with the "after"
values (tests/docs/test_semantics_pictures.py), so a picture cannot disagree with the code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import ringtree as rt

P = 3  # ranks in every picture
N = 2  # the count: elements per rank's block
ROOT = 0
HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join("_static", "semantics")


@dataclass(frozen=True)
class Picture:
    name: str  # the collective, or "send_recv"
    call: str  # the call each rank makes, as on the page
    before: tuple  # per rank: the input buffer's values, or None where the rank passes none
    after: tuple  # per rank: the output buffer's values, or None where the rank gets none
    reduced: bool  # the outputs are sums (their cells take no one rank's colour)
    text: str  # one sentence under the picture
    send_counts: tuple = ()  # all_to_all_v: per rank, the elements it sends to each rank


def _values(rank: int, n: int) -> list:
    return [10 * rank + k + 1 for k in range(n)]


def _blocks(values: list, sizes) -> list:
    out, at = [], 0
    for n in sizes:
        out.append(values[at : at + n])
        at += n
    return out


def _sizes(name: str, rank: int) -> tuple:
    return rt.collective_info(name).buffer_sizes(N, P, rank == ROOT)


def _inputs(name: str) -> list:
    return [_values(r, _sizes(name, r)[0]) if _sizes(name, r)[0] else None for r in range(P)]


def _sum(rows) -> list:
    return [sum(column) for column in zip(*rows)]


def pictures() -> list:
    """Every picture of the page, in the page's order."""
    out = []

    x = _inputs("all_reduce")
    out.append(
        Picture(
            "all_reduce",
            "comm.all_reduce(x, out)",
            tuple(x),
            tuple([_sum(x)] * P),
            True,
            "Every rank ends with the element-wise reduction (here the sum) of every rank's input.",
        )
    )

    x = _inputs("reduce_scatter")
    total = _sum(x)
    out.append(
        Picture(
            "reduce_scatter",
            "comm.reduce_scatter(x, out)",
            tuple(x),
            tuple(_blocks(total, [N] * P)),
            True,
            f"The inputs hold {P} blocks of {N}; rank r gets the reduction of every rank's block r.",
        )
    )

    x = _inputs("all_gather")
    out.append(
        Picture(
            "all_gather",
            "comm.all_gather(x, out)",
            tuple(x),
            tuple([sum(x, [])] * P),
            False,
            "Every rank ends with every rank's input, block r from rank r.",
        )
    )

    x = _inputs("all_to_all")
    blocks = [_blocks(row, [N] * P) for row in x]
    out.append(
        Picture(
            "all_to_all",
            "comm.all_to_all(x, out)",
            tuple(x),
            tuple(sum((blocks[i][j] for i in range(P)), []) for j in range(P)),
            False,
            "Block j of rank i's input lands in block i of rank j's output: a transpose of blocks.",
        )
    )

    counts = tuple(tuple(1 + (i + j) % 2 for j in range(P)) for i in range(P))
    x = [_values(i, sum(counts[i])) for i in range(P)]
    blocks = [_blocks(x[i], counts[i]) for i in range(P)]
    out.append(
        Picture(
            "all_to_all_v",
            "comm.all_to_all_v(x, out, send_counts, recv_counts)",
            tuple(x),
            tuple(sum((blocks[i][j] for i in range(P)), []) for j in range(P)),
            False,
            "As all_to_all, with a size per pair: rank i sends send_counts[j] elements to rank j, "
            "which receives them as its recv_counts[i]. Here rank i sends 1 + (i + j) % 2 to rank j.",
            counts,
        )
    )

    x = _inputs("broadcast")
    out.append(
        Picture(
            "broadcast",
            "comm.broadcast(x, root=0)",
            tuple(x),
            tuple([x[ROOT]] * P),
            False,
            "One buffer per rank: every rank's x is overwritten with the root's.",
        )
    )

    x = _inputs("reduce")
    out.append(
        Picture(
            "reduce",
            "comm.reduce(x, out, root=0)",
            tuple(x),
            tuple(_sum(x) if r == ROOT else None for r in range(P)),
            True,
            "The root gets the reduction of every rank's input; the other ranks pass no output.",
        )
    )

    x = _inputs("gather")
    out.append(
        Picture(
            "gather",
            "comm.gather(x, out, root=0)",
            tuple(x),
            tuple(sum(x, []) if r == ROOT else None for r in range(P)),
            False,
            "The root gets every rank's input, block r from rank r; only the root passes an output.",
        )
    )

    x = _inputs("scatter")
    out.append(
        Picture(
            "scatter",
            "comm.scatter(x, out, root=0)",
            tuple(x),
            tuple(_blocks(x[ROOT], [N] * P)),
            False,
            "Rank r gets block r of the root's input; only the root passes an input.",
        )
    )

    x = [_values(0, N), None, None]
    out.append(
        Picture(
            "send_recv",
            "comm.send(x, 1) on rank 0; comm.recv(out, 0) on rank 1",
            tuple(x),
            (None, list(x[0]), None),
            False,
            "A message between two ranks; the others take no part.",
        )
    )

    x = [_values(r, N) for r in range(P)]
    out.append(
        Picture(
            "sendrecv",
            "comm.sendrecv(x, (r + 1) % P, out, (r - 1) % P)",
            tuple(x),
            tuple(x[(r - 1) % P] for r in range(P)),
            False,
            "Each rank sends to one peer and receives from another at once: here a shift around the ring.",
        )
    )
    return out


# --- the SVG ---------------------------------------------------------------------------------

CELL_W, CELL_H, LABEL_W, GAP, PAD, HEAD = 34, 24, 58, 56, 10, 22
# One colour per rank (the rank whose input a value comes from), and one for reductions.
RANK_COLOURS = ("#cfe2f3", "#d9ead3", "#fce5cd", "#ead1dc")
REDUCED_COLOUR = "#e6e6e6"


def _origin(value: int) -> int:
    return (value - 1) // 10


def _blocks_of(pic: Picture, r: int, side: int) -> list:
    """The block sizes of rank r's input (side 0) or output (side 1): a bold line between
    blocks shows which rank each block belongs to."""
    values = (pic.before, pic.after)[side][r]
    if not values:
        return []
    if pic.send_counts:  # all_to_all_v: rank r's sends, or what each rank sends it
        return list(pic.send_counts[r]) if side == 0 else [pic.send_counts[i][r] for i in range(P)]
    return [N] * P if len(values) == N * P else [len(values)]


def _cells(values, x0: float, y: float, reduced: bool, blocks=()) -> list:
    if values is None:
        return [f'<text x="{x0 + 4}" y="{y + 16}" class="none">no buffer</text>']
    if not values:
        return [f'<text x="{x0 + 4}" y="{y + 16}" class="none">empty</text>']
    parts = []
    for k, v in enumerate(values):
        fill = REDUCED_COLOUR if reduced else RANK_COLOURS[_origin(v) % len(RANK_COLOURS)]
        x = x0 + k * CELL_W
        parts.append(f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{fill}" stroke="#555"/>')
        parts.append(f'<text x="{x + CELL_W / 2}" y="{y + 16}" class="v">{v}</text>')
    at = 0
    for n in list(blocks)[:-1]:
        at += n
        x = x0 + at * CELL_W
        parts.append(f'<path d="M{x} {y - 3} v{CELL_H + 6}" stroke="#000" stroke-width="3"/>')
    return parts


def svg(pic: Picture) -> str:
    """The picture as a standalone SVG: a row per rank, its buffer before the call on the left and
    after it on the right; each value is coloured by the rank it started on (reductions grey),
    and bold lines part a buffer's per-rank blocks."""
    width_in = max([len(v) for v in pic.before if v] + [3]) * CELL_W
    width_out = max([len(v) for v in pic.after if v] + [3]) * CELL_W
    x_in = PAD + LABEL_W
    x_out = x_in + width_in + GAP
    width = x_out + width_out + PAD
    height = HEAD + P * (CELL_H + 8) + PAD
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">',
        "<style>.v{text-anchor:middle}.h{font-weight:bold}.none{fill:#888;font-style:italic}</style>",
        '<rect width="100%" height="100%" fill="#fff"/>',  # readable on a dark theme too
        f"<title>{pic.name}: {pic.call}</title>",
        f'<text x="{x_in}" y="15" class="h">before: input</text>',
        f'<text x="{x_out}" y="15" class="h">after: output</text>',
    ]
    for r in range(P):
        y = HEAD + r * (CELL_H + 8)
        label = f"rank {r}" + ("*" if r == ROOT and "root" in pic.call else "")
        parts.append(f'<text x="{PAD}" y="{y + 16}">{label}</text>')
        parts += _cells(pic.before[r], x_in, y, False, _blocks_of(pic, r, 0))
        mid = y + CELL_H / 2
        parts.append(
            f'<path d="M{x_in + width_in + 12} {mid} h{GAP - 24} l-6 -4 m6 4 l-6 4" stroke="#555" fill="none"/>'
        )
        parts += _cells(pic.after[r], x_out, y, pic.reduced, _blocks_of(pic, r, 1))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --- the page --------------------------------------------------------------------------------

TITLES = {
    "all_reduce": "AllReduce",
    "reduce_scatter": "ReduceScatter",
    "all_gather": "AllGather",
    "all_to_all": "AllToAll",
    "all_to_all_v": "AllToAllv",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "gather": "Gather",
    "scatter": "Scatter",
    "send_recv": "Send and receive",
    "sendrecv": "SendRecv",
}


def page() -> str:
    lines = [
        "# What each collective does",
        "",
        "<!-- Generated by docs/semantics_page.py; edit the script, not this page. -->",
        "",
        f"Each picture shows {P} ranks' buffers before a call and after it, with a count of {N}.",
        "Rank r's input starts as `10 r + 1, 10 r + 2, ...`, so a value says where it came from,",
        "and its colour is that rank's; reduced values (sums here; any reduce op works the same",
        "way) are grey. Bold lines part a buffer's blocks, block r being rank r's. The root, where",
        'there is one, is rank 0 (marked `*`). "no buffer" means the rank passes none (`None`,',
        "or nothing). The sizes are the ones",
        "`rt.collective_info(name).buffer_sizes(count, P)` reports",
        "({py:func}`ringtree.collective_info`), and the tests run every call on 3 ranks with these",
        "inputs and compare the outputs with the pictures.",
        "",
        "Buffers are flat: shapes are ignored and counts are in elements. The count a call is",
        "checked against is one rank's block (N) for the blocked collectives: reduce_scatter's",
        "input, all_gather's and gather's output, all_to_all's buffers and scatter's input hold",
        "N x P elements, block r being rank r's.",
        "",
    ]
    for pic in pictures():
        info = None if pic.name == "send_recv" else rt.collective_info(pic.name)
        lines += [f"## {TITLES[pic.name]}", "", f"`{pic.call}`", ""]
        lines += [f"![{pic.name}: buffers before and after]({FOLDER}/{pic.name}.svg)", ""]
        sizes = ""
        if info is not None and info.name != "all_to_all_v":
            (i0, o0), (i1, o1) = info.buffer_sizes(N, P, True), info.buffer_sizes(N, P, False)
            if info.rooted:
                sizes = f" Elements per rank (input, output): root ({i0}, {o0}), others ({i1}, {o1})."
            else:
                sizes = f" Elements per rank (input, output): ({i0}, {o0})."
        lines += [pic.text + sizes, ""]
    lines += [
        "## Barrier",
        "",
        "`comm.barrier()` moves no data: it returns on a rank once every rank has entered it.",
        "",
    ]
    return "\n".join(lines)


def write(root: str = HERE) -> list:
    """Writes the page and its pictures under `root` (the docs folder); returns their paths."""
    os.makedirs(os.path.join(root, FOLDER), exist_ok=True)
    written = []
    for pic in pictures():
        path = os.path.join(root, FOLDER, f"{pic.name}.svg")
        with open(path, "w") as f:
            f.write(svg(pic))
        written.append(path)
    path = os.path.join(root, "semantics.md")
    with open(path, "w") as f:
        f.write(page())
    return written + [path]


if __name__ == "__main__":
    for path in write():
        sys.stdout.write(f"{os.path.relpath(path)}\n")
