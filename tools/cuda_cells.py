"""A Sphinx extension for the book: ``%%cuda NAME`` cells highlighted as CUDA C++.

The chapters write their CUDA C++ in code cells that start with ``%%cuda NAME``
(:mod:`kernels.notebook`). The notebooks' lexer, ``ipython3``, knows some cell magics
(``%%bash``, ``%%html``) but not this one, and would colour the C++ as plain text; this
extension replaces it with one that hands a ``%%cuda`` cell's body to Pygments' CUDA
lexer and everything else to IPython's. ``_config.yml`` loads it.
"""

from ipython_pygments_lexers import IPython3Lexer
from pygments.lexer import bygroups, inherit, using
from pygments.lexers.c_like import CudaLexer
from pygments.token import Name, Operator, Text


class IPython3CudaLexer(IPython3Lexer):
    """IPython 3, with ``%%cuda NAME`` cells lexed as CUDA C++."""

    name = "IPython3 with %%cuda cells"
    aliases = []
    tokens = {"root": [(r"(?s)(\s*)(%%cuda)([^\n]*\n)(.*)",
                        bygroups(Text, Operator, Name.Variable, using(CudaLexer))),
                       inherit]}


def setup(app):
    app.add_lexer("ipython3", IPython3CudaLexer)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
