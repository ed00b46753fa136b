"""Bench driver: command-line parsing (nccl-tests flags) and size lists."""

import pytest

from rtbench import options


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0", 0),
        ("8", 8),
        ("1K", 1024),
        ("1k", 1024),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("1.5K", 1536),
        ("2KB", 2048),
        ("4MiB", 4 << 20),
        (" 16 ", 16),
    ],
)
def test_parse_size_units(text, expected):
    assert options.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "-1", "1T", "12Q", "one"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        options.parse_size(text)


def test_size_list_factor():
    assert options.size_list(8, 128, factor=2) == [8, 16, 32, 64, 128]
    assert options.size_list(8, 100, factor=4) == [8, 32]
    assert options.size_list(0, 4, factor=2) == [0, 1, 2, 4]


def test_size_list_increment():
    assert options.size_list(1024, 4096, step=1024) == [1024, 2048, 3072, 4096]
    assert options.size_list(5, 5, step=1) == [5]


def test_size_list_rejects_bad_ranges():
    with pytest.raises(ValueError):
        options.size_list(64, 8, factor=2)
    with pytest.raises(ValueError):
        options.size_list(8, 64, factor=1, step=0)


def test_defaults_match_nccl_tests():
    o = options.parse_args([])
    assert o.sizes == [32 << 20]
    assert (o.iters, o.warmup, o.check, o.ops, o.root) == (20, 5, True, ["sum"], 0)
    assert o.dtypes == ["float32"] and o.algos == ["auto"] and o.collectives == ["all_reduce"]
    assert o.average == 3 and o.peers == [] and o.device == "cpu" and not o.inject_error


def test_nccl_tests_flags():
    o = options.parse_args("-b 8 -e 1M -f 2 -n 7 -w 3 -c 0 -o max -d half -r 1 -a 1 -J x.json -T 30".split())
    assert o.sizes[0] == 8 and o.sizes[-1] == 1 << 20 and len(o.sizes) == 18
    assert (o.iters, o.warmup, o.check, o.ops, o.dtypes, o.root, o.average) == (7, 3, False, ["max"], ["float16"], 1, 1)
    assert o.json_path == "x.json" and o.timeout == 30


def test_increment_flag():
    o = options.parse_args("-b 1K -e 4K -i 1K".split())
    assert o.sizes == [1024, 2048, 3072, 4096]


def test_factor_and_increment_together_rejected(capsys):
    with pytest.raises(SystemExit):
        options.parse_args("-b 8 -e 64 -f 2 -i 8".split())
    assert "not both" in capsys.readouterr().err


def test_all_expands():
    o = options.parse_args("-o all -d all --algo all --collective all --vs all".split())
    assert o.ops == list(options.REDUCE_OPS)
    assert o.dtypes == list(options.DTYPES)
    assert o.algos == ["ring", "tree", "direct", "oneshot", "hier", "hier_tree", "rank_order", "auto"]
    assert o.collectives == list(options.COLLECTIVES)
    assert o.peers == list(options.PEERS)


def test_lists_aliases_and_spellings():
    o = options.parse_args(
        ["-d", "float,double,bf16", "--collective", "allreduce,all-gather,send_recv", "--vs", "gloo,mpi"]
    )
    assert o.dtypes == ["float32", "float64", "bfloat16"]
    assert o.collectives == ["all_reduce", "all_gather", "sendrecv"]
    assert o.peers == ["gloo", "mpi"]


@pytest.mark.parametrize(
    "argv",
    [
        ["-o", "xor"],
        ["-d", "complex32"],
        ["--algo", "butterfly"],
        ["--collective", "allreduce2"],
        ["--vs", "ucc"],
        ["-n", "0"],
        ["-a", "4"],
        ["-b", "1M", "-e", "1K"],
        ["--device", "tpu"],
        ["--coalesced"],
        ["--group", "4", "--coalesced", "--persistent"],
    ],
)
def test_bad_values_rejected(argv):
    with pytest.raises(SystemExit):
        options.parse_args(argv)


def test_hidden_inject_error_flag():
    assert options.parse_args(["--inject-error"]).inject_error
    assert "inject" not in options.build_parser().format_help()
