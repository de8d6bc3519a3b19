"""The validation pairs' design: which configs are recorded and which pairs of them differ in one knob.

A star design on 2 ranks (ranks <= cores): around each base config, one knob at a time. A pair GROUP is one base and
one knob value, with all its recordings and both directions; it is the unit of the calibrate/check split.
- dp2 MLP bases (Y = GELU(X W1^T) W2^T, H = 2D, T tokens a replica, gradients as one flat DP bucket of 4D^2 fp32):
  - straggler: rank 1 runs extra products so its product FLOPs are f x rank 0's; `rank=1:f` predicts the straggler
    run from the clean one, `rank=1:median` the clean run from the straggler one;
  - payload: the DP bucket's all-reduce carries a fraction p of it; `dim=DP:p` from the base, `dim=DP:1/p` back;
  - host_delay: every rank sleeps d ms on the host at the start of each step; `host=0` predicts the base from it;
  - null: the base recorded again under another name; `rank=*:1` (no change) either way;
  - tp_vs_dp: the same 2T tokens a step on tp2 (one replica) as on dp2 (two of T); `traceana predict`.
- pp2 bases (pipeline.py's GPipe stages at other widths and batches): microbatch, m -> 2m and back; predict.
- ep2 bases (moe.py's top-1 MoE at two expert widths): routing, balanced [32, 32] against skewed splits; predict
  (model.expert_load) both ways, and `rank=*:median` from the skewed run.
Split rule: every group of a base goes to the base's side; a family's bases alternate, calibrate first, in the order
listed below (tp_vs_dp groups follow their dp2 base).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

# family -> (layout for `traceana ingest --layout`, group kinds every rank creates); one job records a family's configs
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "dp2": ("dp=2", ("TP", "DP")),
    "tp2": ("tp=2", ("TP", "DP")),
    "pp2": ("pp=2", ("PP", "DP")),
    "ep2": ("ep=2,dp=2", ("EP", "DP-EP")),
}
STRAGGLER_RANK = 1
MLP_PRODUCTS = 5  # products per MLP step, each T x D x H: 2 forward, 3 backward (x needs no gradient)
STRAGGLER_FACTORS = (1.4, 2.0, 3.0)  # x 5 products: 2, 5, 10 extra, so the FLOP ratio is exact
PAYLOADS = (0.5, 0.25)
HOST_DELAYS_MS = (1.0, 5.0, 20.0)
MICRO_BATCHES = (1, 2, 4, 8)
SKEWS = ((40, 24), (48, 16), (56, 8))  # an EP rank's token splits to expert 0 and 1, out of 64; balanced (32, 32)

# Sizes whose steps last 20 ms or more: a shorter step moves by a scheduler tick between recordings (3-11 ms steps
# varied 0.2-0.37 in log-SD over back-to-back recordings, 20-30 ms ones 0.08; sample_traces/README.md, "Noise floor").
DP_BASES = ((128, 4096), (128, 8192), (256, 1024), (256, 2048), (512, 256), (512, 512))  # (D, T): DP 256 KiB-4 MiB
PP_BASES = ((512, 1024, 256), (256, 1024, 512), (512, 2048, 256), (1024, 1024, 256))  # (d_in, hidden, batch)
EP_BASES = (4096, 2048)  # the expert's FFN width


@dataclass(frozen=True)
class Config:
    """One recorded configuration: a family's model at some size, and at most one knob moved."""

    name: str
    family: str
    width: int  # MLP D, pipeline d_in, MoE 512
    hidden: int  # MLP H, pipeline hidden, MoE FFN
    tokens: int  # a replica's (MLP) or a pipeline's (pp) tokens a step; the MoE's 64 a rank
    micro_batches: int = 1
    splits: tuple[int, int] = (32, 32)
    straggler: float = 1.0
    payload: float = 1.0
    host_ms: float = 0.0

    @property
    def layout(self) -> str:
        return FAMILIES[self.family][0]


@dataclass(frozen=True)
class Row:
    """One manifest row: a pair group in one direction, predicted by one command."""

    group: str
    kind: str
    family: str  # whatif | predict
    a: Config
    b: Config
    split: str  # calibrate | check
    change: str = ""  # whatif specs, ';'-separated
    notes: str = ""


def _fmt(x: float) -> str:
    return f"{x:g}"


def dp_base(d: int, t: int) -> Config:
    return Config(f"dp2_d{d}_t{t}", "dp2", d, 2 * d, t)


def configs_and_rows() -> tuple[list[Config], list[Row]]:
    """Every config to record and every manifest row, in a fixed order."""
    configs: list[Config] = []
    rows: list[Row] = []

    def add(c: Config) -> Config:
        configs.append(c)
        return c

    def pair(group: str, kind: str, a: Config, b: Config, split: str, back: str, forth: str = "", note: str = "",
             predict: bool = False) -> None:
        """Both directions of one group: whatif with ``forth`` (a -> b) / ``back`` (b -> a), or predict both ways."""
        if predict:
            rows.extend([Row(group, kind, "predict", a, b, split, notes=note),
                         Row(group, kind, "predict", b, a, split, notes=note)])
            return
        if forth:
            rows.append(Row(group, kind, "whatif", a, b, split, forth, note))
        rows.append(Row(group, kind, "whatif", b, a, split, back, note))

    for i, (d, t) in enumerate(DP_BASES):
        split = ("calibrate", "check")[i % 2]
        base = add(dp_base(d, t))
        null = add(replace(base, name=f"{base.name}_null"))
        pair(f"{base.name}:null", "null", base, null, split, back="rank=*:1", forth="rank=*:1",
             note="the base recorded again under another name: no change")
        for f in STRAGGLER_FACTORS:
            slow = add(replace(base, name=f"{base.name}_straggler{_fmt(f)}", straggler=f))
            pair(f"{base.name}:straggler{_fmt(f)}", "straggler", base, slow, split,
                 forth=f"rank={STRAGGLER_RANK}:{_fmt(f)}", back=f"rank={STRAGGLER_RANK}:median",
                 note=f"rank {STRAGGLER_RANK}'s products {_fmt(f)}x rank 0's FLOPs; its other ops unchanged")
        for p in PAYLOADS:
            small = add(replace(base, name=f"{base.name}_payload{_fmt(p)}", payload=p))
            kib = 4 * d * d * 4 / 1024
            pair(f"{base.name}:payload{_fmt(p)}", "payload", base, small, split, forth=f"dim=DP:{_fmt(p)}",
                 back=f"dim=DP:{_fmt(1 / p)}", note=f"DP all-reduce {kib:g} KiB -> {kib * p:g} KiB")
        for ms in HOST_DELAYS_MS:
            slow = add(replace(base, name=f"{base.name}_host{_fmt(ms)}ms", host_ms=ms))
            pair(f"{base.name}:host{_fmt(ms)}ms", "host_delay", base, slow, split, back="host=0",
                 note=f"{_fmt(ms)} ms host sleep at each step's start on every rank; one direction only")
        tp = add(Config(f"tp2_d{d}_t{2 * t}", "tp2", d, 2 * d, 2 * t))
        pair(f"{base.name}:tp2", "tp_vs_dp", base, tp, split, back="", predict=True,
             note=f"{2 * t} tokens a step: dp2 as 2 x {t}, tp2 as 1 x {2 * t}")

    for i, (d_in, hidden, batch) in enumerate(PP_BASES):
        split = ("calibrate", "check")[i % 2]
        runs = [add(Config(f"pp2_d{d_in}_h{hidden}_b{batch}_mb{m}", "pp2", d_in, hidden, batch, micro_batches=m))
                for m in MICRO_BATCHES]
        for a, b in pairwise(runs):
            pair(f"pp2_d{d_in}_h{hidden}_b{batch}:mb{a.micro_batches}-{b.micro_batches}", "microbatch", a, b, split,
                 back="", predict=True, note="GPipe, blocking send/recv")

    for i, ffn in enumerate(EP_BASES):
        split = ("calibrate", "check")[i % 2]
        balanced = add(Config(f"ep2_f{ffn}_s32-32", "ep2", 512, ffn, 64))
        for skew in SKEWS:
            skewed = add(replace(balanced, name=f"ep2_f{ffn}_s{skew[0]}-{skew[1]}", splits=skew))
            group = f"ep2_f{ffn}:s{skew[0]}-{skew[1]}"
            note = f"expert loads {expert_load(skew)[0]:g}:{expert_load(skew)[1]:g} of balanced"
            pair(group, "routing", balanced, skewed, split, back="", predict=True, note=note)
            rows.append(Row(group, "routing", "whatif", skewed, balanced, split, "rank=*:median", note))
    return configs, rows


def expert_load(splits: tuple[int, int]) -> list[float]:
    """Each expert's tokens over its balanced 64: both sources route ``splits``, so expert e gets 2 x splits[e]."""
    return [2 * s / 64 for s in splits]


def estimator_model(c: Config) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """(model, parallel extras, schedule, what the format cannot say) for configs.render, as configs.MODELS has."""
    if c.family in ("dp2", "tp2"):
        model = {"layers": 1, "hidden": c.width, "ffn_hidden": c.hidden, "heads": 2, "vocab": 8, "seq_len": c.tokens,
                 "gated_mlp": False, "attention": False}
        return model, {"micro_batch": 1, "global_batch": 2 if c.family == "dp2" else 1}, "1f1b", \
            "no embedding or head in the real model"
    if c.family == "pp2":
        # as configs._PIPE: a stage's one GEMM [batch, d_in] x [d_in, hidden] is a layer of hidden with an MLP of
        # d_in / 2 (same FLOPs and parameters); the batch as sequences of 8 tokens
        model = {"layers": 2, "hidden": c.hidden, "ffn_hidden": c.width // 2, "heads": 1, "vocab": 8, "seq_len": 8,
                 "gated_mlp": False, "attention": False}
        sequences = c.tokens // 8
        return model, {"micro_batch": sequences // c.micro_batches, "global_batch": sequences}, "gpipe", \
            "each stage is one GEMM, not an MLP's two; no embedding or head"
    model = {"layers": 1, "hidden": c.width, "ffn_hidden": c.hidden, "heads": 1, "vocab": 8, "seq_len": c.tokens,
             "gated_mlp": False, "attention": False, "experts": 2, "moe_topk": 1, "expert_ffn_hidden": c.hidden}
    if c.splits != (32, 32):
        model["expert_load"] = expert_load(c.splits)
    return model, {"micro_batch": 1, "global_batch": 2}, "1f1b", "no router, embedding or head; routing is fixed"
