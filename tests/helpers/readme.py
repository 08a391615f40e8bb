"""The code blocks of README.md as the README test runs them (the convention is written in an
HTML comment at the top of README.md): blocks fenced `sh` run, in order; an HTML comment
`readme-test: timeout=N` or `readme-test: skip: WHY` on the line right above a fence applies to
that block; fences inside HTML comments are text, not blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "RUN_LANGUAGES", "Block", "readme_blocks"]

DEFAULT_TIMEOUT_SECONDS = 120.0
RUN_LANGUAGES = frozenset({"sh"})

_DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(?P<body>.*?)\s*-->$")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<language>[\w+-]*)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of the fence), its language and code."""

    line: int
    language: str
    code: str
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    skip: str | None = None

    @property
    def runs(self) -> bool:
        """Whether the README test runs this block."""
        return self.language in RUN_LANGUAGES and self.skip is None


def _directive(line: str) -> tuple[float | None, str | None]:
    match = _DIRECTIVE.match(line.strip())
    if match is None:
        return None, None
    body = match["body"]
    if body.startswith("skip:"):
        reason = body.removeprefix("skip:").strip()
        if not reason:
            raise ValueError("readme-test: skip needs a reason (`readme-test: skip: WHY`)")
        return None, reason
    if body.startswith("timeout="):
        return float(body.removeprefix("timeout=")), None
    raise ValueError(f"unknown readme-test directive {body!r}: use timeout=N or skip: WHY")


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order, with its directive applied."""
    blocks: list[Block] = []
    lines = text.splitlines()
    in_comment = False
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if in_comment:
            in_comment = "-->" not in stripped
            index += 1
            continue
        if stripped.startswith("<!--") and "-->" not in stripped:
            in_comment = True
            index += 1
            continue
        fence = _FENCE.match(stripped)
        if fence is None:
            index += 1
            continue
        timeout, skip = _directive(lines[index - 1]) if index > 0 else (None, None)
        closing = fence["fence"]
        opened_at = index + 1
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(closing):
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise ValueError(f"line {opened_at}: the block opened here is never closed")
        blocks.append(
            Block(
                line=opened_at,
                language=fence["language"],
                code="\n".join(body) + "\n",
                timeout=timeout if timeout is not None else DEFAULT_TIMEOUT_SECONDS,
                skip=skip,
            )
        )
        index += 1
    return blocks
