"""The counter's items (hopper_dynamic_items) with a second Q slot and the consumers
taking an item's 64-row slices in turn (branch rotate-rows: HopperConfig.q_slots,
rotate_rows), registered as chapter kernels under their own names for the experiment
only. At D = 128 a second Q tile does not fit beside the ring and O's tiles: there they
take one. rotate_rows is the step from one item's slice to the next: 1, the consumer
that took the heaviest slice takes the lightest next; 2, the one that took the
lightest (done first) takes the heaviest next."""
import dataclasses

from kernels.api import kernel_function
from kernels.chapters import ch07_hopper_attention as ch

BASE = ch.CONFIGS["hopper_dynamic_items"]
AT_D128 = BASE.at_d128 + (("q_slots", 1),)
VARIANTS = {
    "dyn_q2": dataclasses.replace(BASE, q_slots=2, at_d128=AT_D128),
    "dyn_rotate": dataclasses.replace(BASE, rotate_rows=1, at_d128=AT_D128),
    "dyn_q2_rotate": dataclasses.replace(BASE, q_slots=2, rotate_rows=1, at_d128=AT_D128),
    "dyn_rotate_back": dataclasses.replace(BASE, rotate_rows=2, at_d128=AT_D128),
    "dyn_q2_rotate_back": dataclasses.replace(BASE, q_slots=2, rotate_rows=2, at_d128=AT_D128),
}
for name, cfg in VARIANTS.items():
    ch.CONFIGS[name] = cfg
    ch.KERNELS[name] = kernel_function(name, f"Experiment: {name}.", ch.launch_hopper)
