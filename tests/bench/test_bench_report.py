"""Bench driver: nccl-tests table formatting, its parser, ratios, footers, JSON."""

import json

import pytest

from rtbench import collectives as colls
from rtbench import report
from rtbench.report import Cell, Row


def make_row(size=1 << 20, rt_oop=1e-3, rt_ip=2e-3, peer=4e-3, wrong=0, nranks=4):
    c = colls.get("all_reduce")
    return Row(
        collective="all_reduce",
        dtype="float32",
        op="sum",
        root=-1,
        size=size,
        count=size // 4,
        nranks=nranks,
        factor=c.busbw_factor(nranks),
        cells={
            "ringtree:ring": {"oop": Cell(rt_oop, wrong), "ip": Cell(rt_ip, 0)},
            "gloo": {"ip": Cell(peer, 0)},
            "mpi": {"oop": Cell(na="this MPI has no bfloat16 datatype")},
            "memcpy": {"oop": Cell(1e-4, factor=1.0)},
        },
    )


def test_time_format_keeps_three_digits():
    assert report.format_time_us(12.25e-6) == "12.25"
    assert report.format_time_us(123.25e-6) == "123.2"
    assert report.format_time_us(0.0123) == "12300"


def test_table_roundtrip_and_arithmetic():
    rows = [make_row(), make_row(size=8, rt_oop=1e-5, rt_ip=1e-5, peer=2e-5)]
    peers = [("mpi", "oop"), ("gloo", "ip"), ("memcpy", "oop")]
    lines, avg, wrong = report.format_table(rows, "ringtree:ring", peers, True, 4)
    text = "\n".join(lines + report.footer_lines(wrong, avg, True))
    (table,) = report.parse_tables(text)
    assert table["meta"]["collective"] == "all_reduce" and table["meta"]["impl"] == "ringtree:ring"
    assert table["meta"]["peers"] == ["mpi", "gloo", "memcpy"]
    assert table["meta"]["oob"] == ["0", "OK"]
    r = table["rows"][0]
    assert (r["size"], r["count"], r["type"], r["redop"], r["root"]) == (1 << 20, 1 << 18, "float", "sum", -1)
    # algbw = 1 MiB / 1 ms; busbw = algbw * 2(P-1)/P = 1.5 algbw for P = 4.
    assert r["oop_time"] == pytest.approx(1000.0)
    assert r["oop_algbw"] == pytest.approx(1.05, abs=0.01)
    assert r["oop_busbw"] == pytest.approx(1.57, abs=0.01)
    assert r["ip_busbw"] == pytest.approx(0.79, abs=0.01)
    assert r["oop_wrong"] == 0
    # Gloo ran in place: the ratio compares it with ringtree in place (4 ms / 2 ms).
    assert r["gloo_ratio"] == pytest.approx(2.0)
    assert r["mpi_time"] == "n/a" and r["mpi_ratio"] == "n/a"
    # memcpy's busbw is its algbw (factor 1), the ratio is of busbw.
    assert r["memcpy_busbw"] == pytest.approx(10.49, abs=0.01)
    assert r["memcpy_ratio"] == pytest.approx(1.57 / 10.49, abs=0.01)
    assert avg == pytest.approx(
        sum(report.Row.bw(row, c)[1] for row in rows for c in row.cells["ringtree:ring"].values()) / 4
    )


def test_wrong_results_fail_the_footer():
    lines, avg, wrong = report.format_table([make_row(wrong=3)], "ringtree:ring", [], True, 4)
    assert wrong == 3
    footer = report.footer_lines(wrong, avg, True)
    assert footer[0] == "# Out of bounds values : 3 FAILED"
    assert footer[1].startswith("# Avg bus bandwidth    : ")
    (table,) = report.parse_tables("\n".join(lines + footer))
    assert table["rows"][0]["oop_wrong"] == 3


def test_unchecked_prints_na():
    lines, avg, wrong = report.format_table([make_row()], "ringtree:ring", [], False, 4)
    (table,) = report.parse_tables("\n".join(lines))
    assert table["rows"][0]["oop_wrong"] == "N/A"
    assert report.footer_lines(0, avg, False)[0] == "# Out of bounds values : N/A OK"


def test_ratio_with_one_rank_compares_times():
    row = make_row(nranks=1)
    assert row.factor == 0
    assert report.peer_ratio(row, "ringtree:ring", "gloo", "ip") == pytest.approx(2.0)


def test_parser_rejects_misaligned_rows():
    lines, _, _ = report.format_table([make_row()], "ringtree:ring", [("gloo", "ip")], True, 4)
    lines[-1] += " 7"
    with pytest.raises(ValueError):
        report.parse_tables("\n".join(lines))


def test_json_has_bandwidths():
    doc = json.loads(report.rows_to_json([make_row()], {"nranks": 4}))
    cell = doc["results"][0]["cells"]["ringtree:ring"]["oop"]
    assert cell["time_us"] == pytest.approx(1000.0) and cell["busbw_GBps"] == pytest.approx(1.5729, abs=1e-3)
    assert doc["results"][0]["cells"]["mpi"]["oop"]["na"].startswith("this MPI")
