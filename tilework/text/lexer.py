"""Tokens of the text format: Python-like lines with significant indentation.

The lexer turns text into a flat token list with ``newline``, ``indent`` and ``dedent`` tokens
(as Python does); newlines inside brackets do not end a line. Every token carries its 1-based
line and column so that parse errors can point at it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tilework.errors import ParseError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?")
_OPS = ("->", "//", "<=", ">=", "==", "!=", "(", ")", "[", "]", "{", "}", ",", ":", "=", "+", "-", "*", "/", "%", "<", ">", ".")  # fmt: skip
_OP = re.compile("|".join(re.escape(o) for o in _OPS))  # two-character operators first, as in _OPS
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = frozenset(_OPEN.values())
# One token at a position, after the spaces before it: the first alternative that matches, in
# the order the format reads them (a number before the operator ``.``, two-character operators
# before one-character ones); ``end``: only spaces are left on the line.
_TOKEN = re.compile(
    rf"[ \t\r]*(?:(?P<end>$)|(?P<comment>#)|(?P<name>{_NAME.pattern})|(?P<number>{_NUMBER.pattern})"
    rf"|(?P<quote>[\"'])|(?P<at>@)|(?P<op>{_OP.pattern}))"
)
# a string literal without escapes, its quotes included (others go through ``_string``)
_PLAIN_STRING = re.compile(r'"[^"\\]*"|\'[^\'\\]*\'')
MAX_NESTING = 64  # brackets inside brackets, blocks inside blocks: far above what printing makes, far below Python's recursion limit
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'", "/": "/", "b": "\b", "f": "\f"}


class Token(NamedTuple):
    """``kind`` is one of name, int, float, str, op, global, newline, indent, dedent, eof. (A
    named tuple: a large module's text is hundreds of thousands of them.)"""

    kind: str
    value: str
    line: int
    col: int

    def describe(self) -> str:
        if self.kind in ("newline", "indent", "dedent", "eof"):
            return {"newline": "end of line", "indent": "an indented block", "dedent": "end of block", "eof": "end of input"}[self.kind]
        if self.kind == "str":
            return "a string"
        if self.kind == "global":
            return f"'@{self.value}'"
        return f"'{self.value}'"


def error_at(text: str, line: int, col: int, message: str) -> ParseError:
    """A ParseError whose message shows the source line with a caret under ``col``."""
    lines = text.split("\n")
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    caret = " " * (col - 1) + "^"
    return ParseError(f"line {line}, column {col}: {message}\n    {src}\n    {caret}", line, col)


def _unescape(body: str, text: str, line: int, col: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise error_at(text, line, col + i + 1, f"bad \\{nxt} escape in string")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        else:
            raise error_at(text, line, col + i + 1, f"unknown escape '\\{nxt}' in string")
    return "".join(out)


def _string(line_text: str, i: int, text: str, lineno: int) -> tuple[str, int]:
    """The decoded string literal starting at ``i`` and the index after it."""
    plain = _PLAIN_STRING.match(line_text, i)
    if plain is not None:
        return plain.group()[1:-1], plain.end()
    quote = line_text[i]
    j = i + 1
    while j < len(line_text):
        if line_text[j] == "\\":
            j += 2
            continue
        if line_text[j] == quote:
            return _unescape(line_text[i + 1 : j], text, lineno, i + 2), j + 1
        j += 1
    raise error_at(text, lineno, i + 1, "unterminated string")


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``; raises ParseError on characters the format does not use."""
    tokens: list[Token] = []
    append = tokens.append
    match = _TOKEN.match
    new = tuple.__new__  # Token(...) without the named tuple's own __new__ in between
    indents = [0]
    brackets: list[Token] = []
    lines = text.split("\n")
    for lineno, line_text in enumerate(lines, 1):
        line_text = line_text.rstrip("\r")
        i = 0
        if not brackets:
            stripped = line_text.lstrip(" ")
            if not stripped or stripped.startswith("#"):
                continue
            if stripped.startswith("\t"):
                raise error_at(text, lineno, len(line_text) - len(stripped) + 1, "tabs are not allowed for indentation; use spaces")
            i = len(line_text) - len(stripped)
            if i > indents[-1]:
                if len(indents) > MAX_NESTING:
                    raise error_at(text, lineno, i + 1, f"blocks are nested more than {MAX_NESTING} deep")
                indents.append(i)
                tokens.append(Token("indent", "", lineno, i + 1))
            while i < indents[-1]:
                indents.pop()
                tokens.append(Token("dedent", "", lineno, i + 1))
            if i != indents[-1]:
                raise error_at(text, lineno, i + 1, "unindent does not match any outer indentation level")
        n = len(line_text)
        while i < n:
            m = match(line_text, i)
            if m is None:
                rest = line_text[i:]
                i += len(rest) - len(rest.lstrip(" \t\r"))
                raise error_at(text, lineno, i + 1, f"unexpected character {line_text[i]!r}")
            kind = m.lastgroup
            if kind is None or kind == "end" or kind == "comment":  # (every alternative is named)
                break
            i = m.start(kind)
            col = i + 1
            if kind == "name" or kind == "number":
                s = m.group(kind)
                if kind == "number":
                    kind = "float" if "." in s or "e" in s or "E" in s else "int"
                append(new(Token, (kind, s, lineno, col)))
                i = m.end()
            elif kind == "quote":
                value, i = _string(line_text, i, text, lineno)
                append(Token("str", value, lineno, col))
            elif kind == "at":
                if i + 1 < n and line_text[i + 1] in "\"'":
                    value, i = _string(line_text, i + 1, text, lineno)
                else:
                    m = _NAME.match(line_text, i + 1)
                    if not m:
                        raise error_at(text, lineno, col + 1, "expected a function name after '@'")
                    value, i = m.group(), m.end()
                append(Token("global", value, lineno, col))
            else:
                op = m.group(kind)
                tok = new(Token, ("op", op, lineno, col))
                if op in _OPEN:
                    if len(brackets) >= MAX_NESTING:
                        raise error_at(text, lineno, col, f"brackets are nested more than {MAX_NESTING} deep")
                    brackets.append(tok)
                elif op in _CLOSE:
                    if not brackets or _OPEN[brackets[-1].value] != op:
                        raise error_at(text, lineno, col, f"unmatched '{op}'")
                    brackets.pop()
                append(tok)
                i = m.end()
        if not brackets and tokens and tokens[-1].kind not in ("newline", "indent", "dedent"):
            tokens.append(Token("newline", "", lineno, len(line_text) + 1))
    if brackets:
        t = brackets[-1]
        raise error_at(text, t.line, t.col, f"'{t.value}' is never closed")
    last = len(lines)
    while len(indents) > 1:
        indents.pop()
        tokens.append(Token("dedent", "", last, 1))
    tokens.append(Token("eof", "", last, len(lines[-1]) + 1 if lines else 1))
    return tokens
