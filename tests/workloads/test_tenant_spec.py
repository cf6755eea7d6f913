"""Multi-tenant synthetic specs: parts merged in time, tenant and priority columns, per-part
seeding, errors that name the part, and the per-tenant summary lines."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import SpecError, Trace, format_summary, generate_trace, open_trace, summarize
from workloads.synthetic.spec import TENANT_EXAMPLE, parse_parts, parse_spec


def test_example_gives_each_tenant_its_count_and_rate() -> None:
    traces = [open_trace(TENANT_EXAMPLE, seed=seed) for seed in range(10)]
    for tenant, count, rate_per_s in (("flood", 3000, 20.0), ("light", 300, 2.0)):
        gaps, span_s = 0, 0.0
        for trace in traces:
            arrival_s = trace.arrival_s[trace.table["tenant"].to_numpy() == tenant]
            assert len(arrival_s) == count
            gaps, span_s = gaps + count - 1, span_s + arrival_s[-1] - arrival_s[0]
        # Pooled over 10 seeds a rate estimate has relative std 1/sqrt(gaps): 1.8% for the
        # light tenant; 6% is over 3 standard errors.
        assert gaps / span_s == pytest.approx(rate_per_s, rel=0.06)


def test_example_merges_sorted_with_unique_tenant_ids() -> None:
    trace = open_trace(TENANT_EXAMPLE, seed=1)
    table = trace.table
    assert len(trace) == 3300 and (np.diff(trace.arrival_s) >= 0).all()
    assert table["request_id"].is_unique
    for tenant, count in (("flood", 3000), ("light", 300)):
        rows = table[table["tenant"] == tenant]
        # Within a tenant the merge keeps draw order: ids count up with arrival time.
        assert rows["request_id"].tolist() == [f"{tenant}-{i}" for i in range(count)]
    assert (table["priority"] == 0).all()  # light says 0; flood, without priority=, gets 0
    light = table[table["tenant"] == "light"]
    assert (light["prompt_len"] == 256).all() and (table["output_len"] == 64).all()


def test_parts_without_priority_get_class_zero() -> None:
    spec = "synthetic:tenant=a,n=50,rate=5,priority=3;tenant=b,n=50,rate=5;tenant=c,n=5,rate=1"
    table = open_trace(spec).table
    assert table.groupby("tenant")["priority"].unique().map(list).to_dict() == {
        "a": [3],
        "b": [0],
        "c": [0],
    }


def test_one_part_with_tenant_or_priority_adds_only_that_column() -> None:
    tagged = open_trace("synthetic:tenant=solo,n=4,rate=1", seed=5)
    assert tagged.request_ids == ["solo-0", "solo-1", "solo-2", "solo-3"]
    assert (tagged.table["tenant"] == "solo").all() and "priority" not in tagged.table
    ranked = open_trace("synthetic:n=4,rate=1,priority=-2", seed=5)
    assert ranked.request_ids == ["0", "1", "2", "3"] and "tenant" not in ranked.table
    assert ranked.table["priority"].tolist() == [-2] * 4
    np.testing.assert_array_equal(tagged.arrival_s, ranked.arrival_s)  # same draws as untagged


def test_one_plain_part_draws_exactly_as_before_tenants() -> None:
    text = "synthetic:n=5,rate=2,arrival=gamma,cv=2,prompt=uniform(1,100),output=lognormal(50,1)"
    trace = open_trace(text, seed=3)
    direct = generate_trace(parse_spec(text), np.random.default_rng(3), name=text)
    assert trace.table.equals(direct.table) and list(trace.table) == list(direct.table)
    # Pinned from the generator before multi-part specs existed (numpy's PCG64 stream).
    np.testing.assert_allclose(
        trace.arrival_s, [0.0, 0.000107627331, 0.849974095413, 0.850131101747, 0.955462556199]
    )
    assert trace.prompt_len.tolist() == [70, 74, 4, 12, 46]
    assert trace.output_len.tolist() == [35, 38, 26, 17, 34]
    assert trace.request_ids == ["0", "1", "2", "3", "4"]


def test_same_seed_same_trace_and_parts_seeded_apart() -> None:
    first, again, other = (open_trace(TENANT_EXAMPLE, seed=s) for s in (7, 7, 8))
    assert first.table.equals(again.table) and not first.table.equals(other.table)
    # Each part's Generator depends on (seed, position) only: a third part leaves the
    # first two tenants' rows as they were.
    grown = open_trace(TENANT_EXAMPLE + ";tenant=extra,n=100,rate=5", seed=7).table
    kept = grown[grown["tenant"] != "extra"].reset_index(drop=True)
    assert kept.equals(first.table)


def test_parse_parts_reads_each_part() -> None:
    flood, light = parse_parts(TENANT_EXAMPLE)
    assert (flood.tenant, flood.num_requests, flood.rate_per_s, flood.priority) == (
        "flood",
        3000,
        20.0,
        None,
    )
    assert (light.tenant, light.num_requests, light.priority) == ("light", 300, 0)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("synthetic:tenant=a,n=5,rate=1;n=5,rate=1", "part 2: tenant=NAME is required"),
        ("synthetic:n=5,rate=1;tenant=b,n=5,rate=1", "part 1: tenant=NAME is required"),
        (
            "synthetic:tenant=a,n=5,rate=1;tenant=b,n=5,rate=1;tenant=a,n=2,rate=1",
            "part 3: tenant 'a' already names part 1",
        ),
        ("synthetic:tenant=a b,n=5,rate=1", "tenant='a b': use letters, digits, '-' and '_'"),
        (
            "synthetic:tenant=a,n=5,rate=1;tenant=b.c,n=5,rate=1",
            "part 2 (tenant=b.c): tenant='b.c': use letters",
        ),
        ("synthetic:n=5,rate=1,priority=high", "priority='high' is not an integer"),
        (
            "synthetic:tenant=a,n=5,rate=1;tenant=b,n=5,rate=1,priority=1.5",
            "part 2 (tenant=b): priority='1.5' is not an integer",
        ),
        ("synthetic:n=5,rate=1,priority=99999999999999999999", "does not fit in 64 bits"),
        ("synthetic:tenant=a,n=5,rate=1;;tenant=b,n=5,rate=1", "part 2 is empty"),
        ("synthetic:tenant=a,n=5,rate=1;", "part 2 is empty"),
        ("synthetic:tenant=a,n=5,rate=1;tenant=b,rate=2", "part 2 (tenant=b): missing n="),
        ("synthetic:tenant=a,n=5,rate=1;tenant=b,n=5,rate=x", "part 2 (tenant=b): rate='x'"),
        ("synthetic:tenant=a,n=5,rate=1;tenant=b,n=5,rate=1,tenant=c", "key 'tenant' given"),
    ],
)
def test_bad_tenant_specs_name_the_part_and_key(text: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        open_trace(text)
    message = str(caught.value)
    assert message.startswith("synthetic spec: ") and words in message, message


def test_parse_spec_wants_one_part() -> None:
    with pytest.raises(SpecError, match="2 parts separated by ';' where one is expected"):
        parse_spec(TENANT_EXAMPLE)


def test_text_summary_caps_the_group_lines() -> None:
    tenants = [f"t{i}" for i in range(25)]
    trace = Trace.from_arrays("many", np.arange(25.0), [1] * 25, [1] * 25, tenant=tenants)
    text = format_summary(summarize(trace))
    assert (
        "t19 " in text and "t20 " not in text and "(and 5 more; --json lists every tenant)" in text
    )
    assert len(summarize(trace).tenants) == 25


@pytest.mark.parametrize("tenant", ["a", "b", "flood", "light"])
def test_a_tenant_with_a_system_prompt_beside_one_without_generates(tenant):
    """Shared prefixes in one part only: the others get empty prefix lists; each tenant's
    ids stay within int64 whatever its name hashes to."""
    other = "z" if tenant != "z" else "y"
    trace = open_trace(f"synthetic:tenant={tenant},n=20,rate=2,system=64;"
                       f"tenant={other},n=20,rate=2,prompt=fixed(64)", seed=3)
    ids = trace.table["prefix_hash_ids"]
    mine = trace.table["tenant"] == tenant
    assert all(len(row) > 0 for row in ids[mine]) and all(len(row) == 0 for row in ids[~mine])
