"""Forms of chapter 7's counter's items (hopper_dynamic_items) with other tile shapes,
for the short causal calls where it trails cuDNN: each a HopperConfig away from it,
registered as a chapter kernel under its own name for the experiment only."""
import dataclasses

from kernels.api import kernel_function
from kernels.chapters import ch07_hopper_attention as ch

BASE = ch.CONFIGS["hopper_dynamic_items"]
VARIANTS = {
    "dyn_two_consumers": dataclasses.replace(BASE, consumers=2),
    "dyn_64_keys": dataclasses.replace(BASE, block_n=64, at_d128=()),
    "dyn_192_keys": dataclasses.replace(BASE, block_n=192, at_d128=(("block_n", 128),)),
    "dyn_stages_3": dataclasses.replace(BASE, stages=3, at_d128=(("block_n", 112),
                                                                ("tma_store", False))),
    "dyn_two_consumers_192_keys": dataclasses.replace(BASE, consumers=2, block_n=192,
                                                      at_d128=(("block_n", 128),)),
    "dyn_two_consumers_stages_3": dataclasses.replace(BASE, consumers=2, stages=3),
}

# FlashAttention-3's own form for causal calls: two consumers of 64 rows (128-row items,
# which a 128-key tile's diagonal cuts the same for both), step 4's overlap and the
# ping-pong turns (hopper_overlap), its items from the counter (its dynamic scheduler)
OVERLAP_VARIANTS = {
    "dyn_overlap": dataclasses.replace(ch.CONFIGS["hopper_overlap"], causal_persistent=True,
                                       dynamic_items=True, rows_from_end=True),
    "dyn_overlap_first_row": dataclasses.replace(ch.CONFIGS["hopper_overlap"],
                                                 causal_persistent=True, dynamic_items=True),
}
for name, cfg in {**VARIANTS, **OVERLAP_VARIANTS}.items():  # tile_shapes.py times VARIANTS
    ch.CONFIGS[name] = cfg
    ch.KERNELS[name] = kernel_function(name, f"Experiment: {name}.", ch.launch_hopper)
