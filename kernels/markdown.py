"""Markdown for what the chapters show: a table of records, and showing it where it
runs (rendered in a notebook, printed elsewhere)."""

from __future__ import annotations


def table(records, columns, headers=None) -> str:
    """Records as a Markdown table (for chapters' ``display(Markdown(...))``)."""
    headers = headers or columns
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in records:
        cells = []
        for c in columns:
            v = r.get(c) if isinstance(c, str) else c(r)
            if isinstance(v, float):
                v = f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
            cells.append("" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def show(markdown: str) -> None:
    """Show Markdown: rendered in a notebook, printed as text anywhere else."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(markdown)
    else:
        display(Markdown(markdown))


#: what a glued number reads where its record is missing from the run the page draws on
NOT_RECORDED = "(not recorded)"


def glue(name: str, value) -> str:
    """Put ``value`` (text: the page formats its numbers) where the page's prose says
    ``{glue:text}`name```, so that a number in a sentence is the recorded run's, never
    typed. The book's build (MyST-NB) takes it from the cell's output; a notebook run
    without MyST-NB shows nothing. ``None`` reads as :data:`NOT_RECORDED`. Returns the
    text, for a check in the cell that glues it."""
    text = NOT_RECORDED if value is None else str(value)
    try:
        from IPython import get_ipython
        from myst_nb import glue as myst_glue
    except ImportError:
        return text
    if get_ipython() is not None:
        myst_glue(name, text, display=False)
    return text
