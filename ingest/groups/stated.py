"""The layout a trace states through its own process groups (Kineto ``pg_config`` and PG args, Ascend
``parallel_group_info``): derived when ``--layout`` is not given, and a ``--layout`` (or MindSpeed
``distributed_args``) that contradicts it refused or set aside, naming the group that disagrees.

Only a group whose whole name is a role (:data:`ROLES`) says which layout dimension it is: a word search such as
``dim_from_name`` would read MindSpeed's ``tp_dp`` (a whole stage) as a TP group, and Megatron's embedding group
is a PP group only when pp is 2. A layout fits when every such group is one of the groups it generates for that
role. The sizes the roles give are pinned; the ranks they leave are data parallel when no group names dp (Megatron
derives dp = world / (tp·cp·pp) the same way), else spread over the model-parallel dims no group names, and
a trace that leaves that open fits several layouts: those are listed rather than one picked.
"""

from __future__ import annotations

import math
import re
from itertools import permutations

import polars as pl

from traceana.errors import TraceanaError
from traceana.layout import DEFAULT_ORDER, DIMS, Layout

# Exact group names (lower_snake_case) -> the generated group kind they are: the sample traces' and torch users'
# short names, MindSpeed's parallel_group_info group_name, Megatron-Core's group_desc.
ROLES = {
    **dict.fromkeys(("tp", "tensor_model_parallel_group"), "TP"),
    **dict.fromkeys(("cp", "context_parallel_group"), "CP"),
    **dict.fromkeys(("dp", "data_parallel_group"), "DP"),
    **dict.fromkeys(("pp", "pipeline_model_parallel_group"), "PP"),
    **dict.fromkeys(("ep", "exp", "expert_model_parallel_group"), "EP"),
    **dict.fromkeys(("edp", "dp_modulo_exp", "expert_data_parallel_group"), "DP-EP"),
    **dict.fromkeys(("dp_cp", "data_parallel_group_with_cp"), "DP-CP"),
    **dict.fromkeys(("tp_cp", "tensor_and_context_parallel_group"), "TP-CP"),
    "tp_exp": "EP-TP",
    **dict.fromkeys(("mp", "model_parallel_group"), "TP-PP"),
}
_EXPERT_KINDS = ("EP", "DP-EP", "EP-TP")
_MAX_CANDIDATES = 20_000  # layouts tried at most; a trace naming too little to narrow them is left to --layout
_SHOWN = 4  # fitting layouts listed in a note


def role_of(name: str | None) -> str | None:
    return ROLES.get(re.sub(r"[^a-z0-9]+", "_", (name or "").lower()).strip("_"))


def stated_roles(groups: pl.DataFrame) -> list[tuple[str, str, tuple[int, ...]]]:
    """(kind, name, ranks) of every group the trace itself states under a role name, once per rank set."""
    if groups.is_empty():
        return []
    stated = groups.filter(pl.col("source") == "trace") if "source" in groups.columns else groups
    found = {}
    for name, ranks in stated.select("name", "ranks").iter_rows():
        if (kind := role_of(name)) and ranks:
            found.setdefault((kind, tuple(sorted(set(ranks)))), name)
    return [(kind, name, ranks) for (kind, ranks), name in found.items()]


def disagreement(layout: Layout, roles: list[tuple[str, str, tuple[int, ...]]]) -> str | None:
    """The first stated group that is not one of ``layout``'s groups of its role, described; None if all are."""
    for kind, name, ranks in roles:
        generated = layout.groups[kind]
        if list(ranks) not in generated:
            theirs = [g for g in generated if ranks[0] in g]
            return (f"the trace's group {name!r} (ranks {_short(ranks)}) is not a {kind} group of it "
                    f"(its {kind} group of rank {ranks[0]}: {_short(theirs[0]) if theirs else 'none'})")
    return None


def fitting_layouts(roles: list[tuple[str, str, tuple[int, ...]]], world: int) -> list[Layout] | None:
    """Every layout of ``world`` ranks under which each stated group is a group of its role (orders of size-1 dims
    aside: the dims that matter take Megatron's default order's places). None when too many to try."""
    pinned: dict[str, set[int]] = {}
    for kind, _name, ranks in roles:
        if kind in ("TP", "CP", "DP", "PP", "EP"):
            pinned.setdefault(kind.lower(), set()).add(len(ranks))
    if any(len(s) > 1 for s in pinned.values()) or any(r >= world for _k, _n, ranks in roles for r in ranks):
        return []
    fixed = {dim: sizes.pop() for dim, sizes in pinned.items()}
    rest, remainder = divmod(world, math.prod(fixed.get(d, 1) for d in ("tp", "cp", "dp", "pp")))
    if remainder:
        return []
    if "dp" not in fixed:  # the ranks no named group accounts for are data parallel, as Megatron derives dp
        fixed.update({d: 1 for d in ("tp", "cp", "pp") if d not in fixed}, dp=rest)
        rest = 1
    free = [d for d in ("tp", "cp", "dp", "pp") if d not in fixed]
    expert = any(kind in _EXPERT_KINDS for kind, _n, _r in roles)
    fits: dict[tuple, Layout] = {}
    tried = 0
    for combo in _factorizations(rest, len(free)):
        sizes = {**fixed, **dict(zip(free, combo, strict=True))}
        stage = sizes.get("tp", 1) * sizes.get("cp", 1) * sizes.get("dp", 1)
        eps = [sizes["ep"]] if "ep" in sizes else _divisors(stage // sizes.get("tp", 1)) if expert else [1]
        for ep in eps:
            dims = {**sizes, "ep": ep}
            moving = [d for d in DIMS if dims.get(d, 1) > 1]
            slots = [i for i, d in enumerate(DEFAULT_ORDER.split("-")) if d in moving]
            for perm in permutations(moving):
                tried += 1
                if tried > _MAX_CANDIDATES:
                    return None
                order = DEFAULT_ORDER.split("-")
                for slot, dim in zip(slots, perm, strict=True):
                    order[slot] = dim
                layout = Layout(**{d: dims.get(d, 1) for d in DIMS}, order="-".join(order))
                try:
                    layout.validate()
                except TraceanaError:
                    continue
                if disagreement(layout, roles) is None:
                    fits.setdefault(tuple(tuple(layout.coords(r).values()) for r in range(world)), layout)
    return list(fits.values())


def settle_layout(groups: pl.DataFrame, world: int, given: Layout | None, stated: Layout | None,
                  source: str) -> tuple[Layout | None, list[str]]:
    """(layout, notes): ``given`` (--layout) unless the trace's groups contradict it (an error naming the group);
    else ``stated`` (distributed_args) unless they contradict it; else the one layout they fit, if one."""
    roles = stated_roles(groups)
    if given is not None:
        if roles and (why := disagreement(given, roles)):
            fits = fitting_layouts(roles, world)
            raise TraceanaError(f"{source}: --layout {given.spec} contradicts the trace: {why}"
                                + (f"; the trace's groups fit {_listing(fits)}" if fits else ""))
        return given, []
    notes = []
    if stated is not None:
        if not roles or not (why := disagreement(stated, roles)):
            return stated, []
        notes.append(f"MindSpeed distributed_args layout {stated.spec} set aside: {why}")
    if not roles:
        return None, notes
    fits = fitting_layouts(roles, world)
    names = ", ".join(dict.fromkeys(name for _k, name, _r in roles))
    if fits is None:
        return None, [*notes, f"the trace's groups ({names}) fit too many layouts to list: pass --layout"]
    if len(fits) == 1:
        rest = "" if any(kind == "DP" for kind, _n, _r in roles) else f"; dp={fits[0].dp}: the ranks they leave"
        return fits[0], [*notes, f"layout {fits[0].spec} from the trace's own groups ({names}{rest})"]
    if not fits:
        return None, [*notes, f"the trace's groups ({names}) fit no layout of {world} ranks: pass --layout"]
    return None, [*notes, f"the trace's groups ({names}) fit {len(fits)} layouts: {_listing(fits)}; pass --layout "
                          "to pick one (no coordinates until then)"]


def _listing(fits: list[Layout]) -> str:
    more = f"; and {len(fits) - _SHOWN} more" if len(fits) > _SHOWN else ""
    return "; ".join(f.spec for f in fits[:_SHOWN]) + more


def _short(ranks: tuple[int, ...] | list[int]) -> str:
    return str(list(ranks)) if len(ranks) <= 8 else f"[{', '.join(map(str, ranks[:6]))}, ... {len(ranks)} ranks]"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write ``n`` as a product of ``parts`` positive integers."""
    if parts == 0:
        return [()] if n == 1 else []
    return [(d, *rest) for d in _divisors(n) for rest in _factorizations(n // d, parts - 1)]
