"""GSM8K answers: the reference number after `####`, the final number of a model's completion, exact match."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from asyncspec.errors import InputError

_NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?"
# In order of preference: the \boxed{} the chat prompt asks for, GSM8K's own "#### n", "the answer is n".
_MARKED = [
    re.compile(r"\\boxed\{\s*(?:\\text\{[^}]*\}\s*)?([^{}]*)\}"),
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"answer is[:\s]*(" + _NUMBER + ")", re.IGNORECASE),
]
_ANY_NUMBER = re.compile(_NUMBER)


def reference_answer(solution: str) -> str:
    """The canonical number after `####` in a GSM8K worked solution."""
    match = re.search(r"####\s*(.+?)\s*$", solution.strip())
    if not match:
        raise InputError(f"GSM8K solution without a '#### answer' line: {solution[-80:]!r}")
    number = canonical_number(match.group(1))
    if number is None:
        raise InputError(f"GSM8K reference answer is not a number: {match.group(1)!r}")
    return number


def extract_answer(completion: str) -> str | None:
    """The completion's final answer as a canonical number, or None when it states none.

    A marked answer (\\boxed{}, ####, "the answer is") wins, the last one if several; otherwise the last
    number in the text. Chat-format completions may run on after the answer, so marks come first."""
    for pattern in _MARKED:
        found = [canonical_number(m) for m in pattern.findall(completion)]
        found = [f for f in found if f is not None]
        if found:
            return found[-1]
    numbers = _ANY_NUMBER.findall(completion)
    return canonical_number(numbers[-1]) if numbers else None


def canonical_number(text: str) -> str | None:
    """'$1,234.50' -> '1234.5', '18.0' -> '18', '-3' -> '-3'; None if `text` holds no number."""
    match = _ANY_NUMBER.search(text)
    if not match:
        return None
    cleaned = match.group(0).replace("$", "").replace(",", "").replace(" ", "")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    normal = value.normalize()
    return format(normal, "f") if normal != normal.to_integral_value() else str(int(normal))


def exact_match(completion: str, reference: str) -> bool:
    """GSM8K exact match: the completion's extracted final number equals the reference number."""
    answer = extract_answer(completion)
    return answer is not None and answer == canonical_number(reference)
