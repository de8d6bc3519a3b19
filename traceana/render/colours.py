"""The one palette of every picture, static (matplotlib) and interactive (Bokeh): one colour per dim everywhere,
compute grey, idle near white, and colours no dim uses for what must not read as a dim's communication (idle causes,
op families, the critical path). Hex, so that the interactive page needs no matplotlib to name them (the values
are matplotlib's tab10 and grey levels)."""

from __future__ import annotations

from traceana.analyses.breakdown import DIM_LANES, WAITS
from traceana.analyses.idle import CAUSES

COMP_COLOR = "#8c8c8c"  # grey 0.55
IDLE_COLOR = "#ededed"  # grey 0.93
# tab: blue, purple, orange, green, red, brown
DIM_COLORS = dict(zip(DIM_LANES, ["#1f77b4", "#9467bd", "#ff7f0e", "#2ca02c", "#d62728", "#8c564b"], strict=True))
PART_COLORS = {"COMP": COMP_COLOR, **dict(zip(WAITS, DIM_COLORS.values(), strict=True)), "IDLE": IDLE_COLOR}
# tab: pink, cyan, olive; gold; grey 0.8
IDLE_CAUSE_COLORS = dict(zip(CAUSES, ["#e377c2", "#17becf", "#bcbd22", "#ffd700", "#cccccc"], strict=True))
CRITICAL_PATH_COLOR = "#000000"
# host ranges over a timeline's device lanes: CPU ops, other ranges (nn.Module, user, NVTX); the launch lines
HOST_COLORS = {"cpu_op": "#b3b3b3", "range": "#d9d9d9"}  # grey 0.7, 0.85
LAUNCH_COLOR = "#404040"  # grey 0.25
# the roofline's op families (tab: blue, purple, orange, green, red, brown; grey 0.5), and any other family
FAMILY_COLORS = {"gemm": "#1f77b4", "attention": "#9467bd", "elementwise": "#ff7f0e", "normalization": "#2ca02c",
                 "softmax": "#d62728", "reduction": "#8c564b", "copy": "#808080"}
OTHER_FAMILY_COLOR = "#4d4d4d"  # grey 0.3
# the two sides of a comparison: run A or the measurement (grey 0.35), run B or the estimate (tab:cyan)
FIRST_COLOR = "#595959"
SECOND_COLOR = "#17becf"
UNKNOWN_DIM_COLOR = "#7f7f7f"  # tab:gray: a link whose dim is not known
