"""Parse a synthetic trace spec string, e.g. `synthetic:n=2000,rate=4,prompt=fixed(512)`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from workloads.synthetic.generators import SyntheticSpec
from workloads.synthetic.lengths import Empirical, Fixed, LengthDist, LogNormal, Pareto, Uniform
from workloads.synthetic.spec_shapes import SHAPE_KEYS, SHAPES_HELP, parse_shapes
from workloads.trace import Trace

SPEC_PREFIX = "synthetic:"

# Two tenants: a heavy flood and a light stream (priority 0 here is also the flood's default).
TENANT_EXAMPLE = (
    "synthetic:tenant=flood,n=3000,rate=20,prompt=lognormal(512,0.5),output=fixed(64);"
    "tenant=light,n=300,rate=2,prompt=fixed(256),output=fixed(64),priority=0"
)

SPEC_HELP = f"""\
synthetic spec: synthetic:KEY=VALUE,KEY=VALUE,...   (quote it: ( ) and ; are shell syntax)
  n=N                  number of requests (required unless stages= or users=)
  rate=R               mean arrival rate, requests/s (required unless stages=)
  arrival=poisson      exponential inter-arrival gaps (the default)
  arrival=gamma        gamma gaps with coefficient of variation cv=C (required with
                       gamma); C > 1 is burstier than Poisson, C = 1 is Poisson
  prompt=DIST          prompt lengths in tokens (default fixed(512))
  output=DIST          output lengths in tokens (default fixed(128))
  tenant=NAME          tag the requests with tenant NAME (letters, digits, - and _);
                       request ids become NAME-0, NAME-1, ...
  priority=P           the requests' integer priority; lower is served first (as vLLM)
DIST is one of:
  fixed(T)             always T tokens
  uniform(LO,HI)       integers from LO to HI, both included
  lognormal(MED,SIG)   exp(Normal(ln MED, SIG^2)): median MED tokens, log-space std SIG
  pareto(MIN,ALPHA)    P(X > x) = (MIN/x)^ALPHA for x >= MIN; ALPHA <= 2: infinite variance
  empirical(T)         resample the lengths of trace T (a bundled name or a file); when
                       prompt and output name the same T, whole rows are resampled, so
                       their correlation is kept
{SHAPES_HELP}Several tenants: parts separated by ';', each KEY=VALUE,... as above with its
own tenant= (required, unique). Each part is drawn on its own (from --seed and its position), from
0 s, and the arrivals are merged in time order; if any part sets priority=, the rest get 0.
Lengths are rounded to integers >= 1; --seed N seeds the generator (same seed, same trace).
example: synthetic:n=2000,rate=4,arrival=gamma,cv=3,prompt=lognormal(1024,0.8),output=pareto(50,1.5)
tenants: {TENANT_EXAMPLE}
"""

KEYS = ("n", "rate", "arrival", "cv", "prompt", "output", "tenant", "priority", *SHAPE_KEYS)
# name -> (class, its arguments as (NAME, type))
_DISTS: dict[str, tuple[type, tuple[tuple[str, type], ...]]] = {
    "fixed": (Fixed, (("T", int),)),
    "uniform": (Uniform, (("LO", int), ("HI", int))),
    "lognormal": (LogNormal, (("MED", float), ("SIG", float))),
    "pareto": (Pareto, (("MIN", float), ("ALPHA", float))),
}
_KNOWN_DISTS = "fixed(T), uniform(LO,HI), lognormal(MED,SIG), pareto(MIN,ALPHA), empirical(T)"
OpenSource = Callable[[str], Trace]


class SpecError(ValueError):
    """A synthetic spec that cannot be parsed; the message names the part, key and value."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"synthetic spec: {problem}")
        self.problem = problem  # without the prefix, so a caller can say which part


def is_synthetic_spec(text: str) -> bool:
    """Whether a trace argument is a synthetic spec rather than a name or a path."""
    return text.startswith(SPEC_PREFIX)


def parse_spec(text: str, resolve: OpenSource | None = None) -> SyntheticSpec:
    """Parse a one-part `synthetic:...` (see SPEC_HELP); `resolve` opens empirical(T) sources."""
    parts = parse_parts(text, resolve)
    if len(parts) > 1:
        raise SpecError(f"{len(parts)} parts separated by ';' where one is expected")
    return parts[0]


def parse_parts(text: str, resolve: OpenSource | None = None) -> tuple[SyntheticSpec, ...]:
    """Parse `synthetic:PART;PART;...` (see SPEC_HELP) into one SyntheticSpec per part."""
    if not is_synthetic_spec(text):
        raise SpecError(f"must start with {SPEC_PREFIX!r}, got {text!r}")
    bodies = _split_outside_parentheses(text[len(SPEC_PREFIX) :], ";")
    open_source = _source_opener(resolve)
    if len(bodies) == 1:  # a lone part needs no tenant, and its errors need no part number
        return (_parse_part(_split_items(bodies[0]), open_source),)
    for index, body in enumerate(bodies, 1):  # before any other error: a stray ';' explains it
        if not body.strip():
            raise SpecError(f"part {index} is empty (two ';' in a row, or one at the end)")
    parts: list[SyntheticSpec] = []
    for index, body in enumerate(bodies, 1):
        where = f"part {index}"
        try:
            items = _split_items(body)
            if "tenant" not in items:
                raise SpecError("tenant=NAME is required when a spec has several parts")
            where += f" (tenant={items['tenant']})"
            parts.append(_parse_part(items, open_source))
        except SpecError as exc:
            raise SpecError(f"{where}: {exc.problem}") from None
    _check_unique_tenants(parts)
    return tuple(parts)


def _check_unique_tenants(parts: list[SyntheticSpec]) -> None:
    """Raise on the first part whose tenant an earlier part already named."""
    first_part: dict[str | None, int] = {}
    for index, part in enumerate(parts, 1):
        if part.tenant in first_part:
            earlier = first_part[part.tenant]
            raise SpecError(f"part {index}: tenant {part.tenant!r} already names part {earlier}")
        first_part[part.tenant] = index


def _source_opener(resolve: OpenSource | None) -> OpenSource:
    """`resolve`, opening each source once, so prompt/output (and parts) share its rows."""
    sources: dict[str, Trace] = {}

    def open_source(name: str) -> Trace:
        if resolve is None:
            raise SpecError("empirical(T) needs a trace loader")
        if name not in sources:
            sources[name] = resolve(name)
        return sources[name]

    return open_source


def _parse_part(items: dict[str, str], open_source: OpenSource) -> SyntheticSpec:
    """One part's KEY=VALUE items -> a SyntheticSpec; errors name the key and value."""
    shaped = "stages" in items or "users" in items
    for key, meaning in (("n", "the number of requests"), ("rate", "requests/s")):
        if key not in items and not shaped:
            raise SpecError(f"missing {key}= ({meaning})")
    arrival = items.get("arrival", "poisson")
    if arrival not in ("poisson", "gamma", "constant"):
        raise SpecError(f"arrival={arrival!r}: expected poisson, gamma or constant")
    if arrival == "gamma" and "cv" not in items:
        raise SpecError("arrival=gamma needs cv=C (the inter-arrival coefficient of variation)")
    if arrival != "gamma" and "cv" in items:
        raise SpecError("cv= applies only to arrival=gamma")
    if "prompt" in items and "question" in items:
        raise SpecError("prompt= and question= exclude each other (question= follows system=)")
    prompt_key = "question" if "question" in items else "prompt"
    prompt = _parse_dist(
        prompt_key, items.get(prompt_key, "fixed(512)"), "prompt_len", open_source
    )
    output = _parse_dist("output", items.get("output", "fixed(128)"), "output_len", open_source)
    shapes = parse_shapes(
        items, _number, lambda key, text: _parse_dist(key, text, "prompt_len", open_source),
        SpecError,
    )
    try:
        return SyntheticSpec(
            num_requests=_number("n", items["n"], int) if "n" in items else None,
            rate_per_s=_number("rate", items["rate"], float) if "rate" in items else None,
            prompt=prompt,
            output=output,
            arrival=arrival,
            cv=_number("cv", items["cv"], float) if "cv" in items else 1.0,
            tenant=items.get("tenant"),
            priority=_number("priority", items["priority"], int) if "priority" in items else None,
            question=prompt_key == "question",
            **shapes,
        )
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _split_outside_parentheses(body: str, separator: str) -> list[str]:
    """`body` split at each `separator` outside parentheses; unbalanced parentheses raise."""
    pieces, depth, start = [], 0, 0
    for position, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == separator and depth == 0:
            pieces.append(body[start:position])
            start = position + 1
    if depth != 0:
        raise SpecError(f"unbalanced parentheses in {body!r}")
    return [*pieces, body[start:]]


def _split_items(body: str) -> dict[str, str]:
    """KEY=VALUE items split at commas outside parentheses; unknown or repeated keys raise."""
    items = {}
    for piece in _split_outside_parentheses(body, ","):
        item = piece.strip()
        key, equals, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key or not value:
            raise SpecError(f"item {item!r} is not KEY=VALUE")
        if key not in KEYS:
            raise SpecError(f"unknown key {key!r} (known: {', '.join(KEYS)})")
        if key in items:
            raise SpecError(f"key {key!r} given twice")
        items[key] = value
    return items


def _number(key: str, text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise SpecError(f"{key}={text!r} is not {noun}") from None
    if not math.isfinite(value):
        raise SpecError(f"{key}={text!r} is not finite")
    return value


def _parse_dist(key: str, value: str, column: str, open_source: OpenSource) -> LengthDist:
    """DIST text -> a length distribution; errors name `key=value`."""
    match = re.fullmatch(r"(\w+)\((.*)\)", value)
    if not match:
        raise SpecError(f"{key}={value!r} is not DIST(ARGS); known: {_KNOWN_DISTS}")
    name, body = match.group(1), match.group(2)
    args = [arg.strip() for arg in body.split(",")] if body.strip() else []
    if name == "empirical":
        if len(args) != 1:
            raise SpecError(f"{key}={value!r}: empirical takes one trace, got {len(args)}")
        return Empirical(open_source(args[0]), column)
    if name not in _DISTS:
        raise SpecError(f"{key}={value!r}: unknown distribution {name!r}; known: {_KNOWN_DISTS}")
    cls, params = _DISTS[name]
    if len(args) != len(params):
        names = ",".join(param for param, _ in params)
        raise SpecError(
            f"{key}={value!r}: {name} takes {len(params)} arguments ({names}), got {len(args)}"
        )
    numbers = [
        _number(f"{key}={name}({param})", arg, kind)
        for (param, kind), arg in zip(params, args, strict=True)
    ]
    try:
        return cls(*numbers)
    except ValueError as exc:
        raise SpecError(f"{key}={value!r}: {exc}") from None
