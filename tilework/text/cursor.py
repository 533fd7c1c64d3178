"""The parser's position in the token list, and the names in scope."""

from __future__ import annotations

from typing import Any

from tilework.errors import ParseError
from tilework.ir.sym import SymVar
from tilework.text.lexer import Token, error_at


class Cursor:
    """A position in the tokens of one text; every error it raises points into that text."""

    def __init__(self, text: str, tokens: list[Token]) -> None:
        self.text = text
        self.toks = tokens  # ends with the eof token
        self.kinds = [t.kind for t in tokens]
        self.words = [t.value if kind == "op" or kind == "name" else None for t, kind in zip(tokens, self.kinds)]  # what ``at`` compares
        self.pos = 0

    def peek(self, k: int = 0) -> Token:
        try:
            return self.toks[self.pos + k]
        except IndexError:
            return self.toks[-1]

    def next(self) -> Token:
        tok = self.toks[self.pos]
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def word(self) -> str | None:
        """The current token's value if it is an operator or a name (else None)."""
        return self.words[self.pos]

    def at(self, value: str, k: int = 0) -> bool:
        """True when the token ``k`` ahead is the operator or name ``value``."""
        i = self.pos + k
        return i < len(self.words) and self.words[i] == value

    def at_kind(self, kind: str, k: int = 0) -> bool:
        i = self.pos + k
        return (self.kinds[i] if i < len(self.kinds) else "eof") == kind

    def accept(self, value: str) -> Token | None:
        if self.at(value):
            return self.next()
        return None

    def expect(self, value: str, what: str) -> Token:
        if self.at(value):
            return self.next()
        raise self.error(f"expected '{value}' {what}, found {self.peek().describe()}")

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.at_kind(kind):
            return self.next()
        raise self.error(f"expected {what}, found {self.peek().describe()}")

    def expect_newline(self, what: str) -> None:
        if not self.at_kind("newline"):
            raise self.error(f"expected the end of the line {what}, found {self.peek().describe()}")
        self.next()

    def expect_suite(self, what: str) -> None:
        """``:`` then an indented block."""
        self.expect(":", what)
        self.expect_newline(f"after ':' {what}")
        if not self.at_kind("indent"):
            raise self.error(f"expected an indented block {what}")
        self.next()

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        t = tok or self.peek()
        return error_at(self.text, t.line, t.col, message)


class Scope:
    """Names visible at a point of one function: declared sym vars, then nested frames of vars,
    buffers and loop vars."""

    def __init__(self) -> None:
        self.declared: dict[str, SymVar] = {}
        self.frames: list[dict[str, Any]] = [{}]

    def lookup(self, name: str) -> Any:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        return self.declared.get(name)

    def visible(self) -> dict[str, Any]:
        """Every name visible here and what it names, declared sym vars first, then the frames
        outermost first (an inner name hides an outer one)."""
        out: dict[str, Any] = dict(self.declared)
        for frame in self.frames:
            out.update(frame)
        return out

    def push(self) -> None:
        self.frames.append({})

    def pop(self) -> None:
        self.frames.pop()

    def define(self, cur: Cursor, tok: Token, obj: Any) -> None:
        """Bind the name of ``tok`` to ``obj`` in the innermost frame; a visible name is an error."""
        if self.lookup(tok.value) is not None:
            raise cur.error(f"'{tok.value}' is already defined", tok)
        self.frames[-1][tok.value] = obj

    def declare_sym(self, cur: Cursor, tok: Token, v: SymVar) -> None:
        if self.lookup(tok.value) is not None:
            raise cur.error(f"'{tok.value}' is already defined", tok)
        self.declared[tok.value] = v
