"""Rate strings: every documented form, several at once, and clear errors for bad input."""

from __future__ import annotations

import pytest

from ratewarden import Rate, parse_rate, parse_rates
from ratewarden.limits import Limit, make_limits


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [
        ("100/min", 100, 60.0),
        ("10/s", 10, 1.0),
        ("10/second", 10, 1.0),
        ("10/seconds", 10, 1.0),
        ("10/sec", 10, 1.0),
        ("5 per 30 seconds", 5, 30.0),
        ("5 per second", 5, 1.0),
        ("1000/day", 1000, 86400.0),
        ("1000/d", 1000, 86400.0),
        ("100/5m", 100, 300.0),
        ("100/5 minutes", 100, 300.0),
        ("7/hour", 7, 3600.0),
        ("7/2h", 7, 7200.0),
        ("3/week", 3, 604800.0),
        ("3/2w", 3, 1209600.0),
        ("50/ms", 50, 0.001),
        ("50/250ms", 50, 0.25),
        ("2/500 milliseconds", 2, 0.5),
        ("1/1.5s", 1, 1.5),
        ("  20 / MIN  ", 20, 60.0),
        ("20/Minute", 20, 60.0),
    ],
)
def test_parse_rate_forms(text: str, limit: int, period: float) -> None:
    rate = parse_rate(text)
    assert rate.limit == limit
    assert rate.period == pytest.approx(period)
    assert rate.burst is None


def test_burst_suffix() -> None:
    rate = parse_rate("10/s burst 25")
    assert (rate.limit, rate.period, rate.burst, rate.capacity) == (10, 1.0, 25, 25)
    assert parse_rate("10/s").capacity == 10
    assert "burst 25" in str(rate)


@pytest.mark.parametrize("text", ["10/s; 1000/day", "10/s;1000/day", "10/s, 1000/day", " 10/s ;; 1000/day ; "])
def test_several_rates_in_one_string(text: str) -> None:
    rates = parse_rates(text)
    assert [(r.limit, r.period) for r in rates] == [(10, 1.0), (1000, 86400.0)]


def test_several_rates_as_a_list_mixing_strings_and_rates() -> None:
    rates = parse_rates(["10/s", Rate(1000, 86400.0), "5 per 30 seconds"])
    assert [(r.limit, r.period) for r in rates] == [(10, 1.0), (1000, 86400.0), (5, 30.0)]
    assert parse_rates(Rate(3, 2.0)) == (Rate(3, 2.0),)
    assert parse_rate(Rate(3, 2.0)) == Rate(3, 2.0)


@pytest.mark.parametrize(
    ("text", "bad_part"),
    [
        ("100/fortnight", "fortnight"),
        ("100 per lightyear", "lightyear"),
        ("ten/min", "ten/min"),
        ("100", "100"),
        ("/min", "/min"),
        ("100/", "100/"),
        ("100//min", "100//min"),
        ("-5/min", "-5/min"),
        ("1.5/min", "1.5/min"),
        ("", ""),
    ],
)
def test_bad_rate_message_quotes_the_bad_part_and_shows_an_example(text: str, bad_part: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    message = str(info.value)
    assert repr(bad_part) in message or repr(text) in message
    assert '"100/min"' in message  # a valid example is shown


def test_bad_part_of_a_multi_rate_string_is_named() -> None:
    with pytest.raises(ValueError) as info:
        parse_rates("10/s; 1000/eon")
    assert "1000/eon" in str(info.value)
    assert "eon" in str(info.value)


@pytest.mark.parametrize("text", ["0/min", "0 per 30 seconds", "10/0s", "10/0 minutes", "10/0.0s", "10/s burst 0"])
def test_zero_amounts_and_periods_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match="positive"):
        parse_rate(text)


@pytest.mark.parametrize(
    ("limit", "period", "burst", "debt"),
    [(0, 1.0, None, None), (-1, 1.0, None, None), (5, 0.0, None, None), (5, -1.0, None, None),
     (5, 1.0, 0, None), (5, 1.0, -3, None), (5, 1.0, None, -1.0)],
)
def test_rate_constructor_rejects_non_positive_values(
    limit: int, period: float, burst: int | None, debt: float | None
) -> None:
    with pytest.raises(ValueError):
        Rate(limit, period, burst, debt)


def test_rate_constructor_rejects_non_integer_limits() -> None:
    with pytest.raises(ValueError):
        Rate(True, 1.0)
    with pytest.raises(ValueError):
        Rate(2.5, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [None, 10, 1.5, b"10/s"])
def test_non_string_rate_is_an_error(value: object) -> None:
    with pytest.raises(ValueError, match="string"):
        parse_rate(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", " ; ", []])
def test_empty_rate_list_is_an_error(value: object) -> None:
    with pytest.raises(ValueError):
        parse_rates(value)  # type: ignore[arg-type]


def test_unknown_algorithm_lists_the_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        make_limits("10/s", "leaky_window")
    assert "leaky_window" in str(info.value)
    assert "token_bucket" in str(info.value) and "gcra" in str(info.value)


def test_rate_text_and_ident_round_trip() -> None:
    for text in ["100/min", "5 per 30 seconds", "1000/day", "50/250ms", "7/2h"]:
        rate = parse_rate(text)
        again = parse_rate(str(rate))
        assert (again.limit, again.period) == (rate.limit, pytest.approx(rate.period))
    assert parse_rate("100/min").ident == "100/60000"
    assert parse_rate("50/250ms").ident == "50/250"


def test_limits_of_several_rates_have_distinct_names_and_suffixes() -> None:
    limits = make_limits("10/s; 1000/day", "sliding_window", "api")
    assert len({limit.name for limit in limits}) == 2
    assert len({limit.suffix for limit in limits}) == 2
    assert all(limit.name.startswith("api") for limit in limits)
    # Burst and debt are part of the storage identity: changing them never reuses old state.
    assert Limit(Rate(10, 1.0, 20), "gcra").suffix != Limit(Rate(10, 1.0), "gcra").suffix
    assert Limit(Rate(10, 1.0, None, 2.0), "token_bucket_debt").suffix != Limit(Rate(10, 1.0), "token_bucket_debt").suffix
