"""A training job as the estimator sees it: the YAML of DESIGN §5 read into frozen, validated dataclasses.

Every check names the field it rejects (``cfg.yaml: parallel.pp=16 exceeds model.layers=12``) so a user can fix
the file without reading code. Sections and fields not listed here are errors, not silently ignored: a typo in a
knob would otherwise leave a default in force.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from traceana.errors import TraceanaError, first_line
from traceana.estimator import balance
from traceana.estimator.hardware import Profile
from traceana.estimator.pipeline import BLOCKING_KINDS, schedule_problem
from traceana.layout import Layout

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe")
RECOMPUTE_KINDS = ("none", "selective", "full")
P2P_MODES = ("auto", "blocking", "async")
PROFILES = Path(__file__).parent / "profiles"  # built-in hardware profiles, by file stem
CP_ALGOS = ("ring", "allgather", "ulysses")
CROSS_ENTROPY_KINDS = ("megatron", "pytorch")  # estimator.compute.CROSS_ENTROPY
MOE_WEIGHTING = ("combine", "swiglu")  # where a routed copy is scaled by its routing weight (estimator.memory)
COLLECTIVES = ("nccl", "gloo")  # estimator.comm.collective: how the library runs each collective
RECOMPUTE_MODULES = ("core_attn", "layernorm", "activation", "mla_up_proj")
FP8_MATMULS = ("attention", "mlp", "experts", "head")
ZERO_ALLOWED = ("vocab", "experts", "moe_topk", "shared_experts", "first_dense_layers", "qk_rope_head_dim", "zero")


@dataclass(frozen=True)
class Model:
    """Shapes. MoE when ``experts`` > 0 (after ``first_dense_layers`` dense ones); MLA when ``kv_lora_rank`` is set."""

    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    vocab: int                           # 0: no embedding or output layer (blocks fed hidden states)
    seq_len: int
    kv_heads: int | None = None          # GQA; default heads (MHA)
    head_dim: int | None = None          # default hidden / heads; with MLA the no-rope query/key head width
    experts: int = 0
    moe_topk: int = 0
    expert_ffn_hidden: int | None = None  # default ffn_hidden
    shared_experts: int = 0
    first_dense_layers: int = 0
    capacity_factor: float = 1.0         # tokens every expert computes, relative to a balanced share: Megatron's
    # capacity, to which experts are padded (tokens beyond it dropped); 1 = balanced
    expert_load: tuple[float, ...] | None = None  # dropless routing: per EP rank, the tokens its experts receive
    # relative to a balanced split (mean 1); the most loaded one paces the all-to-all, the others wait for it
    moe_max_nodes: int | None = None     # node-limited routing: a token's experts on at most this many nodes
    gated_mlp: bool = True               # SwiGLU (3 matrices) vs GELU (2)
    dropout: bool = True                 # dropout after attention and MLP (GPT; Korthikanti's 1-byte masks kept);
    # False: none, as in DeepSeek-V3 and Llama (their released configs: attention_dropout 0.0, no hidden dropout)
    moe_weighting: str = "combine"       # combine: the expert's output is scaled at the combine (Megatron's
    # unpermute), so it is kept for the weight's gradient; swiglu: the SwiGLU output is scaled, no output kept
    flash_attention: bool = True         # False: the s x s scores are materialized (and stored: Korthikanti 5as/h)
    attention: bool = True               # False: MLP-only blocks (no attention, its layer norm or its TP reduce)
    tied_embeddings: bool = False
    cross_entropy: str = "megatron"      # how the loss runs over the logits: megatron (in place) or pytorch
    # (F.cross_entropy on logits.float()); estimator.compute.CROSS_ENTROPY has the bytes each moves and holds
    gradient_accumulation_fusion: bool = True  # Megatron's: wgrad GEMMs accumulate into main_grad; False = eager
    # PyTorch, whose AccumulateGrad adds each micro-batch's gradients after the first in a kernel of its own
    q_lora_rank: int | None = None       # MLA
    kv_lora_rank: int | None = None      # MLA
    qk_rope_head_dim: int = 0            # MLA
    v_head_dim: int | None = None        # MLA; default head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def expert_ffn(self) -> int:
        return self.expert_ffn_hidden or self.ffn_hidden

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def routed_load(self) -> float:
        """Tokens the most loaded EP rank's experts compute, relative to a balanced share: what the estimate prices
        a rank at (its memory peak, the all-to-all it receives, the compute the others wait for)."""
        return max(self.expert_load) if self.expert_load else self.capacity_factor

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and layer >= self.first_dense_layers


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1
    etp: int | None = None               # expert tensor parallel; default tp
    vpp: int = 1
    sequence_parallel: bool = False
    zero: int = 0                        # 0 none, 1 optimizer (distributed optimizer), 2 +gradients, 3 +parameters
    zero_shard: int | None = None        # ZeRO-3 shard group size (HSDP: dp = zero_shard x replicas); default dp
    expert_zero3_sharding: bool = True   # seed 000 P2: False = expert states sharded by EP only
    micro_batch: int = 1
    global_batch: int = 1
    order: str = "tp-cp-ep-dp-pp"
    cp_algo: str = "ring"
    tp_comm_overlap: bool = False        # Megatron --tp-comm-overlap: sequence-parallel collectives pipelined in chunks
    # with the matmul they feed or drain (collective matmul); needs sequence_parallel
    overlap_grad_reduce: bool = False    # gradients reduced in buckets during the backward, parameters gathered
    # during the forward (Megatron --overlap-grad-reduce / --overlap-param-gather, PyTorch DDP buckets)

    @property
    def layout(self) -> Layout:
        return Layout(tp=self.tp, cp=self.cp, ep=self.ep, dp=self.dp, pp=self.pp, order=self.order, etp=self.etp)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp


@dataclass(frozen=True)
class Recompute:
    """What the backward recomputes instead of keeping: nothing, the whole layer (full), or for ``selective`` the
    ``modules`` listed (default the attention core, Korthikanti et al. 2022; Megatron-Core's --recompute-modules
    also offers layer norms, the MLP activation (SwiGLU / GeLU) and MLA's up-projections, as DeepSeek-V3 does)."""

    kind: str = "none"
    layers: tuple[int, ...] | None = None  # None: every layer
    modules: tuple[str, ...] | None = None  # with selective; default ("core_attn",)

    def kind_of(self, layer: int) -> str:
        return self.kind if self.layers is None or layer in self.layers else "none"

    def recomputes(self, layer: int, module: str) -> bool:
        """Whether ``module`` of ``layer`` runs again in the backward (a fully recomputed layer: every module)."""
        kind = self.kind_of(layer)
        return kind == "full" or (kind == "selective" and module in (self.modules or ("core_attn",)))


@dataclass(frozen=True)
class Schedule:
    kind: str = "1f1b"
    stage_layers: tuple[int, ...] | str | None = None  # layers per stage (pp, or pp*vpp in chunk order), or "ppb"
    layer_offset: tuple[int, ...] | None = None       # per stage, added to the even split
    recompute: Recompute = field(default_factory=Recompute)
    p2p: str = "auto"  # blocking | async | auto (blocking on gloo, whose send is synchronous): pipeline.py's doc

    def blocking_p2p(self, collectives: str) -> bool:
        """Whether the simulator plays this schedule's transfers as rendezvous, given the collectives library."""
        if self.p2p == "auto":
            return collectives == "gloo" and self.kind in BLOCKING_KINDS
        return self.p2p == "blocking"


@dataclass(frozen=True)
class Links:
    intra: float
    inter: float


@dataclass(frozen=True)
class Hardware:
    peak_tflops_bf16: float
    hbm_gb: float
    device: str = "gpu"
    devices: int | None = None               # the job's device count (search enumerates layouts for it)
    devices_per_node: int = 8
    bandwidth_gb_per_s: Links = field(default_factory=lambda: Links(intra=150.0, inter=25.0))  # bus bandwidth
    latency_us: Links = field(default_factory=lambda: Links(intra=5.0, inter=10.0))
    hbm_bandwidth_gb_per_s: float | None = None  # for memory-bound work (elementwise ops, optimizer step)
    profile: str | None = None               # a built-in profile (a100, h100, h200) or a profile YAML file
    peak_tflops_fp8: float | None = None
    peak_tflops_fp32: float | None = None    # CUDA cores: work that uses no tensor cores (elementwise ops)
    peak_tflops_tf32: float | None = None    # fp32 GEMMs on tensor cores (torch.backends.cuda.matmul.allow_tf32)
    collectives: str = "nccl"                # the library's algorithms: nccl (HCCL alike) or gloo


@dataclass(frozen=True)
class Overlap:
    """Fraction of each dimension's communication hidden behind compute, when given: an override. Unset, the
    mechanism the job runs decides (parallel.tp_comm_overlap, parallel.overlap_grad_reduce; DualPipe's pairs and
    the shared experts for EP), and without one seed 001's defaults (:meth:`of`)."""

    dp: float | None = None
    tp: float | None = None
    ep: float | None = None
    cp: float | None = None

    def of(self, dim: str) -> float:
        """The fraction to apply: the one given, else seed 001's default (dp 0.9, tp 0, ep 0, cp 0.5)."""
        value = getattr(self, dim)
        return {"dp": 0.9, "tp": 0.0, "ep": 0.0, "cp": 0.5}[dim] if value is None else value


@dataclass(frozen=True)
class Calibration:
    matmul_efficiency: float = 0.75
    overlap: Overlap = field(default_factory=Overlap)
    ep_bubble_overlap_ratio: float = 0.0
    safety_buffer_mb: float = 1024.0
    tp_shardable_overhead_mb: float = 0.0
    cuda_context_mb: float = 500.0           # the CUDA context and kernel images: outside PyTorch's allocator, in
    # the device's used memory only ("a few hundred MiB" with CUDA 12's lazy loading; not measured here: set it
    # from nvidia-smi's used less torch.cuda.memory_reserved() of your own process)
    nccl_buffer_mb: float = 4.0              # NCCL_BUFFSIZE (its documented default): a buffer per channel and peer
    nccl_channels: int = 16                  # NCCL's channels a ring collective uses (NCCL_DEBUG=INFO lists them)
    a2a_efficiency: Links = field(default_factory=lambda: Links(intra=1.0, inter=1.0))  # of bus bandwidth
    memory_efficiency: float = 0.7           # of hbm_bandwidth_gb_per_s that elementwise kernels reach
    step_overhead_ms: float = 0.0            # per step, host/launch time no kernel covers
    host_us_per_layer: float = 0.0           # host time to issue one layer's forward (eager PyTorch launch cost)
    host_us_per_backward_layer: float | None = None  # its backward; default twice the forward
    host_overlap: str = "micro_batch"        # the stretch host and device overlap over: a chunk's forward and backward
    # of a micro-batch (eager PyTorch), or each layer's pass on its own ("pass": the framework synchronizes)
    host_us_per_collective: float = 0.0      # host time of each TP / EP collective call
    launch_us: float = 5.0                   # host time to launch one kernel (a profile gives its device's): the
    # floor of a layer's host time when host_us_per_layer says less
    host_us_per_micro_batch: float = 0.0     # host work per micro-batch and model chunk outside the layers (the loss,
    # starting and finishing the backward, the training loop), issued in the same stretch as the chunk's layers
    host_us_per_step: float = 0.0            # host work once a step outside the layers (optimizer step, zero_grad):
    # the device idles for what its own optimizer work does not cover
    idle_us_per_layer: float = 0.0           # the device's dead time per layer and micro-batch between kernels it has
    # queued and the host's short stalls (`traceana calibrate` measures it from a device-bound trace's idle time)
    optimizer_efficiency: float | None = None  # of hbm_bandwidth_gb_per_s the optimizer step reaches; default
    # memory_efficiency (fused AdamW's multi-tensor kernels reach less than a copy)


@dataclass(frozen=True)
class Precision:
    """Bytes per element: Megatron mixed precision keeps bf16 weights, fp32 main grads and fp32 Adam (2+4+12)."""

    param_bytes: int = 2
    grad_bytes: int = 4
    optimizer_bytes: int = 12
    activation_bytes: int = 2
    fp8: tuple[str, ...] = ()       # matmuls run in FP8 (attention, mlp, experts, head), at hardware.peak_tflops_fp8
    fp8_activations: bool = False   # linear layers keep their saved inputs in FP8 (1 byte; DeepSeek-V3 §3.3)


@dataclass(frozen=True)
class Config:
    model: Model
    parallel: Parallel
    hardware: Hardware
    schedule: Schedule = field(default_factory=Schedule)
    calibration: Calibration = field(default_factory=Calibration)
    precision: Precision = field(default_factory=Precision)
    source: str = "config"                   # where it came from, for error messages
    profile: Profile | None = field(default=None, compare=False)  # hardware.profile, read (shape-aware times)

    @property
    def micro_batches(self) -> int:
        return self.parallel.micro_batches


@dataclass(frozen=True)
class Run:
    """One entry of a config's ``runs:`` list: a name, the overrides applied, and the measured values it carries."""

    name: str
    config: Config
    measured: dict[str, float]


def load(path: str | Path) -> Config:
    """Read and validate a job YAML (its ``runs:`` list, if any, is read by :func:`load_runs`)."""
    raw = read_yaml(path)
    raw.pop("runs", None)
    return from_dict(raw, str(path), Path(path).parent)


def load_with(path: str | Path, changes: list[str]) -> Config:
    """The config at ``path`` with ``changes`` ("section.key=VALUE", the value read as YAML: 8, true, [1, 2]) made
    before validation, as if the file said so: `predict --set` targets without a second YAML."""
    raw = read_yaml(path)
    raw.pop("runs", None)
    return with_changes(raw, changes, str(path), Path(path).parent)


def with_changes(raw: dict[str, Any], changes: list[str], source: str, where: Path = Path(".")) -> Config:
    """The config ``raw`` (as YAML gives it; changed in place) with ``changes`` made, as :func:`load_with`."""
    for change in changes:
        key, sep, text = change.partition("=")
        names = key.strip().split(".")
        if not sep or len(names) < 2 or not all(names):
            raise TraceanaError(f"--set {change!r}: expected SECTION.KEY=VALUE, e.g. parallel.micro_batch=8")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise TraceanaError(f"--set {change!r}: the value is not YAML") from None
        node = raw
        for name in names[:-1]:
            if not isinstance(node.get(name, {}), dict):
                raise TraceanaError(f"--set {change!r}: {name} is not a section of {source}")
            node = node.setdefault(name, {})
        node[names[-1]] = value
    return from_dict(raw, f"{source} with {', '.join(changes)}" if changes else source, where)


def load_runs(path: str | Path) -> list[Run]:
    """The config's ``runs:`` sweep: each entry is ``{name, measured: {...}, <section>: {overrides}}``.

    An entry may name ``config: FILE`` (relative to this file) as its base instead of this file's own sections, so
    a sweep over different models reuses their configs rather than copying them."""
    raw = read_yaml(path)
    runs = raw.pop("runs", None) or []
    if not isinstance(runs, list):
        raise TraceanaError(f"{path}: runs: must be a list of {{name, overrides}}")
    result = []
    for i, entry in enumerate(runs):
        if not isinstance(entry, dict) or "name" not in entry:
            raise TraceanaError(f"{path}: runs[{i}]: needs a name")
        entry = dict(entry)
        name, measured = str(entry.pop("name")), entry.pop("measured", None) or {}
        source = f"{path} runs[{name}]"
        base, where = raw, Path(path).parent
        if "config" in entry:
            base_path = where / str(entry.pop("config"))
            base, where = read_yaml(base_path), base_path.parent
            base.pop("runs", None)
        if not isinstance(measured, dict):
            raise TraceanaError(f"{source}: measured: must map quantities to numbers, e.g. {{TOTAL_ms: 123.4}}")
        for key, value in measured.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TraceanaError(f"{source}: measured.{key}={value!r}: expected a number")
        result.append(Run(name, from_dict(_merge(base, entry), source, where),
                          {str(k): float(v) for k, v in measured.items()}))
    return result


def from_dict(raw: dict[str, Any], source: str = "config", where: Path = Path(".")) -> Config:
    """Build and validate a Config from parsed YAML; a hardware.profile file is looked up relative to ``where``."""
    if not isinstance(raw, dict):
        raise TraceanaError(f"{source}: expected a mapping of sections (model, parallel, hardware, ...)")
    for required in ("model", "parallel", "hardware"):
        if required not in raw:
            raise TraceanaError(f"{source}: missing section {required!r}")
    if "profile" in raw:
        raise TraceanaError(f"{source}: profile: belongs in the hardware section (hardware: {{profile: h100}})")
    raw, profile = _with_profile(raw, source, where)
    # the source is set after the build: a string field is read case-insensitively (lower-cased), a path is not
    cfg = dataclasses.replace(_build(Config, raw, source, ""), source=source, profile=profile)
    validate(cfg)
    return cfg


def _with_profile(raw: dict[str, Any], source: str, where: Path) -> tuple[dict[str, Any], Profile | None]:
    """The config with its hardware profile's hardware and calibration defaults under what it writes itself, and
    the profile (None when hardware.profile is not given)."""
    name = raw["hardware"].get("profile") if isinstance(raw["hardware"], dict) else None
    if name is None:
        return raw, None
    if not isinstance(name, str):
        raise TraceanaError(f"{source}: hardware.profile: expected a built-in name or a file, got {name!r}")
    builtin = PROFILES / f"{name.lower()}.yaml"
    path = builtin if "/" not in name and not name.endswith((".yaml", ".yml")) else where / name
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
        raise TraceanaError(f"{source}: hardware.profile={name!r}: no built-in profile of that name ({known}) "
                            f"and no file {path}")
    data = read_yaml(path)
    data.pop("measured", None)  # what `traceana calibrate` measured, for people: the values it set are above
    borrowed = data.pop("compute_tables", None)
    if borrowed is not None:  # another device's measured GEMM and attention tables (the same silicon)
        other = PROFILES / f"{borrowed}.yaml"
        if not isinstance(borrowed, str) or not other.is_file():
            raise TraceanaError(f"{path}: compute_tables={borrowed!r}: not a built-in profile")
        tables = read_yaml(other)
        for key in ("gemm_us", "attention_us"):
            data.setdefault(key, tables.get(key, []))
    defaults = {section: data.pop(section, None) or {} for section in ("hardware", "calibration")}
    if "launch_us" in data:  # the profile's launch cost is the calibration default it gives
        defaults["calibration"].setdefault("launch_us", data["launch_us"])
    own = {name: defaults["calibration"].get(name, getattr(Calibration, name))
           for name in ("matmul_efficiency", "memory_efficiency")}
    profile = _build(Profile, {**data, **own}, str(path), "")
    profile = dataclasses.replace(profile, name=str(data.get("name")), source=str(data.get("source")))  # as written
    _check_tables(profile, path)
    merged = dict(raw)
    for section, values in defaults.items():
        merged[section] = _merge(values, raw.get(section) or {})
    return merged, profile


def profile_hardware(name: str, where: Path = Path(".")) -> Hardware:
    """The hardware section of profile ``name`` (a built-in name or a YAML file, as ``hardware.profile`` takes):
    the device's data-sheet peaks, for a report that needs no job config (`traceana kernels --roofline`)."""
    raw, _ = _with_profile({"hardware": {"profile": name}}, "--profile", where)
    hardware = _build(Hardware, raw["hardware"], f"profile {name}", "hardware.")
    if not hardware.hbm_bandwidth_gb_per_s:
        raise TraceanaError(f"profile {name}: hardware.hbm_bandwidth_gb_per_s is not set (the roofline needs it)")
    return hardware


def profile_for_device(device: str | None) -> str | None:
    """The built-in profile whose ``hardware.device`` ('H200') is a word of the device name a trace gives ('NVIDIA
    H200'), or None."""
    import re

    for path in sorted(PROFILES.glob("*.yaml")):
        model = (read_yaml(path).get("hardware") or {}).get("device")
        if device and model and re.search(rf"\b{re.escape(str(model))}\b", device, re.IGNORECASE):
            return path.stem
    return None


# A profile table's columns: how many each row has, and which may be zero (attention's causal flag; a measured
# point's kernel count and spread); every other value is a size or a time, so positive.
TABLE_COLUMNS = {"gemm_us": (4, ()), "gemm_measured_us": (6, (4, 5)), "attention_us": (7, (4,)),
                 "memory_gb_per_s": (2, ()), "optimizer_measured": (2, ())}


def _check_tables(profile: Profile, path: Path) -> None:
    """One line naming the row and column of a table value no device can have (the tables are read in logarithms
    and ratios: a zero or negative size or time would be a math error, or a silently wrong estimate)."""
    for name, (width, may_be_zero) in TABLE_COLUMNS.items():
        for i, row in enumerate(getattr(profile, name)):
            if len(row) != width:
                raise TraceanaError(f"{path}: {name}[{i}]: expected {width} values, got {len(row)}")
            for j, value in enumerate(row):
                if value < 0 or (value == 0 and j not in may_be_zero):
                    raise TraceanaError(f"{path}: {name}[{i}][{j}]={value}: must be "
                                        f"{'>= 0' if j in may_be_zero else 'positive'}")
            if name == "attention_us" and row[6] <= row[5]:
                raise TraceanaError(f"{path}: attention_us[{i}]: forward+backward {row[6]} µs is not longer than "
                                    f"the forward's {row[5]} µs")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's top-level mapping, or a one-line error naming the file. Read with libyaml's safe loader
    where PyYAML was built with it (8x the pure-Python one: a profile's tables are 0.03 s apiece otherwise)."""
    try:
        raw = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise TraceanaError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise TraceanaError(f"{path}: not a UTF-8 text file (byte {exc.start}); a config is YAML text") from None
    except yaml.YAMLError as exc:
        raise TraceanaError(f"{path}: not valid YAML ({first_line(exc)})") from None
    if not isinstance(raw, dict):
        raise TraceanaError(f"{path}: expected a mapping of sections (model, parallel, hardware, ...)")
    return raw


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def _build(cls: type, data: Any, source: str, where: str) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, converting by annotation; errors name ``where.field``."""
    if not isinstance(data, dict):
        raise TraceanaError(f"{source}: {where.rstrip('.') or 'top level'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise TraceanaError(f"{source}: {where}{unknown[0]}: unknown field (known: {', '.join(fields)})")
    values = {}
    for name, value in data.items():
        values[name] = _convert(hints[name], value, source, f"{where}{name}")
    missing = [n for n, f in fields.items() if n not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise TraceanaError(f"{source}: {where}{missing[0]}: required field missing")
    return cls(**values)


def _convert(hint: Any, value: Any, source: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _convert(option, value, source, where)
            except TraceanaError as exc:
                errors.append(exc)
        raise errors[0]
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, source, f"{where}.")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise TraceanaError(f"{source}: {where}: expected a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_convert(item, v, source, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise TraceanaError(f"{source}: {where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceanaError(f"{source}: {where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise TraceanaError(f"{source}: {where}: expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TraceanaError(f"{source}: {where}: expected a string, got {value!r}")
        return value.lower()
    raise TypeError(f"unsupported annotation {hint!r}")  # a bug in this module, not user input


MAX_SIZE = 10**9  # no model or parallel size (hidden, seq_len, vocab, batch, ...) comes near; beyond it is a typo


def _fail(cfg: Config, message: str) -> typing.NoReturn:
    raise TraceanaError(f"{cfg.source}: {message}")


def validate(cfg: Config) -> None:
    """Cross-field checks; each failure names the field(s) at fault."""
    m, p, h, c = cfg.model, cfg.parallel, cfg.hardware, cfg.calibration
    for section, obj in (("model", m), ("parallel", p), ("hardware", h)):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                if f.name not in ZERO_ALLOWED:
                    _fail(cfg, f"{section}.{f.name}={value}: must be positive")
                if value < 0:
                    _fail(cfg, f"{section}.{f.name}={value}: must be >= 0")
            if isinstance(value, int) and section != "hardware" and value > MAX_SIZE:
                _fail(cfg, f"{section}.{f.name}={value}: beyond any real training job (at most {MAX_SIZE:.0e})")
    for name, links, low in (("bandwidth_gb_per_s", h.bandwidth_gb_per_s, "positive"), ("latency_us", h.latency_us,
                                                                                     ">= 0")):
        for side in ("intra", "inter"):
            value = getattr(links, side)
            if value < 0 or (value == 0 and low == "positive"):
                _fail(cfg, f"hardware.{name}.{side}={value}: must be {low}")
    if m.hd * m.heads == 0 or (m.head_dim is None and m.hidden % m.heads):
        _fail(cfg, f"model.hidden={m.hidden} is not divisible by model.heads={m.heads} (or give model.head_dim)")
    if m.heads % m.kv:
        _fail(cfg, f"model.kv_heads={m.kv} does not divide model.heads={m.heads}")
    if m.experts:
        if m.moe_topk < 1 or m.moe_topk > m.experts:
            _fail(cfg, f"model.moe_topk={m.moe_topk}: must be between 1 and model.experts={m.experts}")
        if m.first_dense_layers >= m.layers:
            _fail(cfg, f"model.first_dense_layers={m.first_dense_layers} leaves no MoE layer of {m.layers}")
        if m.capacity_factor < 1:
            _fail(cfg, f"model.capacity_factor={m.capacity_factor}: must be >= 1 (1 = perfectly balanced routing)")
        _validate_expert_load(cfg)
    elif m.expert_load is not None:
        _fail(cfg, "model.expert_load: a dense model (model.experts is 0) routes no tokens")
    if p.pp > m.layers:
        _fail(cfg, f"parallel.pp={p.pp} exceeds model.layers={m.layers}")
    if p.zero not in (0, 1, 2, 3):
        _fail(cfg, f"parallel.zero={p.zero}: must be 0, 1, 2 or 3")
    if p.zero_shard is not None and (p.zero != 3 or p.dp % p.zero_shard):
        _fail(cfg, f"parallel.zero_shard={p.zero_shard}: needs zero: 3 and must divide parallel.dp={p.dp}")
    if p.global_batch % (p.dp * p.micro_batch):
        _fail(cfg, f"parallel.global_batch={p.global_batch} is not divisible by parallel.dp x parallel.micro_batch "
                   f"= {p.dp} x {p.micro_batch}")
    if p.ep > 1 and not m.experts:
        _fail(cfg, f"parallel.ep={p.ep} but model.experts is 0 (a dense model has no expert parallelism)")
    if m.experts and m.experts % p.ep:
        _fail(cfg, f"parallel.ep={p.ep} does not divide model.experts={m.experts}")
    if m.heads % p.tp or (m.kv % p.tp and p.tp % m.kv):
        _fail(cfg, f"parallel.tp={p.tp} does not divide model.heads={m.heads} / kv_heads={m.kv}")
    if m.cross_entropy not in CROSS_ENTROPY_KINDS:
        _fail(cfg, f"model.cross_entropy={m.cross_entropy!r}: choose one of {', '.join(CROSS_ENTROPY_KINDS)}")
    if m.moe_weighting not in MOE_WEIGHTING:
        _fail(cfg, f"model.moe_weighting={m.moe_weighting!r}: choose one of {', '.join(MOE_WEIGHTING)}")
    if cfg.hardware.collectives not in COLLECTIVES:
        _fail(cfg, f"hardware.collectives={cfg.hardware.collectives!r}: choose one of {', '.join(COLLECTIVES)}")
    if p.cp_algo not in CP_ALGOS:
        _fail(cfg, f"parallel.cp_algo={p.cp_algo!r}: choose one of {', '.join(CP_ALGOS)}")
    if m.seq_len % p.cp:
        _fail(cfg, f"parallel.cp={p.cp} does not divide model.seq_len={m.seq_len}")
    if p.cp_algo == "ulysses" and (m.heads // p.tp) % p.cp:
        _fail(cfg, f"parallel.cp={p.cp} (ulysses) does not divide the {m.heads // p.tp} heads per TP rank")
    try:
        p.layout.validate()
    except TraceanaError as exc:
        _fail(cfg, f"parallel: {exc}")
    if h.devices is not None and h.devices != p.world_size:
        _fail(cfg, f"hardware.devices={h.devices} but parallel tp x cp x dp x pp = {p.tp} x {p.cp} x {p.dp} x "
                   f"{p.pp} = {p.world_size}")
    if p.world_size > h.devices_per_node and p.world_size % h.devices_per_node:
        _fail(cfg, f"{p.world_size} devices do not fill whole nodes of hardware.devices_per_node="
                   f"{h.devices_per_node}")
    _validate_schedule(cfg)
    for name in cfg.precision.fp8:
        if name not in FP8_MATMULS:
            _fail(cfg, f"precision.fp8: {name!r}: choose from {', '.join(FP8_MATMULS)}")
    if cfg.precision.fp8 and h.peak_tflops_fp8 is None:
        _fail(cfg, "precision.fp8 needs hardware.peak_tflops_fp8 (or a hardware.profile that has it)")
    if p.tp_comm_overlap and not (p.sequence_parallel and p.tp > 1):
        _fail(cfg, "parallel.tp_comm_overlap needs parallel.sequence_parallel and parallel.tp > 1")
    for name in ("dp", "tp", "ep", "cp"):
        if not 0 <= c.overlap.of(name) <= 1:
            _fail(cfg, f"calibration.overlap.{name}={getattr(c.overlap, name)}: must be between 0 and 1")
    for name in ("matmul_efficiency", "memory_efficiency", "optimizer_efficiency"):
        if getattr(c, name) is not None and not 0 < getattr(c, name) <= 1:
            _fail(cfg, f"calibration.{name}={getattr(c, name)}: must be in (0, 1]")
    if c.host_overlap not in ("micro_batch", "pass"):
        _fail(cfg, f"calibration.host_overlap={c.host_overlap!r}: choose micro_batch or pass")
    if not 0 <= c.ep_bubble_overlap_ratio <= 1:
        _fail(cfg, f"calibration.ep_bubble_overlap_ratio={c.ep_bubble_overlap_ratio}: must be between 0 and 1")
    for name in ("safety_buffer_mb", "tp_shardable_overhead_mb", "cuda_context_mb", "nccl_buffer_mb",
                 "nccl_channels", "step_overhead_ms", "host_us_per_layer",
                 "host_us_per_collective", "host_us_per_backward_layer", "host_us_per_step", "idle_us_per_layer",
                 "launch_us", "host_us_per_micro_batch"):
        if (getattr(c, name) or 0) < 0:
            _fail(cfg, f"calibration.{name}={getattr(c, name)}: must be >= 0")


def _validate_expert_load(cfg: Config) -> None:
    load, ep = cfg.model.expert_load, cfg.parallel.ep
    if load is None:
        return
    if len(load) != ep:
        _fail(cfg, f"model.expert_load has {len(load)} values: give one per EP rank (parallel.ep={ep})")
    if min(load) <= 0:
        _fail(cfg, f"model.expert_load={list(load)}: every EP rank's load must be positive")
    if abs(sum(load) / ep - 1) > 0.01:
        _fail(cfg, f"model.expert_load={list(load)}: loads relative to a balanced split average 1, these "
                   f"{sum(load) / ep:.3g}")
    if cfg.model.capacity_factor != 1:
        _fail(cfg, f"model.expert_load is dropless routing, model.capacity_factor={cfg.model.capacity_factor:g} "
                   "pads every expert to capacity: give one of them")


def at_load(cfg: Config, load: float) -> Config:
    """``cfg`` as one EP rank whose experts compute ``load`` x a balanced share of the routed tokens sees it: the
    same rows an expert padded to that capacity computes, so it is priced as ``capacity_factor: load`` (unchecked:
    a cold rank's load is below 1)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, capacity_factor=load, expert_load=None))


def _validate_schedule(cfg: Config) -> None:
    m, p, s = cfg.model, cfg.parallel, cfg.schedule
    if s.kind not in SCHEDULES:
        _fail(cfg, f"schedule.kind={s.kind!r}: choose one of {', '.join(SCHEDULES)}")
    if s.kind == "zb-v" and p.vpp not in (1, 2):
        _fail(cfg, f"parallel.vpp={p.vpp}: zb-v always runs 2 model chunks per stage (leave vpp at 1 or 2)")
    problem = schedule_problem(s.kind, p.pp, p.micro_batches, 2 if s.kind == "zb-v" else p.vpp)
    if problem:
        _fail(cfg, problem)
    if s.p2p not in P2P_MODES:
        _fail(cfg, f"schedule.p2p={s.p2p!r}: choose one of {', '.join(P2P_MODES)}")
    if s.p2p == "blocking" and s.kind not in BLOCKING_KINDS:
        _fail(cfg, f"schedule.p2p=blocking is modelled for {', '.join(BLOCKING_KINDS)}, not {s.kind}: its "
              "implementations batch a step's sends or post them asynchronously")
    if s.recompute.kind not in RECOMPUTE_KINDS:
        _fail(cfg, f"schedule.recompute.kind={s.recompute.kind!r}: choose one of {', '.join(RECOMPUTE_KINDS)}")
    for module in s.recompute.modules or ():
        if module not in RECOMPUTE_MODULES:
            _fail(cfg, f"schedule.recompute.modules: {module!r}: choose from {', '.join(RECOMPUTE_MODULES)}")
    if s.recompute.modules is not None and s.recompute.kind != "selective":
        _fail(cfg, f"schedule.recompute.modules needs kind: selective (kind is {s.recompute.kind})")
    if "mla_up_proj" in (s.recompute.modules or ()) and not m.mla:
        _fail(cfg, "schedule.recompute.modules: mla_up_proj needs an MLA model (model.kv_lora_rank)")
    if s.stage_layers is not None and s.layer_offset is not None:
        _fail(cfg, "schedule.stage_layers and schedule.layer_offset both given; use one")
    if isinstance(s.stage_layers, str) and s.stage_layers != "ppb":
        _fail(cfg, f"schedule.stage_layers={s.stage_layers!r}: a list of layer counts, or 'ppb' to balance")
    if s.stage_layers == "ppb" and (s.kind not in ("gpipe", "1f1b", "zb-h1")):
        _fail(cfg, f"schedule.stage_layers=ppb balances one model chunk per stage (gpipe, 1f1b, zb-h1), not {s.kind}")
    chunks = p.pp * (2 if s.kind == "zb-v" else p.vpp)
    if chunks > m.layers and not isinstance(s.stage_layers, tuple):
        what = f"parallel.pp={p.pp}" + (f" x parallel.vpp={p.vpp} = {chunks} model chunks" if chunks > p.pp
                                         else " stages")
        _fail(cfg, f"{what} but model.layers={m.layers}: give schedule.stage_layers, one count per chunk, with "
                   f"empty chunks (0) where there are fewer layers than chunks")
    try:
        balance.recompute_mask(s.recompute.layers, m.layers)
        if isinstance(s.stage_layers, tuple):  # one count per chunk may leave a chunk empty (Llama 3's first, last)
            per_chunk = len(s.stage_layers) == chunks > p.pp
            counts = balance.from_stage_layers(s.stage_layers, m.layers, len(s.stage_layers), allow_empty=per_chunk)
        elif s.layer_offset is not None:
            counts = balance.from_layer_offset(s.layer_offset, m.layers, p.pp)
        else:
            counts = None
    except TraceanaError as exc:
        _fail(cfg, str(exc))
    if counts is not None and len(counts) not in (p.pp, chunks):
        _fail(cfg, f"schedule.stage_layers has {len(counts)} entries; give one per stage (pp={p.pp}) or one per "
                   f"model chunk ({chunks})")
    if counts is not None and len(counts) == p.pp and min(counts) < chunks // p.pp:
        _fail(cfg, f"schedule: stages of {list(counts)} layers cannot fill {chunks // p.pp} chunks each")
