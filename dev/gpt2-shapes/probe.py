"""Chapter 7's forms at GPT-2's attention shapes (an experiment; nothing to land).

Chapter 8 times one layer's attention of its GPT-2-small-shaped model alone (12 heads of
64, causal, 1024 tokens): recorded on the H200 (at 7eff9bd and 475e832), the lean call
takes 36.0-36.4 µs at batch 4 against cuDNN's 32.5-32.9, and is level at batches 1 and 8.
These shapes (48 heads of 1024 rows at batch 4) are not in the suite, from whose records
the lean call's choice of form is made. Here every form it chooses among is checked,
then timed in turns beside the lean call and SDPA's default (chapter 7's timed_beside),
at GPT-2's shapes and their neighbours, twice; the lean call's pick is logged. With
``wider``: at more calls of few heads (wider.json), for schedule_model.py.

    python3 dev/gpt2-shapes/probe.py [wider]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside, log, rounds  # noqa: E402


def main():
    import torch

    from kernels import launch
    from kernels.bench import Shape
    from kernels.chapters import ch07_hopper_attention as ch

    if sys.argv[1:] == ["wider"]:  # more calls of few heads, for the choice's model
        shapes = [Shape(*s) for s in (
            (1, 16, 2048, 2048, 64, True), (2, 16, 2048, 2048, 64, True),
            (2, 8, 4096, 4096, 64, True), (3, 12, 1536, 1536, 64, True),
            (4, 12, 512, 512, 64, True), (8, 12, 512, 512, 64, True),
            (2, 16, 1024, 1024, 128, True), (4, 16, 1024, 1024, 128, True),
            (2, 16, 2048, 2048, 128, True), (1, 32, 2048, 2048, 128, True),
            (4, 8, 2048, 2048, 128, True), (2, 12, 1024, 1024, 64, False))]
    else:
        shapes = [Shape(B, 12, 1024, 1024, 64, True) for B in (1, 2, 4, 6, 8)] + [
            Shape(4, 12, 1024, 1024, 64, False), Shape(4, 12, 2048, 2048, 64, True),
            Shape(4, 16, 1024, 1024, 64, True)]
    for s in shapes:
        q = torch.empty(s.B, s.H, s.S_q, s.D, device="cuda", dtype=torch.float16)
        log(f"{s.label()}: the lean call picks {launch.plan_for(q, q, q, s.causal).kernel}")

    def contenders(shape):
        return {"lean call": launch.attention,
                **{name: ch.KERNELS[name] for name in launch.forms(shape.D, shape.causal)}}

    rounds(shapes, beside(contenders), "wider.json" if sys.argv[1:] == ["wider"] else "probe.json")


if __name__ == "__main__":
    main()
