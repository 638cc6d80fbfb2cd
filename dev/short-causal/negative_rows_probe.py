"""Which of TMA's copies takes a row coordinate before the first row: each case in a
process of its own (an illegal instruction ends the context)."""
import subprocess
import sys

CASE = r'''
import sys
sys.argv = ["x"]
src = open("dev/short-causal/rows_from_end.py").read().split("start = time.time()")[0]
exec(src)
store_guard = {store_guard!r}
if store_guard:  # no O store (and no logsumexp) from a consumer whose rows start before 0
    w = ch.WHAT_IFS["rows from the end"]
    ch.WHAT_IFS["rows from the end"] = ch.WhatIf(w.kernel, w.changes + ((ch.STORE_CALL,
        "    if (wg_row0 >= 0) " + ch.STORE_CALL.lstrip()),))
    ch._what_if_compiled.cache_clear()
from_end = ch.what_if_kernel("rows from the end")
c = check_attention(from_end, 1, 3, {S}, {S}, 64, True, lse=True, raise_on_fail=False)
print("S={S} store_guard={store_guard}:", c.summary(), flush=True)
'''
for S, guard in [(768, False), (640, True), (640, False), (700, False)]:
    r = subprocess.run([sys.executable, "-c", CASE.format(S=S, store_guard=guard)],
                       capture_output=True, text=True, timeout=120)
    print(f"S={S} store_guard={guard}: rc={r.returncode}", r.stdout.strip()[-300:],
          r.stderr.strip().splitlines()[-1:] if r.returncode else "", flush=True)
