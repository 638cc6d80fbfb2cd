"""One process of the exit-abort hunt: a two-layer GPT-2-shaped model, fp16, its forward
run with ``attend`` (book or sdpa), then, as asked: captured in a CUDA graph and
replayed (graph), a few generation steps profiled by torch (profile; profile6: six
times), timed by kernels.bench through Numba (time); then exit.
  python3 dev/exit-abort/variant.py book graph profile
"""
import sys

import torch

from kernels import models

parts = set(sys.argv[1:])
attend = models.book_attend if "book" in parts else models.sdpa_attend
model = models.gpt2_small(layers=2)
tokens = torch.randint(0, 50257, (1, 256), device="cuda")
with torch.no_grad():
    model(tokens, attend)
    if "graph" in parts:
        graph, _ = models._graphed(lambda: model(tokens, attend))
        graph.replay()
    sessions = 6 if "profile6" in parts else 1 if "profile" in parts else 0
    picks = [torch.randint(0, 50257, (1, 1), device="cuda") for _ in range(4)]
    for _ in range(sessions):  # model_measurements profiles six times (3 passes, 2 paths)
        models.step_device_ms(model, tokens, picks, attend)
    if "time" in parts:  # kernels.bench's timing: Numba's CUDA events and L2-flush copies
        from kernels.bench import time_alternating
        time_alternating({"forward": lambda: model(tokens, attend)}, rounds=2)
torch.cuda.synchronize()
print("done", sorted(parts), flush=True)
