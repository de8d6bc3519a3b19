"""Rank coordinates and process groups from a parallel layout, with Megatron-Core's RankGenerator semantics.

A layout is sizes plus an order; the first dimension of the order varies fastest, so with ``order=tp-dp-pp``
rank = tp_rank + tp*dp_rank + tp*dp*pp_rank. Dense layers use tp, cp, dp, pp (the world size is their product);
expert layers split the same tp*cp*dp ranks of a pipeline stage as etp x ep x edp, in the same order with cp
dropped, exactly like Megatron-Core's second (expert) RankGenerator.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from traceana.errors import TraceanaError

DIMS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"

# Generated group kinds, in the order used to break ties when two kinds have the same rank set.
# Combined names put first the breakdown column they are charged to (DP-CP gradients are DP time).
GROUP_PRIORITY = ("TP", "CP", "EP", "DP", "PP", "DP-CP", "TP-CP", "EP-TP", "DP-EP", "TP-PP")

# Framework group names (Megatron / MindSpeed / HCCL group_name, torch pg_desc), normalized to lower_snake_case
# and matched as whole words (the tokens `_` delimits), first match wins.
_NAME_HINTS: tuple[tuple[str, str], ...] = (
    (r"dp_modulo_exp|expert_data|edp|exp_dp", "DP-EP"),
    (r"tp_exp|exp_tp|tp_ep|expert_tensor_and_model", "EP-TP"),
    (r"dp_cp|data_parallel_group_with_cp|data_modulo_expert", "DP-CP"),
    (r"tp_cp|tensor_and_context", "TP-CP"),
    (r"exp|ep|expert\w*", "EP"),
    (r"tp|tensor\w*", "TP"),
    (r"cp|context\w*", "CP"),
    (r"pp|pipeline\w*|embd|embedding\w*", "PP"),
    (r"dp|data\w*", "DP"),
    (r"mp|model_parallel_group", "TP-PP"),
)


def dim_from_name(name: str | None) -> str | None:
    """The dim a framework's group name implies ('tp', 'TENSOR_MODEL_PARALLEL_GROUP', 'dp_cp'), or None."""
    text = re.sub(r"[^a-z0-9]+", "_", (name or "").lower()).strip("_")
    for pattern, dim in _NAME_HINTS:
        if re.search(rf"(?:^|_)(?:{pattern})(?:_|$)", text):
            return dim
    return None


def _masked_groups(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Megatron's generate_masked_orthogonal_rank_groups: the rank sets spanned by the masked dimensions."""
    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    inner = [(s, d) for s, d, m in zip(sizes, strides, mask, strict=True) if m]
    outer = [(s, d) for s, d, m in zip(sizes, strides, mask, strict=True) if not m]

    def offsets(dims: list[tuple[int, int]]) -> list[int]:
        result = [0]
        for size, stride in dims:  # first dimension varies fastest
            result = [base + i * stride for i in range(size) for base in result]
        return result

    return [sorted(o + i for i in offsets(inner)) for o in offsets(outer)]


@dataclass(frozen=True)
class Layout:
    """Parallel sizes and order; ``etp`` (expert tensor parallel) defaults to ``tp``."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    order: str = DEFAULT_ORDER
    etp: int | None = None

    @classmethod
    def parse(cls, spec: str) -> Layout:
        """Parse ``"tp=2,cp=1,ep=2,dp=4,pp=2,order=tp-cp-ep-dp-pp"`` (any subset; missing sizes are 1)."""
        values: dict[str, int | str] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if key in values or (key == "order" and "order" in values):
                raise TraceanaError(f"layout {spec!r}: {key} is given twice")
            if not sep or not value.strip():
                raise TraceanaError(f"layout {spec!r}: {part!r} is not name=value")
            if key == "order":
                values["order"] = value.strip().lower()
            elif key in (*DIMS, "etp"):
                if not value.strip().isdigit() or int(value) < 1:
                    raise TraceanaError(f"layout {spec!r}: {key} must be a positive integer, got {value!r}")
                values[key] = int(value)
            else:
                known = "tp, cp, ep, dp, pp, etp, order"
                raise TraceanaError(f"layout {spec!r}: unknown dimension {key!r} (known: {known})")
        layout = cls(**values)  # type: ignore[arg-type]
        layout.validate()
        return layout

    def validate(self) -> None:
        names = self.order.split("-")
        unknown = [n for n in names if n not in DIMS]
        if unknown or len(set(names)) != len(names):
            raise TraceanaError(f"layout order {self.order!r}: must name each of tp, cp, ep, dp, pp at most once")
        for dim in DIMS:
            if getattr(self, dim) > 1 and dim not in names:
                size = getattr(self, dim)
                raise TraceanaError(f"layout order {self.order!r} does not name {dim}, whose size is {size}")
        stage = self.tp * self.cp * self.dp
        expert = self.expert_tp * self.ep
        if stage % expert:  # ep adds no ranks: it splits a stage's tp*cp*dp ranks, so they must be given too
            dp = expert // math.gcd(self.tp * self.cp, expert)
            fix = f"add dp={dp}" if self.dp == 1 else f"make dp a multiple of {dp}"
            raise TraceanaError(f"layout {self.spec}: ep={self.ep} x etp={self.expert_tp} does not divide "
                                f"tp*cp*dp={stage}: expert parallelism splits the ranks of the other dims, so {fix}")

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def edp(self) -> int:
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def spec(self) -> str:
        etp = f",etp={self.etp}" if self.etp and self.etp != self.tp else ""
        return f"tp={self.tp},cp={self.cp},ep={self.ep},dp={self.dp},pp={self.pp}{etp},order={self.order}"

    def check_world_size(self, world_size: int, source: str) -> None:
        if world_size != self.world_size:
            raise TraceanaError(
                f"{source}: the trace has {world_size} ranks but layout {self.spec} needs tp*cp*dp*pp={self.world_size}"
            )

    def _dense(self) -> tuple[list[str], list[int]]:
        names = [n for n in self.order.split("-") if n != "ep"]
        return names, [getattr(self, n) for n in names]

    def _expert(self) -> tuple[list[str], list[int]]:
        names = [n for n in self.order.split("-") if n != "cp"]
        size = {"tp": self.expert_tp, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        return names, [size[n] for n in names]

    def coords(self, rank: int) -> dict[str, int]:
        """tp, cp, ep, dp, pp coordinates of a global rank (ep from the expert layout)."""
        result: dict[str, int] = {}
        rest = rank
        for name, size in zip(*self._dense(), strict=True):
            result[name] = rest % size
            rest //= size
        rest = rank
        for name, size in zip(*self._expert(), strict=True):
            if name == "ep":
                result["ep"] = rest % size
            rest //= size
        return {d: result.get(d, 0) for d in DIMS}

    @cached_property
    def groups(self) -> dict[str, list[list[int]]]:
        """Every generated group kind -> its rank sets, as Megatron-Core builds them."""
        dense_names, dense_sizes = self._dense()
        expert_names, expert_sizes = self._expert()

        def dense(*dims: str) -> list[list[int]]:
            return _masked_groups(dense_sizes, [n in dims for n in dense_names])

        def expert(*dims: str) -> list[list[int]]:
            return _masked_groups(expert_sizes, [n in dims for n in expert_names])

        return {
            "TP": dense("tp"), "CP": dense("cp"), "DP": dense("dp"), "PP": dense("pp"),
            "EP": expert("ep"), "DP-CP": dense("dp", "cp"), "TP-CP": dense("tp", "cp"),
            "EP-TP": expert("tp", "ep"), "DP-EP": expert("dp"), "TP-PP": dense("tp", "pp"),
        }

    def dims_of(self, ranks: Iterable[int]) -> list[str]:
        """The group kinds whose rank sets equal ``ranks``, in GROUP_PRIORITY order."""
        target = sorted(set(ranks))
        return [kind for kind in GROUP_PRIORITY if target in self.groups[kind]]

    def span_of(self, ranks: Iterable[int]) -> str | None:
        """'TP-DP' when ``ranks`` are exactly the ranks that differ only in tp and dp (dense dims, not the world):
        a group no generated kind has, like MindSpeed's tp_dp or tp_dp_cp (a whole pipeline stage)."""
        members = sorted(set(ranks))
        coords = [self.coords(r) for r in members]
        varying = [d for d in self.order.split("-") if d != "ep" and len({c[d] for c in coords}) > 1]
        if not varying or len(members) >= self.world_size:
            return None
        if math.prod(getattr(self, d) for d in varying) != len(members):
            return None
        return "-".join(d.upper() for d in varying)

    def dim_of(self, ranks: Iterable[int], name: str | None = None) -> tuple[str, str]:
        """(dim, evidence) for a group: by rank set, the framework's name breaking ties; else by name; else UNKNOWN.

        A one-rank group sits in every size-1 dimension, so only its name can say which (cp, exp, embd)."""
        members = sorted(set(ranks))
        hint = dim_from_name(name)
        if len(members) == 1:
            return (hint, "comm-name") if hint else ("UNKNOWN", "layout-match")
        candidates = self.dims_of(members)
        if candidates:
            return (hint, "layout-match") if hint in candidates else (candidates[0], "layout-match")
        span = self.span_of(members)
        if span:
            return span, "layout-match"
        return (hint, "comm-name") if hint else ("UNKNOWN", "layout-match")
