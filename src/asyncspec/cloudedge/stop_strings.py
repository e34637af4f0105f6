"""OpenAI's `stop`: the output ends at the first occurrence of any stop string, which is left out.

The edge watches the text of the committed tokens as they come (`StopWatch`), finishes the request
at the token that completes a match (so the cloud closes the request there), and the HTTP front
cuts the text at the match (`StopStrings.cut`). A streamed answer holds back any tail that could
still become a stop string (`StopStrings.undecided`), so no piece of a stop string is ever sent.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256  # a stop string longer than this is a prompt, not a delimiter


@dataclass(frozen=True)
class StopStrings:
    strings: tuple[str, ...] = ()

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.strings), default=0)

    def first_match(self, text: str, start: int = 0) -> int | None:
        """Where the earliest match in text[start:] begins (None: no match)."""
        found = [i for s in self.strings if (i := text.find(s, start)) >= 0]
        return min(found) if found else None

    def cut(self, text: str) -> tuple[str, bool]:
        """(the text before the first match, whether there was one)."""
        at = self.first_match(text)
        return (text, False) if at is None else (text[:at], True)

    def undecided(self, text: str) -> int:
        """How many trailing characters could still begin a stop string (held back when streaming)."""
        for length in range(min(self.longest - 1, len(text)), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self.strings):
                return length
        return 0


NO_STOP = StopStrings()


def stop_problem(value) -> str | None:
    """OpenAI's `stop`: null, a string, or a list of up to four strings (empty strings are ignored)."""
    if value is None:
        return None
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        return "stop must be a string or a list of strings"
    if len(strings) > MAX_STOP_STRINGS:
        return f"stop takes at most {MAX_STOP_STRINGS} strings"
    if any(len(s) > MAX_STOP_CHARS for s in strings):
        return f"a stop string exceeds {MAX_STOP_CHARS} characters"
    return None


def parse_stop(value) -> StopStrings:
    """The checked `stop` field (stop_problem(value) must be None)."""
    strings = [value] if isinstance(value, str) else list(value or [])
    return StopStrings(tuple(dict.fromkeys(s for s in strings if s)))


class StreamedCut:
    """A streamed answer's text: each piece is sent once nothing after it can turn it into part
    of a stop string, and nothing from the first match on is ever sent."""

    def __init__(self, stops: StopStrings):
        self.stops = stops
        self.text = ""
        self.sent = 0

    def add(self, piece: str) -> str:
        """Take the next piece of text; return what may be sent now."""
        self.text += piece
        kept, matched = self.stops.cut(self.text)
        return self._send_up_to(len(kept) if matched else len(self.text) - self.stops.undecided(self.text))

    def finish(self) -> str:
        """At the end of the output: whatever was held back, up to the first match."""
        return self._send_up_to(len(self.stops.cut(self.text)[0]))

    def _send_up_to(self, end: int) -> str:
        piece = self.text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return piece


class StopWatch:
    """The committed tokens' text searched for a stop string as each token comes. A token is at least
    one byte and a character at most four, so a match ending in the newest token lies within the
    last 4 * longest + 4 tokens: only their text is decoded (a whole decode per token grew with the
    output), and a match found there was not in the text before, which was searched already."""

    def __init__(self, stops: StopStrings, decode):
        self.stops = stops
        self.decode = decode  # token ids -> text
        self.window = 4 * stops.longest + 4
        self.tokens: list[int] = []

    def add(self, token: int) -> bool:
        """Add a committed token; True when the text now holds a stop string."""
        self.tokens.append(token)
        return self.stops.first_match(self.decode(self.tokens[-self.window :])) is not None
