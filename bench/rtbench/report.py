"""nccl-tests style tables (and their parser), footers, JSON.

A table is one collective measured by one ringtree algorithm; its rows are
dtype x op x size. Columns are nccl-tests' own, then three per peer:
  time busbw ratio      ratio = ringtree busbw / peer busbw at the same size and the
                        peer's placement (= peer time / ringtree time); > 1: ringtree faster
Every table starts with a machine-readable line `# Table: key=value ...` so
parse_tables() (the bench tests, scripts reading saved output) can find the columns.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from .collectives import IP, OOP, bandwidths
from .verify import NCCL_TYPE_NAMES

PLACEMENT_TITLES = {OOP: "out-of-place", IP: "in-place"}


@dataclass
class Cell:
    """One implementation, one placement, one size: time over ranks, #wrong summed over ranks."""

    seconds: float | None = None
    wrong: int | None = None  # None when not checked (-c 0, or memcpy)
    na: str | None = None  # why it did not run
    factor: float | None = None  # busbw factor when not the collective's (memcpy: 1)

    @property
    def ran(self) -> bool:
        return self.na is None and self.seconds is not None


@dataclass
class Row:
    collective: str
    dtype: str
    op: str  # "none" for non-reductions
    root: int  # -1 for collectives without a root
    size: int
    count: int
    nranks: int
    factor: float
    cells: dict  # impl name -> {placement: Cell}

    def cell(self, impl: str, placement: str) -> Cell | None:
        return self.cells.get(impl, {}).get(placement)

    def factor_of(self, cell: Cell) -> float:
        return self.factor if cell.factor is None else cell.factor

    def bw(self, cell: Cell) -> tuple[float, float]:
        return bandwidths(self.size, cell.seconds, self.factor_of(cell)) if cell and cell.ran else (0.0, 0.0)


def format_time_us(seconds: float) -> str:
    us = seconds * 1e6
    # Three significant digits or more, as nccl-tests: fewer decimals as times grow.
    if us >= 10000:
        return f"{us:.0f}"
    if us >= 100:
        return f"{us:.1f}"
    return f"{us:.2f}"


_BASE_WIDTHS = (12, 12, 8, 6, 6)
_GROUP_WIDTHS = (8, 7, 7, 6)  # time algbw busbw #wrong
_PEER_WIDTHS = (8, 7, 6)  # time busbw ratio


def _join(fields, widths):
    return "".join(f"  {str(f):>{w}}" for f, w in zip(fields, widths))


def _group_fields(row: Row, cell: Cell | None, check: bool):
    if cell is None or not cell.ran:
        return ["n/a"] * 4
    algbw, busbw = row.bw(cell)
    wrong = "N/A" if (not check or cell.wrong is None) else str(cell.wrong)
    return [format_time_us(cell.seconds), f"{algbw:.2f}", f"{busbw:.2f}", wrong]


def peer_ratio(row: Row, subject: str, peer: str, peer_placement: str) -> float | None:
    """ringtree busbw / peer busbw; compares like with like (same placement) when possible."""
    pc = row.cell(peer, peer_placement)
    if pc is None or not pc.ran or pc.seconds <= 0:
        return None
    for placement in (peer_placement, OOP, IP):
        sc = row.cell(subject, placement)
        if sc is not None and sc.ran and sc.seconds > 0:
            ratio = pc.seconds / sc.seconds
            # busbw ratio = time ratio x factor ratio; a factor of 0 (one rank) compares times.
            if row.factor_of(sc) > 0 and row.factor_of(pc) > 0:
                ratio *= row.factor_of(sc) / row.factor_of(pc)
            return ratio
    return None


def _peer_fields(row: Row, subject: str, peer: str, placement: str):
    cell = row.cell(peer, placement)
    if cell is None or not cell.ran:
        return ["n/a"] * 3
    _, busbw = row.bw(cell)
    ratio = peer_ratio(row, subject, peer, placement)
    return [format_time_us(cell.seconds), f"{busbw:.2f}", "n/a" if ratio is None else f"{ratio:.2f}"]


def format_table(
    rows: list[Row], subject: str, peers: list[tuple[str, str]], check: bool, nranks: int
) -> tuple[list[str], float, int]:
    """Lines of one table, its average busbw and its #wrong total.

    peers: [(name, placement)] in column order.
    """
    coll = rows[0].collective if rows else "?"
    peer_names = ",".join(name for name, _ in peers) or "-"
    lines = [f"# Table: collective={coll} impl={subject} ranks={nranks} peers={peer_names}", "#"]
    base_w = sum(w + 2 for w in _BASE_WIDTHS)
    group_w = sum(w + 2 for w in _GROUP_WIDTHS)
    peer_w = sum(w + 2 for w in _PEER_WIDTHS)
    title = " " * (base_w - 1) + "".join(f"{PLACEMENT_TITLES[p]:^{group_w}}" for p in (OOP, IP))
    title += "".join(f"{name + ' (' + ('oop' if pl == OOP else 'in-place') + ')':^{peer_w}}" for name, pl in peers)
    lines.append("#" + title.rstrip())
    head = _join(("size", "count", "type", "redop", "root"), _BASE_WIDTHS)
    units = _join(("(B)", "(elements)", "", "", ""), _BASE_WIDTHS)
    for _ in (OOP, IP):
        head += _join(("time", "algbw", "busbw", "#wrong"), _GROUP_WIDTHS)
        units += _join(("(us)", "(GB/s)", "(GB/s)", ""), _GROUP_WIDTHS)
    for _ in peers:
        head += _join(("time", "busbw", "ratio"), _PEER_WIDTHS)
        units += _join(("(us)", "(GB/s)", "rt/x"), _PEER_WIDTHS)
    lines += ["#" + head[1:], "#" + units[1:].rstrip()]
    busbw_sum, busbw_count, wrong_total = 0.0, 0, 0
    for row in rows:
        fields = _join((row.size, row.count, NCCL_TYPE_NAMES[row.dtype], row.op, row.root), _BASE_WIDTHS)
        for placement in (OOP, IP):
            cell = row.cell(subject, placement)
            fields += _join(_group_fields(row, cell, check), _GROUP_WIDTHS)
            if cell is not None and cell.ran:
                busbw_sum += row.bw(cell)[1]
                busbw_count += 1
                wrong_total += cell.wrong or 0
        for name, placement in peers:
            fields += _join(_peer_fields(row, subject, name, placement), _PEER_WIDTHS)
        lines.append(fields)
    avg_busbw = busbw_sum / busbw_count if busbw_count else 0.0
    return lines, avg_busbw, wrong_total


def footer_lines(wrong_total: int, avg_busbw: float, check: bool) -> list[str]:
    status = "OK" if wrong_total == 0 else "FAILED"
    shown = wrong_total if check else "N/A"
    return [f"# Out of bounds values : {shown} {status}", f"# Avg bus bandwidth    : {avg_busbw:.6g}", "#"]


def parse_tables(text: str) -> list[dict]:
    """Tables printed by format_table: [{'meta': {...}, 'rows': [dict, ...]}].

    Row dicts: size, count, type, redop, root, then oop_/ip_ time, algbw, busbw, wrong,
    then <peer>_time, <peer>_busbw, <peer>_ratio. 'n/a' and 'N/A' are kept as strings.
    """
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("# Table:"):
            meta = dict(item.split("=", 1) for item in line[len("# Table:") :].split())
            meta["peers"] = [] if meta.get("peers", "-") == "-" else meta["peers"].split(",")
            current = {"meta": meta, "rows": []}
            tables.append(current)
            continue
        if current is None or not line.strip() or line.startswith("#"):
            if line.startswith("# Out of bounds values") and current is not None:
                current["meta"]["oob"] = line.split(":", 1)[1].split()
            if line.startswith("# Avg bus bandwidth") and current is not None:
                current["meta"]["avg_busbw"] = float(line.split(":", 1)[1])
            continue
        fields = line.split()
        keys = ["size", "count", "type", "redop", "root"]
        for p in ("oop", "ip"):
            keys += [f"{p}_time", f"{p}_algbw", f"{p}_busbw", f"{p}_wrong"]
        for peer in current["meta"]["peers"]:
            keys += [f"{peer}_time", f"{peer}_busbw", f"{peer}_ratio"]
        if len(fields) != len(keys):
            raise ValueError(f"row has {len(fields)} fields, expected {len(keys)}: {line!r}")
        row = {}
        for key, value in zip(keys, fields):
            row[key] = _number(value) if key not in ("type", "redop") else value
        current["rows"].append(row)
    return tables


def _number(text: str):
    if text in ("n/a", "N/A"):
        return text
    try:
        return int(text)
    except ValueError:
        return float(text)


def rows_to_json(rows: list[Row], header: dict) -> str:
    def cell_json(row, cell):
        d = asdict(cell)
        if cell.ran:
            algbw, busbw = row.bw(cell)
            d.update(time_us=cell.seconds * 1e6, algbw_GBps=algbw, busbw_GBps=busbw)
        return d

    out = []
    for row in rows:
        d = {k: v for k, v in asdict(row).items() if k != "cells"}
        d["cells"] = {impl: {pl: cell_json(row, c) for pl, c in by_pl.items()} for impl, by_pl in row.cells.items()}
        out.append(d)
    return json.dumps({"header": header, "results": out}, indent=1, default=_json_default)


def _json_default(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return str(obj)
