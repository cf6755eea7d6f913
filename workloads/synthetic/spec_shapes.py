"""Parse the shape keys of a synthetic spec: system=, groups=, prompts=, question=, stages=,
users=, turns=, think=, max_len= (see SHAPES_HELP)."""

from __future__ import annotations

import re
from collections.abc import Callable

from workloads.sessions import Seconds, SessionSpec
from workloads.synthetic.arrivals import Stage

SHAPE_KEYS = ("system", "groups", "prompts", "question", "stages", "users", "turns", "think",
              "max_len")

SHAPES_HELP = """\
Shapes (any part):
  system=S             every prompt starts with a shared S-token system prompt
  groups=G             G distinct system prompts, one per request at random (default 1)
  prompts=P            G x P distinct prompts (inference-perf's shared_prefix): requests
                       cycle through them in a shuffled order, so whole prompts repeat
  question=DIST        the tokens after the system prompt (instead of prompt=, which is
                       the whole prompt and must be longer than S)
  arrival=constant     even gaps of 1/rate (inference-perf's constant load)
  stages=ST+ST+...     load stages instead of n= and rate=, each rate(R,D): R requests/s
                       for D seconds; or one concurrency(U,N): U users, each sending its
                       next request when its last finished, N requests in all
  users=U              U multi-turn sessions started at rate= per second; each turn's
                       prompt is the previous prompt, its answer and a new question
                       (question= or prompt=), answers from output=
  turns=DIST           turns per session (a length DIST, e.g. uniform(3,8))
  think=TDIST          seconds from an answer to the next question: fixed(S),
                       uniform(LO,HI), lognormal(MED,SIG) or exponential(MEAN); >= 0
  max_len=M            prompt + answer <= M: the oldest turns are dropped (system kept)
"""

_SECONDS = {"fixed": 1, "uniform": 2, "lognormal": 2, "exponential": 1}
_STAGE = re.compile(r"(rate|concurrency)\(([^()]*)\)")


def parse_shapes(
    items: dict[str, str],
    number: Callable[[str, str, type], float],
    length_dist: Callable[[str, str], object],
    error: type[ValueError],
) -> dict:
    """SyntheticSpec keyword arguments from the shape keys present in `items`."""
    fields: dict = {}
    for key, field, kind in (("system", "system_tokens", int), ("groups", "groups", int),
                             ("prompts", "prompts_per_group", int),
                             ("max_len", "max_model_len", int)):
        if key in items:
            fields[field] = number(key, items[key], kind)
    if "stages" in items:
        fields["stages"] = parse_stages(items["stages"], number, error)
    session_keys = [key for key in ("turns", "think") if key in items]
    if "users" in items:
        for key in ("turns", "think"):
            if key not in items:
                raise error(f"users= needs {key}= as well")
        fields["session"] = _build(
            error, "users",
            lambda: SessionSpec(
                number("users", items["users"], int),
                length_dist("turns", items["turns"]),
                parse_seconds("think", items["think"], number, error),
            ),
        )
    elif session_keys:
        raise error(f"{session_keys[0]}= applies only with users= (multi-turn sessions)")
    return fields


def parse_stages(text: str, number: Callable, error: type[ValueError]) -> tuple[Stage, ...]:
    """`rate(R,D)+rate(R,D)+...` or `concurrency(U,N)` -> Stages."""
    stages = []
    for index, piece in enumerate(text.split("+"), 1):
        match = _STAGE.fullmatch(piece.strip())
        args = [arg.strip() for arg in match.group(2).split(",")] if match else []
        if not match or len(args) != 2:
            raise error(
                f"stages={text!r}: stage {index} {piece.strip()!r} is not rate(R,D) "
                "or concurrency(U,N)"
            )
        kind, where = match.group(1), f"stages: stage {index} {match.group(1)}"
        value = number(where, args[0], int if kind == "concurrency" else float)
        if kind == "rate":
            extent = {"duration_s": number(where, args[1], float)}
        else:
            extent = {"count": number(where, args[1], int)}
        stages.append(_build(error, where, lambda: Stage(kind, value, **extent)))  # noqa: B023
    return tuple(stages)


def parse_seconds(key: str, value: str, number: Callable, error: type[ValueError]) -> Seconds:
    """TDIST text -> Seconds; a negative or malformed value names `key=value`."""
    match = re.fullmatch(r"(\w+)\((.*)\)", value)
    known = "fixed(S), uniform(LO,HI), lognormal(MED,SIG), exponential(MEAN)"
    if not match or match.group(1) not in _SECONDS:
        raise error(f"{key}={value!r} is not one of {known}")
    name, body = match.group(1), match.group(2)
    args = [arg.strip() for arg in body.split(",")] if body.strip() else []
    if len(args) != _SECONDS[name]:
        raise error(f"{key}={value!r}: {name} takes {_SECONDS[name]} arguments, got {len(args)}")
    values = [number(f"{key}={name}", arg, float) for arg in args]
    return _build(error, f"{key}={value!r}", lambda: Seconds(name, *values))


def _build(error: type[ValueError], where: str, make: Callable):
    try:
        return make()
    except error:
        raise
    except ValueError as exc:
        raise error(f"{where}: {exc}") from None
