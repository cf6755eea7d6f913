"""Numeric flags checked while parsing: every int or float flag is a finite number > 0 (an int
>= 1) unless its destination is named below, so a bad value is one line and exit 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator

# Flags where 0 means something (a seed, any free port, no noise, greedy sampling, the
# trace's start, no failure allowed, no retry).
NONNEGATIVE = frozenset({"seed", "port", "start_s", "end_s", "sjf_noise", "temperature", "top_k",
                         "max_failed_share", "retries", "retry_budget_ratio",
                         "retry_budget_min"})
# Shares of a whole: above 0 (0 allowed where NONNEGATIVE says so) and at most 1.
FRACTIONS = frozenset({"gpu_memory_utilization", "top_p", "max_failed_share"})
# Rates where inf means "all at once", as vLLM's benchmark reads it.
INFINITE_OK = frozenset({"request_rate", "replay_rate"})
# Flags with an upper bound of their own.
MAXIMA = {"port": 65535}


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (no usage block) and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_hidden_alias(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str,
                     dest: str, kind: type | None = None) -> None:
    """`flag` as an old spelling of the option stored in `dest`: it works, help omits it."""
    parser.add_argument(flag, dest=dest, type=kind, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)


def checked_type(kind: type, dest: str) -> Callable[[str], int | float]:
    """A `type=` for argparse that reads `kind` and enforces the range `dest` allows."""
    low_ok = dest in NONNEGATIVE
    top = 1 if dest in FRACTIONS else MAXIMA.get(dest)
    bound = (">= 0" if low_ok else ("> 0" if kind is float else ">= 1"))
    if top is not None:
        bound += f" and <= {top}"
    noun = "an integer" if kind is int else "a number"

    def read(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun} {bound}, got {text!r}") from None
        too_low = value < 0 if low_ok else value <= 0
        finite = math.isfinite(value) or (dest in INFINITE_OK and value == math.inf)
        if not finite or too_low or (top is not None and value > top):
            raise argparse.ArgumentTypeError(f"expected {noun} {bound}, got {text!r}")
        return value

    read.__name__ = kind.__name__
    return read


def check_numeric_flags(parser: argparse.ArgumentParser) -> None:
    """Give every int and float flag of `parser` and its subcommands a range-checked type."""
    for action in _actions(parser):
        if action.type in (int, float):
            action.type = checked_type(action.type, action.dest)


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                yield from _actions(sub)
        else:
            yield action
