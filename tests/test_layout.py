"""Layout math against Megatron-Core's documented RankGenerator behaviour."""

from __future__ import annotations

import pytest

from traceana.errors import TraceanaError
from traceana.layout import Layout, dim_from_name


def test_megatron_docstring_example_tp2_pp4_world16() -> None:
    # initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 (so dp=2).
    layout = Layout.parse("tp=2,pp=4,dp=2,order=tp-cp-ep-dp-pp")
    groups = layout.groups
    assert groups["TP"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert groups["DP"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert groups["PP"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert layout.coords(13) == {"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 3}


def test_rank_formula_first_dimension_fastest() -> None:
    layout = Layout.parse("tp=2,dp=3,pp=2,order=tp-dp-pp")
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        assert rank == c["tp"] + 2 * c["dp"] + 2 * 3 * c["pp"]


def test_expert_parallel_carved_from_data_parallel_ranks() -> None:
    # Megatron-Core: etp x ep x edp = tp x cp x dp, expert order tp-ep-dp-pp (cp dropped).
    layout = Layout.parse("tp=2,ep=2,dp=4,order=tp-cp-ep-dp-pp")
    assert layout.edp == 2
    assert layout.groups["EP"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups["DP-EP"] == [[0, 4], [1, 5], [2, 6], [3, 7]]  # expert data parallel
    assert layout.groups["DP"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [layout.coords(r)["ep"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_ep_equal_to_dp_shares_rank_sets_and_names_break_the_tie() -> None:
    layout = Layout.parse("tp=1,ep=4,dp=4")
    assert layout.groups["EP"] == layout.groups["DP"] == [[0, 1, 2, 3]]
    assert layout.dim_of([0, 1, 2, 3]) == ("EP", "layout-match")  # priority order without a name
    assert layout.dim_of([0, 1, 2, 3], "dp") == ("DP", "layout-match")
    assert layout.dim_of([0, 1, 2, 3], "EXPERT_MODEL_PARALLEL_GROUP") == ("EP", "layout-match")


def test_context_parallel_and_combined_groups() -> None:
    layout = Layout.parse("tp=2,cp=2,dp=2,order=tp-cp-dp-pp")
    assert layout.groups["CP"][:2] == [[0, 2], [1, 3]]
    assert layout.groups["DP-CP"][:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout.dim_of([0, 2, 4, 6]) == ("DP-CP", "layout-match")
    assert layout.dim_of([0, 5]) == ("UNKNOWN", "layout-match")


@pytest.mark.parametrize(
    ("name", "dim"),
    [("tp", "TP"), ("TENSOR_MODEL_PARALLEL_GROUP", "TP"), ("dp_cp", "DP-CP"), ("tp_exp", "EP-TP"),
     ("dp_modulo_exp", "DP-EP"), ("exp", "EP"), ("PIPELINE_MODEL_PARALLEL_GROUP", "PP"), ("default_pg", None)],
)
def test_framework_group_names(name: str, dim: str | None) -> None:
    assert dim_from_name(name) == dim


@pytest.mark.parametrize(
    ("spec", "message"),
    [("tp=2,xp=2", "unknown dimension 'xp'"), ("tp=0", "positive integer"), ("tp=2,dp", "not name=value"),
     ("tp=2,ep=3,dp=2", "does not divide"), ("tp=2,dp=2,order=tp-qq", "must name each"),
     ("tp=2,dp=2,order=tp-pp", "does not name dp")],
)
def test_bad_layouts(spec: str, message: str) -> None:
    with pytest.raises(TraceanaError, match=message):
        Layout.parse(spec)


def test_world_size_contradiction() -> None:
    with pytest.raises(TraceanaError, match="trace has 6 ranks but layout"):
        Layout.parse("tp=2,dp=2").check_world_size(6, "run.json")


@pytest.mark.parametrize(("spec", "fix"), [("ep=8", "add dp=8"), ("tp=2,ep=8", "add dp=8"),
                                           ("tp=2,ep=3,dp=2", "make dp a multiple of 3")])
def test_an_ep_alone_says_which_dp_it_needs(spec: str, fix: str) -> None:
    """ep adds no ranks (it splits tp*cp*dp), so the error says the dp that makes it fit, not only the rule."""
    with pytest.raises(TraceanaError, match=rf"does not divide tp\*cp\*dp=\d+: .*, so {fix}$"):
        Layout.parse(spec)
    Layout.parse(f"{spec.replace(',dp=2', '')},dp={8 if 'dp=8' in fix else 6}")  # the fix it names is accepted
