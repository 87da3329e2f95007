"""A text space for conversational environments.

Gymnasium's ``Text`` space only admits characters from a fixed charset
(alphanumerics by default), which would reject almost every real
observation: JSON braces, punctuation, newlines, accents, emoji. ``UnicodeText``
admits any well-formed Unicode string up to ``max_length`` characters and
samples from a broad printable charset, so ``check_env`` and random agents work.
"""

from __future__ import annotations

from typing import Any

from gymnasium.spaces import Text


def _sample_charset() -> str:
    """Printable characters that ``sample()`` draws from (ASCII, Latin-1, a few scripts)."""
    ranges = [(0x20, 0x7E), (0xA1, 0xFF), (0x391, 0x3C9), (0x410, 0x44F), (0x4E00, 0x4E3F)]
    chars = "".join(chr(c) for lo, hi in ranges for c in range(lo, hi + 1))
    return chars + "\n\t{}[]\":,"


_SAMPLE_CHARSET = _sample_charset()


def is_well_formed(text: str) -> bool:
    """True if ``text`` has no lone surrogates (i.e. it encodes to UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def well_formed(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so that it encodes to UTF-8.

    The parser rejects lone surrogates in what the agent sends; this is the last line of defence at the
    observation and transcript boundary (a tool that echoes odd bytes, a subclass's own text).
    """
    if is_well_formed(text):
        return text
    # UTF-16 with surrogatepass keeps valid pairs and lets the decoder replace each lone one.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def fit_text(text: str, max_length: int) -> str:
    """``text`` cut to at most ``max_length`` characters, ending with a note that says how much was cut."""
    if len(text) <= max_length:
        return text
    note = f"\n… [cut: {len(text):,} characters; the limit is {max_length:,}]"
    if len(note) >= max_length:
        return text[:max_length]
    return text[:max_length - len(note)] + note


class UnicodeText(Text):
    """Any well-formed Unicode string of ``min_length``..``max_length`` characters.

    ``contains`` accepts every code point except lone surrogates (which cannot
    be encoded as UTF-8 and so could never come from or go to a model);
    ``sample`` draws from a printable multilingual charset.
    """

    def __init__(self, max_length: int = 1_000_000, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and is_well_formed(x)

    def sample(self, mask=None, probability=None) -> str:  # noqa: D102 - same contract as Text.sample
        if mask is None and probability is None:
            # Text.sample draws lengths up to max_length; a million-character
            # sample is useless to a random agent, so cap the default length.
            length = int(self.np_random.integers(self.min_length, min(self.max_length, 64) + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (
            other.min_length,
            other.max_length,
        )
