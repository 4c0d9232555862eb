"""Combining the response parameters of a request whose rows ran in several batches."""

from __future__ import annotations

from adaserve.adaptive.responses import combine

BLOCKS = ["stem", "stage1", "stage2", "head"]


def test_one_part_is_the_request() -> None:
    values = {"exit_block": "stage1", "exited_rows": 3, "other": "x"}
    assert combine([(3, values)], BLOCKS) == values


def test_rows_the_caches_answered_add_up_and_a_row_that_ran_whole_names_the_last_block() -> None:
    parts = [(4, {"exit_block": "stage1", "exited_rows": 4}), (3, {"exit_block": "head", "exited_rows": 1})]
    assert combine(parts, BLOCKS) == {"exit_block": "head", "exited_rows": 5}
    # the order of the parts does not matter
    assert combine(parts[::-1], BLOCKS) == {"exit_block": "head", "exited_rows": 5}


def test_parts_that_all_exited_name_the_deepest_exit() -> None:
    parts = [(2, {"exit_block": "stage2", "exited_rows": 2}), (1, {"exit_block": "stem", "exited_rows": 1})]
    assert combine(parts, BLOCKS) == {"exit_block": "stage2", "exited_rows": 3}
    assert combine(parts[::-1], BLOCKS)["exit_block"] == "stage2"


def test_slo_means_are_over_the_rows() -> None:
    parts = [(3, {"mode": "lcao", "k": 0.5, "interference": 0.2}), (1, {"mode": "lcao", "k": 1.0, "interference": 1.0})]
    assert combine(parts, []) == {"mode": "lcao", "k": 0.625, "interference": 0.4}


def test_parts_without_parameters_give_none() -> None:
    assert combine([], []) == {}
    assert combine([(2, {}), (1, {})], []) == {}
