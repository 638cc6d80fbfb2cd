"""Integer C++ expressions, evaluated in Python as the GPU would evaluate them.

Some exercises take a piece of a kernel as the C++ expression the reader would write in
it (``"lane % 8 + lane / 16 * 8"``): the checker evaluates it here for every lane or
thread, on a model of the hardware, and also puts it into the kernel's source for NVRTC.
:func:`parse` reads the expression once, with C++'s precedence and its integer division
(rounding towards zero); the result is called with the names' values.

What it reads: decimal and hex literals (with ``u``, ``l`` suffixes), names (``lane``,
``threadIdx.x``), casts to ``int``, ``unsigned``, ``u32``, ``u64`` and the like, the
unary ``- + ! ~``, the binary ``* / % + - << >> < <= > >= == != & ^ | && ||`` and
``?:``. Nothing else: no calls, no assignments.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|\d+)[uUlL]*|([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)"
                    r"|(<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%<>!~&^|?:()]))")
#: integer types a cast may name: bits and whether signed (None: keep as is)
_TYPES = {"int": (32, True), "unsigned": (32, False), "u32": (32, False), "uint32_t": (32, False),
          "int32_t": (32, True), "u64": (64, False), "uint64_t": (64, False),
          "size_t": (64, False), "long": (64, True), "int64_t": (64, True), "u16": (16, False)}
#: binary operators by precedence, loosest first (C++'s table)
_LEVELS = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="),
           ("<<", ">>"), ("+", "-"), ("*", "/", "%")]


class ExpressionError(ValueError):
    """The text is not an expression this module reads."""


def _div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero in the expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _mod(a: int, b: int) -> int:
    return a - _div(a, b) * b


_BINARY = {"||": lambda a, b: int(bool(a) or bool(b)), "&&": lambda a, b: int(bool(a) and bool(b)),
           "|": lambda a, b: a | b, "^": lambda a, b: a ^ b, "&": lambda a, b: a & b,
           "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
           "<": lambda a, b: int(a < b), "<=": lambda a, b: int(a <= b),
           ">": lambda a, b: int(a > b), ">=": lambda a, b: int(a >= b),
           "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
           "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "/": _div, "%": _mod}


def _cast(bits: int, signed: bool):
    mask = (1 << bits) - 1

    def convert(x: int) -> int:
        x &= mask
        return x - (1 << bits) if signed and x >> (bits - 1) else x
    return convert


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"cannot read {text[pos:pos + 12]!r} in {text!r}")
        out.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.text, self.toks, self.i, self.names = text, _tokens(text), 0, set()

    def peek(self, k: int = 0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def take(self, want=None):
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ExpressionError(f"expected {want or 'more'} in {self.text!r}")
        self.i += 1
        return tok

    def expression(self):
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.take("?")
        yes = self.expression()
        self.take(":")
        no = self.expression()
        return lambda env: yes(env) if cond(env) else no(env)

    def binary(self, level: int):
        if level == len(_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _LEVELS[level]:
            op = _BINARY[self.take()]
            right = self.binary(level + 1)
            left = (lambda f, a, b: lambda env: f(a(env), b(env)))(op, left, right)
        return left

    def unary(self):
        tok = self.peek()
        if tok in ("-", "+", "!", "~"):
            self.take()
            inner = self.unary()
            return {"-": lambda env: -inner(env), "+": inner,
                    "!": lambda env: int(not inner(env)), "~": lambda env: ~inner(env)}[tok]
        if tok == "(" and self.peek(1) in _TYPES and self.peek(2) == ")":
            convert = _cast(*_TYPES[self.peek(1)])
            self.i += 3
            inner = self.unary()
            return lambda env: convert(inner(env))
        return self.primary()

    def primary(self):
        tok = self.take()
        if tok == "(":
            inner = self.expression()
            self.take(")")
            return inner
        if tok[0].isdigit():
            value = int(tok, 0) if not re.fullmatch(r"0\d+", tok) else int(tok, 8)
            return lambda env: value
        if tok[0].isalpha() or tok[0] == "_":
            if tok in _TYPES:
                raise ExpressionError(f"a cast needs parentheses: ({tok}) in {self.text!r}")
            self.names.add(tok)

            def name(env):
                if tok not in env:
                    raise ExpressionError(f"{self.text!r} uses {tok!r}, which is not defined "
                                          f"there; it may use {', '.join(sorted(env))}")
                return env[tok]
            return name
        raise ExpressionError(f"unexpected {tok!r} in {self.text!r}")


class Expression:
    """A C++ integer expression, read once: ``Expression("lane / 8")(lane=13) == 1``."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise ExpressionError(f"the expression must be a string of C++, got "
                                  f"{type(text).__name__}")
        parser = _Parser(text)
        self._eval = parser.expression()
        if parser.peek() is not None:
            raise ExpressionError(f"unexpected {parser.peek()!r} in {text!r}")
        self.text, self.names = text, frozenset(parser.names)

    def __call__(self, **values) -> int:
        return self._eval(values)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def parse(text: str) -> Expression:
    """``text`` read as a C++ integer expression (raises ExpressionError if it is not)."""
    return Expression(text)
