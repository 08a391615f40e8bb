"""A deliberately small subset of CEL for ``x-kubernetes-validations`` rules.

Supported: ``self``/``oldSelf`` field selection, ``has()``, ``size()``, ``!``, ``&&``, ``||``,
comparisons, and int/string/bool/null literals — enough for the agent-sandbox CRDs' immutability
rule. A rule outside this subset is compiled as *unsupported* and not enforced (logged once), rather
than rejecting a CRD a real server would accept.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+)|(?P<str>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')|"
    r"(?P<op>&&|\|\||==|!=|<=|>=|[<>!().,])|(?P<id>[A-Za-z_][A-Za-z0-9_]*))"
)


class CelError(Exception):
    """A rule could not be parsed or evaluated."""


class _Absent:
    """The value of a missing field; ``has()`` is the only thing allowed to look at it."""


ABSENT = _Absent()
Fn = Callable[[dict[str, Any]], Any]


@dataclass
class Expr:
    """A compiled rule."""

    text: str
    fn: Fn | None
    uses_old_self: bool

    def evaluate(self, value: Any, old: Any) -> Any:
        """Evaluate with ``self`` = value and ``oldSelf`` = old; unsupported rules pass."""
        if self.fn is None:
            return True
        result = self.fn({"self": value, "oldSelf": old})
        if isinstance(result, _Absent):
            raise CelError("no such key")
        return result


def parse(text: str) -> Expr:
    """Compile a rule, or return an unsupported (always-true) rule if outside the subset."""
    try:
        tokens = _tokenize(text)
        parser = _Parser(tokens)
        fn = parser.expr()
        if parser.pos != len(tokens):
            raise CelError(f"unexpected token {tokens[parser.pos]!r}")
    except CelError as exc:
        log.warning("x-kubernetes-validations rule not enforced (%s): %s", exc, text)
        return Expr(text, None, "oldSelf" in text)
    return Expr(text, fn, "oldSelf" in text)


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise CelError(f"cannot tokenize at {text[pos : pos + 10]!r}")
        tokens.append(m.group(0).strip())
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


def _select(base: Any, name: str) -> Any:
    if isinstance(base, dict):
        return base.get(name, ABSENT)
    return ABSENT


def _cmp(op: str, a: Any, b: Any) -> bool:
    if isinstance(a, _Absent) or isinstance(b, _Absent):
        raise CelError("no such key")
    if op == "==":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    ops: dict[str, Callable[[Any, Any], bool]] = {
        "<": lambda x, y: x < y,
        "<=": lambda x, y: x <= y,
        ">": lambda x, y: x > y,
        ">=": lambda x, y: x >= y,
    }
    return ops[op](a, b)


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise CelError(f"expected {expected!r}, got {tok!r}")
        self.pos += 1
        return tok

    def expr(self) -> Fn:
        left = self.conj()
        while self.peek() == "||":
            self.take()
            right = self.conj()
            left = (lambda a, b: lambda env: bool(a(env)) or bool(b(env)))(left, right)
        return left

    def conj(self) -> Fn:
        left = self.comparison()
        while self.peek() == "&&":
            self.take()
            right = self.comparison()
            left = (lambda a, b: lambda env: bool(a(env)) and bool(b(env)))(left, right)
        return left

    def comparison(self) -> Fn:
        left = self.unary()
        if self.peek() in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take()
            right = self.unary()
            return lambda env: _cmp(op, left(env), right(env))
        return left

    def unary(self) -> Fn:
        if self.peek() == "!":
            self.take()
            inner = self.unary()
            return lambda env: not inner(env)
        return self.postfix(self.primary())

    def postfix(self, fn: Fn) -> Fn:
        while self.peek() == ".":
            self.take()
            name = self.take()
            if self.peek() == "(" and name == "size":
                self.take("(")
                self.take(")")
                fn = (lambda f: lambda env: len(f(env)))(fn)
            else:
                fn = (lambda f, n: lambda env: _select(f(env), n))(fn, name)
        return fn

    def primary(self) -> Fn:
        tok = self.take()
        if tok == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if tok == "has":
            self.take("(")
            inner = self.postfix(self.primary())
            self.take(")")
            return lambda env: not isinstance(inner(env), _Absent)
        if tok == "size":
            self.take("(")
            inner = self.expr()
            self.take(")")
            return lambda env: len(inner(env))
        if tok in ("self", "oldSelf"):
            return lambda env: env[tok]
        if tok in ("true", "false"):
            value = tok == "true"
            return lambda env: value
        if tok == "null":
            return lambda env: None
        if tok.isdigit():
            number = int(tok)
            return lambda env: number
        if tok[0] in "\"'":
            literal = tok[1:-1]
            return lambda env: literal
        raise CelError(f"unsupported token {tok!r}")
