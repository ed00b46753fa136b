"""The harness's contract with rank bodies (support/harness.py): a test passes the function
itself, the ranks find it by its module file and qualified name, and anything the ranks could not
find is refused in the test, before any process starts."""

import os

import pytest
from harness import rank_command, rank_target, run_world


def top_level_body(x=1):
    return {"x": x}


class Bodies:
    @staticmethod
    def nested(x=1):
        return {"x": x}


def test_a_top_level_function_is_found_by_its_file_and_name():
    path, qualname = rank_target(top_level_body)
    assert path == os.path.abspath(__file__) and qualname == "top_level_body"
    assert rank_target(Bodies.nested)[1] == "Bodies.nested"
    command = rank_command(top_level_body, dict(x=2))
    assert command[1].endswith(os.path.join("support", "rank_worker.py"))
    assert command[2:] == [os.path.abspath(__file__), "top_level_body", '{"x": 2}']


def test_what_a_rank_could_not_find_is_refused_before_any_process_starts():
    def local_body():
        return {}

    with pytest.raises(TypeError, match="must be a function"):
        run_world(2, "top_level_body")  # the old addressing by name
    with pytest.raises(TypeError, match="top level of a module file"):
        run_world(2, local_body)
    with pytest.raises(TypeError, match="top level of a module file"):
        run_world(2, lambda: {})
