"""Every kernel the lean call can choose on this GPU, launched once at small odd shapes,
for compute-sanitizer to watch:

    compute-sanitizer --tool racecheck --report-api-errors no python3 tools/sanitize_forms.py

(memcheck, racecheck and synccheck in turn: tools/gpu_check.sh runs all three). On an H100
or H200: each form of chapter 7's kernel the choice ranks (kernels.launch.forms) at every
head dim, causal and not; chapter 8's two split-keys kernels; chapter 9's backward steps
the lean call takes (the Hopper step from 128 rows and keys, the separate dQ step below
that and where determinism is asked for). Elsewhere, the kernels its choice names there.
Each call is checked against float64 too (kernels.check.check_attention), so a kernel
that the tool slows or perturbs into a wrong answer is caught. Prints one line a launch.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: (B, H, S_q, S_k): one block of rows and a ragged key tile, and more rows than one
#: block with fewer keys (causal rows that see no key); small, as the tools slow every
#: shared-memory access a hundredfold
SHAPES = [(1, 3, 33, 33), (1, 2, 200, 150)]
HEAD_DIMS = (64, 96, 128, 256)


def forward_kernels(gpu):
    """(label, attention function, head dims) of the forward kernels the lean call may
    launch on ``gpu`` for more than chapter 8's rows."""
    from kernels import chapter_module, gpus, launch

    chapter, name = gpus.fastest(gpu.compute_capability)
    if chapter != 7:
        module = chapter_module(chapter)
        return [(name, module.KERNELS[name], getattr(module, "HEAD_DIMS", HEAD_DIMS))]
    ch07 = chapter_module(7)
    names = dict.fromkeys(n for D in HEAD_DIMS for causal in (False, True)
                          for n in launch.forms(D, causal))
    return [(n, ch07.KERNELS[n], ch07.head_dims(n)) for n in names]


def main() -> int:
    import torch

    from kernels import chapter_module, gpus, launch
    from kernels.check import check_attention

    gpu = gpus.current()
    print(f"{gpu.name}: the lean call's kernels under the sanitizer", flush=True)
    launches = 0
    for name, fn, head_dims in forward_kernels(gpu):
        for D in head_dims:
            for causal in (False, True):
                for B, H, S_q, S_k in SHAPES:
                    result = check_attention(fn, B, H, S_q, S_k, D, causal)
                    launches += 1
                    print(f"  {name} D={D} causal={causal} {(B, H, S_q, S_k)}: "
                          f"rel err {result.rel_err:.1e}", flush=True)
    ch08 = chapter_module(8)
    for name, fn in ch08.KERNELS.items():
        for D in ch08.HEAD_DIMS:
            for S_q, S_k in ((1, 333), (5, 1000)):
                result = check_attention(fn, 2, 4, S_q, S_k, D, True)
                launches += 1
                print(f"  {name} D={D} (2, 4, {S_q}, {S_k}): rel err {result.rel_err:.1e}",
                      flush=True)
    ch09 = chapter_module(9)
    for D in ch09.HEAD_DIMS:
        for S, deterministic in ((33, False), (200, False), (200, True)):
            torch.use_deterministic_algorithms(deterministic)
            q, k, v = (torch.randn(1, 3, S, D, device="cuda", dtype=torch.float16,
                                   requires_grad=True) for _ in range(3))
            launch.attention(q, k, v, causal=True).backward(torch.randn_like(q))
            torch.cuda.synchronize()
            assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
            step = ch09.backward_step(D, S, S, *gpu.limits()[:2], deterministic)
            launches += 1
            print(f"  backward {step} D={D} S={S}: gradients finite", flush=True)
    torch.use_deterministic_algorithms(False)
    print(f"{launches} calls checked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
