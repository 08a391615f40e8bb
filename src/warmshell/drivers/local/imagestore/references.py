"""What a caller may name an image by: `NAME[:TAG]`, `NAME@sha256:HEX`, or the digest alone.

Pure: the store resolves a parsed reference against its index. Names follow the distribution
spec's grammar (lowercase path components, an optional registry host with a port), so a name
imported here means what it means to a registry client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmshell.core.errors import InvalidArgumentError

__all__ = ["DEFAULT_TAG", "Reference", "check_digest", "parse_reference", "parse_tagged_name"]

DEFAULT_TAG = "latest"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_NAME = re.compile(rf"^{_HOST}?{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_HEX = re.compile(r"^[a-f0-9]{64}$")
_NAME_RULE = (
    "a name is lowercase path components (a-z, 0-9, '.', '_', '-') joined by '/', e.g. python or example.com/team/tool"
)
_TAG_RULE = "a tag is 1-128 of A-Z a-z 0-9 _ . - (not starting with . or -)"
_DIGEST_RULE = "a digest is sha256: followed by 64 lowercase hex digits"


@dataclass(frozen=True)
class Reference:
    """A parsed reference: a `name` with a `tag`, or with a `digest` (and maybe the tag that named
    it), or a `digest` alone."""

    name: str = ""
    tag: str = ""
    digest: str = ""

    @property
    def tagged(self) -> str:
        """`name:tag` (empty unless both are set)."""
        return f"{self.name}:{self.tag}" if self.name and self.tag else ""

    def __str__(self) -> str:
        if self.name and self.digest:
            return f"{self.tagged or self.name}@{self.digest}"
        return self.tagged or self.digest


def check_digest(digest: str, *, field: str) -> str:
    """`digest` if it is a sha256 digest, else InvalidArgumentError naming `field`."""
    if not _DIGEST.match(digest):
        raise InvalidArgumentError(field, f"{digest!r} is not a digest: {_DIGEST_RULE}")
    return digest


def parse_tagged_name(text: str, *, field: str) -> Reference:
    """`NAME[:TAG]` (the tag defaults to `latest`): what an import may name its image."""
    if text.startswith("sha256:") or _HEX.match(text):
        raise InvalidArgumentError(field, f"{text!r} is a digest; {_NAME_RULE}, with an optional :TAG")
    name, colon, tag = _split_tag(text)
    if not _NAME.match(name) or len(name) > 255:
        raise InvalidArgumentError(field, f"{text!r}: {_NAME_RULE}")
    tag = tag if colon else DEFAULT_TAG
    if not _TAG.match(tag):
        raise InvalidArgumentError(field, f"{text!r}: {_TAG_RULE}")
    return Reference(name=name, tag=tag)


def parse_reference(text: str, *, field: str) -> Reference:
    """Any reference: `NAME[:TAG]`, `NAME@sha256:HEX`, `sha256:HEX` or the 64 hex digits alone."""
    if not text:
        raise InvalidArgumentError(field, "must not be empty: NAME[:TAG], NAME@sha256:HEX or sha256:HEX")
    if _HEX.match(text):
        return Reference(digest=f"sha256:{text}")
    if text.startswith("sha256:"):
        return Reference(digest=check_digest(text, field=field))
    if "@" in text:
        # `NAME:TAG@sha256:HEX` (a tag pinned to the digest it named, as registries' clients
        # write it) means the digest; the tag is kept to be shown.
        name, _, digest = text.partition("@")
        named = parse_tagged_name(name, field=field)
        tag = named.tag if ":" in name.rpartition("/")[2] else ""
        return Reference(name=named.name, tag=tag, digest=check_digest(digest, field=field))
    return parse_tagged_name(text, field=field)


def _split_tag(text: str) -> tuple[str, str, str]:
    # The tag's colon is the last one after the last '/': a registry's port comes before a '/'.
    head, slash, last = text.rpartition("/")
    base, colon, tag = last.partition(":")
    return head + slash + base, colon, tag
