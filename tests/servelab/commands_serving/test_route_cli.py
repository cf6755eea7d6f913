"""servelab route's flags: a bad upstream-health setting is one line naming the field."""

from __future__ import annotations

import pytest

from servelab.cli import main


@pytest.mark.parametrize("flags, field", [
    (["--first-byte-timeout-s", "2", "--connect-timeout-s", "5"], "first_byte_timeout_s"),
    (["--ejection-base-s", "10", "--ejection-max-s", "5"], "ejection_max_s"),
    (["--health-check-timeout-s", "0"], "--health-check-timeout-s: expected a number > 0"),
    (["--retries", "-1"], "--retries: expected an integer >= 0"),
    (["--per-try-timeout-s", "0"], "--per-try-timeout-s: expected a number > 0"),
    (["--request-timeout-s", "0"], "--request-timeout-s: expected a number > 0")])
def test_route_command_names_a_bad_health_flag_in_one_line(flags, field, capsys):
    assert main(["route", "--upstream", "http://127.0.0.1:9", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelab route: error: ") and field in err
    assert err.count("\n") == 1
