"""An 8-rank TP2 x PP2 x DP2 toy GPT, Megatron style, trained one step at a time with a 1F1B pipeline schedule.

Layout tp=2,pp=2,dp=2, order tp-cp-ep-dp-pp (rank = tp + 2*dp + 4*pp). 4 pre-LN transformer layers (hidden 256,
4 heads, FFN 1024), 2 per stage; sequence 128, micro-batch 1 sequence, 4 micro-batches per step per DP replica.
Stage 0 also holds a token embedding (vocab 1024), stage 1 an LM head and cross-entropy, both replicated over TP.
Tensor parallel as in Megatron's mappings: attention QKV and FFN-up are column parallel (f: backward AllReduce of
the input gradient), attention-out and FFN-down row parallel (g: forward AllReduce).
Per rank per step, M = 4 micro-batches, L = 2 layers per stage:
- TP AllReduce: 2 forward + 2 backward per layer per micro-batch = 4 * L * M = 32;
- PP: M activations and M gradients (isend / irecv, waited per schedule slot as Megatron does) = 2 * M = 8;
- DP: the stage's gradients as one flat bucket = 1 AllReduce.
1F1B (Megatron's forward_backward_pipelining_without_interleaving): stage 0 warms up with pp - 1 = 1 forward, then
alternates one forward / one backward, then drains; the last stage runs forward and backward back to back.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import Context, StepFn
from mappings import copy_to_region, reduce_from_region
from torch import nn
from training import all_reduce_gradients, sgd

HIDDEN, HEADS, FFN, SEQ, VOCAB = 256, 4, 1024, 128, 1024
LAYERS_PER_STAGE, MICRO_BATCHES = 2, 4

Transfer = tuple[torch.Tensor | None, int | None]  # (tensor, peer global rank)


class ParallelLayer(nn.Module):
    """Pre-LN transformer layer whose attention heads and FFN columns are split over the TP group."""

    def __init__(self, tp_group: dist.ProcessGroup, tp_size: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)  # same seed on DP replicas of this shard: replicas start equal
        self.tp_group, self.heads = tp_group, HEADS // tp_size
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN // tp_size)  # column parallel
        self.attn_out = nn.Linear(HIDDEN // tp_size, HIDDEN, bias=False)  # row parallel
        self.up = nn.Linear(HIDDEN, FFN // tp_size)  # column parallel
        self.down = nn.Linear(FFN // tp_size, HIDDEN, bias=False)  # row parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [SEQ, HIDDEN], replicated over TP
        q, k, v = self.qkv(copy_to_region(self.ln1(x), self.tp_group)).chunk(3, dim=-1)
        q, k, v = (t.view(SEQ, self.heads, -1).transpose(0, 1) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(SEQ, -1)
        x = x + reduce_from_region(self.attn_out(attn), self.tp_group)
        hidden = F.gelu(self.up(copy_to_region(self.ln2(x), self.tp_group)))
        return x + reduce_from_region(self.down(hidden), self.tp_group)


def build(ctx: Context) -> StepFn:
    tp_group, pp_group, dp_group = ctx.groups["TP"], ctx.groups["PP"], ctx.groups["DP"]
    c = ctx.coords
    stage, last = c["pp"], ctx.layout.pp - 1
    prev_rank = ctx.ranks["PP"][stage - 1] if stage > 0 else None
    next_rank = ctx.ranks["PP"][stage + 1] if stage < last else None
    first_layer = stage * LAYERS_PER_STAGE
    layers = nn.Sequential(*(ParallelLayer(tp_group, ctx.layout.tp, seed=1000 * (first_layer + i) + c["tp"])
                             for i in range(LAYERS_PER_STAGE)))
    torch.manual_seed(stage)
    embedding = nn.Embedding(VOCAB, HIDDEN) if stage == 0 else None
    head = nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)) if stage == last else None
    params = [p for m in (layers, embedding, head) if m is not None for p in m.parameters()]
    data = torch.Generator().manual_seed(100 + c["dp"])  # every stage of a pipeline draws the same tokens
    warmup = min(ctx.layout.pp - stage - 1, MICRO_BATCHES)

    def exchange(send: list[Transfer], recv: list[Transfer]) -> None:
        """Megatron's p2p_communication: post the isends and irecvs of one schedule slot, then wait for all.
        A transfer whose peer is None (no previous / next stage) is skipped."""
        works = [dist.isend(t, dst=r, group=pp_group) for t, r in send if r is not None]
        works += [dist.irecv(t, src=r, group=pp_group) for t, r in recv if r is not None]
        for work in works:
            work.wait()

    def step() -> None:
        tokens = torch.randint(VOCAB, (MICRO_BATCHES, SEQ + 1), generator=data)
        received = [torch.empty(SEQ, HIDDEN) for _ in range(MICRO_BATCHES)]  # activations from the previous stage
        grads = [torch.empty(SEQ, HIDDEN) for _ in range(MICRO_BATCHES)]  # output gradients from the next stage
        inputs: list[torch.Tensor] = []  # per micro-batch: this stage's input (a leaf on later stages)
        outputs: list[torch.Tensor] = []  # per micro-batch: the stage output, or the loss on the last stage

        def forward(i: int) -> torch.Tensor:
            x = embedding(tokens[i, :-1]) if embedding is not None else received[i].requires_grad_(True)
            inputs.append(x)
            y = layers(x)
            outputs.append(F.cross_entropy(head(y), tokens[i, 1:]) / MICRO_BATCHES if head is not None else y)
            return y.detach()

        def backward(i: int) -> torch.Tensor | None:
            outputs[i].backward(None if next_rank is None else grads[i])
            return inputs[i].grad if prev_rank is not None else None  # stage 0's input is the embedding output

        # Megatron's forward_backward_pipelining_without_interleaving, one exchange per p2p call it makes.
        steady = MICRO_BATCHES - warmup
        for i in range(warmup):
            exchange([], [(received[i], prev_rank)])  # recv_forward
            exchange([(forward(i), next_rank)], [])  # send_forward
        if steady:
            exchange([], [(received[warmup], prev_rank)])  # recv_forward
        for i in range(steady):  # one forward, one backward
            exchange([(forward(warmup + i), next_rank)], [(grads[i], next_rank)])  # send_forward_recv_backward
            grad = backward(i)
            following = [(received[warmup + i + 1], prev_rank)] if i < steady - 1 else []
            exchange([(grad, prev_rank)], following)  # send_backward_recv_forward, or send_backward at the end
        for i in range(steady, MICRO_BATCHES):  # cooldown
            exchange([], [(grads[i], next_rank)])  # recv_backward
            exchange([(backward(i), prev_rank)], [])  # send_backward
        all_reduce_gradients(params, dp_group, bucket=True)
        sgd(params)

    return step
