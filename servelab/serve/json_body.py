"""Request bodies as JSON: one object, and no number that no field can hold (a 400 naming
where it stands instead of an exception deep in the server)."""

from __future__ import annotations

import json
import math
from collections import deque
from typing import Any

from servelab.serve.protocol import ApiError


def parse_json(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; ApiError(400) for anything else, including a number
    no field can hold (named by its place)."""
    try:
        data, bad = _decode(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON ({exc})") from None
    except RecursionError:  # the C parser recurses once per level of nesting
        raise ApiError(400, "request body is not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(data).__name__}")
    error = _number_error(data) if bad else None
    if error is not None:
        raise error
    return data


class _BadNumber:
    """Stands in the decoded body where a number was that no field can hold."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decode(raw: bytes) -> tuple[Any, list[_BadNumber]]:
    """json.loads with every non-finite float (1e999, NaN, Infinity) replaced by a _BadNumber;
    integers too long for Python to convert too, found by a second pass only when needed."""
    bad: list[_BadNumber] = []

    def mark(reason: str) -> _BadNumber:
        bad.append(_BadNumber(reason))
        return bad[-1]

    def finite(text: str) -> float | _BadNumber:
        value = float(text)
        return value if math.isfinite(value) else mark(f"{_excerpt(text)} is not a finite number")

    def constant(text: str) -> _BadNumber:
        return mark(f"{text} is not a finite number")

    def integer(text: str) -> int | _BadNumber:
        try:
            return int(text)
        except ValueError:  # more digits than sys.get_int_max_str_digits() (4,300)
            return mark(f"an integer of {len(text.lstrip('-'))} digits is out of range")

    try:
        return json.loads(raw, parse_float=finite, parse_constant=constant), bad
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:
        # int() refused an integer of too many digits. Parsing every integer through
        # `integer` costs 3x on a prompt of token ids, so only a body that failed pays.
        bad.clear()
        return json.loads(raw, parse_float=finite, parse_constant=constant,
                          parse_int=integer), bad


def _excerpt(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:10]}...{text[-10:]} ({len(text)} characters)"


def _number_error(data: dict[str, Any]) -> ApiError | None:
    """A 400 naming the shallowest place in `data` holding a _BadNumber; None if a repeated
    key replaced every one (JSON keeps a key's last value). Breadth-first without recursion:
    the body may nest as deep as the parser allowed."""
    # (container, its path, the top-level field it is in: None for the body itself)
    pending: deque[tuple[dict | list, str, str | None]] = deque([(data, "", None)])
    while pending:
        container, path, param = pending.popleft()
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in items:
            if not isinstance(value, _BadNumber | dict | list):
                continue  # the common case builds no path string
            if isinstance(container, list):
                place = f"{path}[{key}]"
            else:
                name = key or '""'  # JSON allows an empty name
                place = f"{path}.{name}" if path else name
            field = key if param is None else param
            if isinstance(value, _BadNumber):
                return ApiError(400, f"{place}: {value.reason}", param=field)
            pending.append((value, place, field))
    return None
