"""One GPU call: does a short last split end the tensor-core decoding kernel's wave sooner?

At the suite's grouped decoding shapes (32 query heads, 8 key/value heads of 128, one
query row a head, a (B, S_k, 8, 128) cache read through views, as kernels.layouts
measures them), chapter 8's split_keys_mma_attention launched three ways, built once and
launched directly (no host work between launches):

- "whole splits": split_plan's one-wave splits with no short last split (the what-if);
- "short last, tail +N": the short last split planned with TAIL_START_STEPS = N;
- "lean call" (kernels.launch.attention, TAIL_START_STEPS as committed) and SDPA's
  default (enable_gqa=True), timed in the same turns.

Each path is checked against the float64 reference (output poisoned with NaN first) and
timed only if it passed (experiment.decoding_probe). Writes $OUT/probe.json.
It runs on the branch's kernels (TAIL_START_STEPS, ``short_last``) with main's
dev/experiment.py, whose decoding helpers came after the branch."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import decoding_probe  # noqa: E402

from kernels import layouts  # noqa: E402
from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(B, S_k, "float16") for S_k in layouts.GQA_LENGTHS for B in layouts.GQA_BATCHES]
SHAPES += [(16, 8192, "bfloat16"), (4, 131072, "bfloat16")]
TAILS = (0, 1, 2, 4)


def variants(base, *_):
    """Whole splits, then the short last split planned with each of TAILS
    (split_launches reads TAIL_START_STEPS)."""
    committed_tail = ch08.TAIL_START_STEPS
    yield "whole splits", dataclasses.replace(base, short_last=False)
    for tail in TAILS:
        ch08.TAIL_START_STEPS = tail
        yield f"short last, tail +{tail}", base
    ch08.TAIL_START_STEPS = committed_tail


decoding_probe(SHAPES, variants)
