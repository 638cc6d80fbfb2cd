"""No GPU: chapter 7's kernel with the overlap of one tile's softmax with the next tile's
Q K^T within each of its three consumers (FlashAttention-4's Hopper forward at D = 64:
192 x 128 tiles, P from registers, the overlap within a warpgroup), compiled by NVRTC:
registers, spills and local memory beside the chapter's kernel and hopper_overlap."""
import dataclasses

from kernels.chapters import ch07_hopper_attention as ch7
from kernels.compile_report import compile_cuda

VARIANTS = {
    "hopper_attention": ch7.CONFIGS["hopper_attention"],
    "three_overlap": dataclasses.replace(ch7.CONFIGS["hopper_attention"], own_keys=False,
                                         overlap=True),
    "hopper_overlap": ch7.CONFIGS["hopper_overlap"],
}
for name, cfg in VARIANTS.items():
    for D in (64, 128):
        row = compile_cuda(ch7.source(cfg, D), ch7.nvrtc_options(cfg, D, "float16"), "sm_90a",
                           f"{name} D={D}")
        print(name, D, {k: v for k, v in row.items() if k not in ("sass", "ptx", "cubin")})
