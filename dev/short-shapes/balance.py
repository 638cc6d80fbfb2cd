"""No GPU: how evenly a persistent causal grid's fixed stride shares out the items
(dev/short-shapes/PLAN.md). Each of 132 blocks takes every 132nd item of chapter 7's
order (item_of: within sections of heads, every head's heaviest row block first); an
item costs its key tiles plus one (its start and end). Printed: the busiest block's
share over the mean, for sections sized for 50, 16, 8 and 4 MB of K and V."""
import math

from kernels.chapters.ch07_hopper_attention import section_heads
import kernels.chapters.ch07_hopper_attention as ch


def busiest_over_mean(B, H, S, D, heads_a_section, blocks=132, rows=192, block_n=128):
    heads, row_blocks = B * H, math.ceil(S / rows)
    load = [0.0] * blocks
    for item in range(row_blocks * heads):
        first = item // (heads_a_section * row_blocks) * heads_a_section
        here, r = min(heads_a_section, heads - first), item - first * row_blocks
        row0 = (row_blocks - 1 - r // here) * rows
        load[item % blocks] += math.ceil(min(S, row0 + rows) / block_n) + 1
    return max(load) / (sum(load) / blocks)


for B, H, S, D in [(32, 32, 512, 64), (16, 32, 1024, 64), (8, 32, 2048, 64),
                   (4, 32, 4096, 64), (32, 16, 512, 128), (16, 16, 1024, 128),
                   (8, 16, 2048, 128), (4, 16, 4096, 128)]:
    cells = []
    for mb in (50, 16, 8, 4):
        with ch.l2_section_bytes(mb * 2**20):
            n = section_heads(B * H, 1, S, D)
        cells.append(f"{mb} MB ({n} heads): {busiest_over_mean(B, H, S, D, n):.3f}")
    print(f"{B}, {H}, {S}, {D}: " + "; ".join(cells))
