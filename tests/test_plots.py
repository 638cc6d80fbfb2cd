"""The book's conceptual diagrams (kernels.plots) draw, off screen, what they claim to."""

import math
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from kernels import gpus, plots  # noqa: E402


def texts(fig):
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


@pytest.fixture
def draw():
    figures = []

    def drawn(fig):
        assert isinstance(fig, plt.Figure)
        figures.append(fig)
        return fig

    yield drawn
    for fig in figures:
        plt.close(fig)
    assert not set(plt.get_fignums()) & {f.number for f in figures}


def test_memory_hierarchy_has_an_h100s_levels_and_numbers(draw):
    words = "\n".join(texts(draw(plots.memory_hierarchy())))
    sm = gpus.MULTIPROCESSORS[(9, 0)]
    for level in ("registers", "shared / L1", "L2 cache", "global memory (HBM)"):
        assert level in words
    for number in (f"{sm.registers * 4 // 1024} KB an SM", f"{sm.shared // 1024} KB an SM",
                   "227 KB a block", "50 MB", "132 SMs", "80 GB HBM3", "3.35 TB/s"):
        assert number in words, number


@pytest.mark.parametrize("key_tile", [1, 3, 5])
def test_online_softmax_rescales_where_the_maximum_grows(draw, key_tile):
    scores = plots.ONLINE_SOFTMAX_SCORES
    fig = draw(plots.online_softmax_diagram(scores, key_tile=key_tile))
    boxes = [t for t in texts(fig) if t.startswith("m")]
    tiles = [scores[i:i + key_tile] for i in range(0, len(scores), key_tile)]
    assert len(boxes) == len(tiles)
    m = -math.inf
    for box, tile in zip(boxes, tiles):
        new = max(m, *tile)
        if m == -math.inf:
            assert "exp(−∞) = 0" in box
        elif new > m:
            assert f"= {math.exp(m - new):.2f}" in box
        else:
            assert "no rescale" in box
        m = new
    # the last box's running sum is the row's whole softmax denominator
    total = sum(math.exp(s - max(scores)) for s in scores)
    assert boxes[-1].endswith(f"l = {total:.2f}")


def test_bank_conflicts_counts_the_passes_of_each_layout(draw):
    fig = draw(plots.bank_conflicts())
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["unpadded: 8 passes", "padded: 1 pass", "swizzled: 1 pass"]
    assert {plots._bank_group("unpadded", r) for r in range(8)} == {0}
    for layout in ("padded", "swizzled"):
        assert sorted(plots._bank_group(layout, r) for r in range(8)) == list(range(8))


def test_xor_swizzle_puts_chunk_c_of_row_r_at_c_xor_r(draw):
    fig = draw(plots.xor_swizzle())
    for ax, swizzled in zip(fig.axes, (False, True)):
        for t in ax.texts:
            if re.fullmatch(r"c\d", t.get_text()):
                x, y = t.get_position()
                row, c = int(y - 0.5), int(t.get_text()[1])
                assert x - 0.5 == (c ^ (row % 8) if swizzled else c)
        outlined = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_linewidth() > 2]
        assert len({p.get_x() for p in outlined}) == (8 if swizzled else 1)


def test_ldmatrix_names_every_lane_on_both_sides(draw):
    words = texts(draw(plots.ldmatrix_diagram()))
    for lane in range(32):
        assert words.count(f"lane {lane}") == 2, lane
    for i in range(4):
        assert f"m{i}" in words


@pytest.mark.parametrize("stages", [2, 3])
def test_mbarrier_ring_has_a_full_and_free_barrier_a_slot(draw, stages):
    words = texts(draw(plots.mbarrier_ring(stages=stages, tiles=6)))
    for s in range(stages):
        assert f"full[{s}]" in words and f"free[{s}]" in words
    assert f"full[{stages}]" not in words
    assert f"S = {stages} slots" in " ".join(words)


def test_split_keys_weights_add_up_to_one(draw):
    lse = (2.1, 3.0, 1.4, 2.6)
    words = texts(draw(plots.split_keys_diagram(lse)))
    weights = [float(w.split()[1]) for w in words if w.startswith("weight")]
    assert len(weights) == len(lse)
    assert sum(weights) == pytest.approx(1.0, abs=0.02)
    total = math.log(sum(math.exp(x) for x in lse))
    assert any(f"= {total:.2f}" in w for w in words if w.startswith("combine"))


def test_backward_dataflow_has_each_product(draw):
    words = "\n".join(texts(draw(plots.backward_dataflow())))
    for step in ("δ = rowsum(dO ∘ O)", "S = c Q_i K_jᵀ", "P = exp(S − L_i)", "dP = dO_i V_jᵀ",
                 "dS = P ∘ (dP − δ_i)", "dV_j += Pᵀ dO_i", "dK_j += c dSᵀ Q_i",
                 "dQ_i = c Σ_j dS K_j", "for each key tile j", "for each query tile i"):
        assert step in words, step
