"""tests/_results.py's comparison of a recomputed number with the number a results file prints: within exactly one
unit of the printed number's last digit (issue 55), read from decimals, scientific notation and integers, with the
signs, percentages, ranges and lists the files print."""

from __future__ import annotations

import math

import pytest

from tests._results import assert_all_printed, assert_printed, printed_numbers


@pytest.mark.parametrize(
    "text, value, unit",
    [
        ("0.1234", 0.1234, 1e-4),
        ("+2.7e-5", 2.7e-5, 1e-6),
        ("−5.8e-3", -5.8e-3, 1e-4),  # U+2212, as the files print a minus
        ("-0.50", -0.5, 1e-2),
        ("12", 12.0, 1.0),
        ("5,000", 5000.0, 1.0),  # a thousands comma, not a decimal point
        ("24.7 %", 24.7, 0.1),
        ("1.6×", 1.6, 0.1),
        ("3e2", 300.0, 100.0),
        ("1.25E+03", 1250.0, 10.0),
    ],
)
def test_a_printed_number_and_the_unit_of_its_last_digit(text, value, unit):
    (number,) = printed_numbers(text)
    assert number.value == pytest.approx(value, rel=1e-12) and number.unit == pytest.approx(unit, rel=1e-12)


def test_the_numbers_of_a_cell_in_order():
    assert [n.value for n in printed_numbers("0.5000 / 0.9949")] == [0.5, 0.9949]
    assert [n.value for n in printed_numbers("0.34 [0.16, 0.37]")] == [0.34, 0.16, 0.37]
    assert [n.value for n in printed_numbers("3.6–24.7 %")] == [3.6, 24.7]  # an en dash: a range, not a minus
    assert [n.value for n in printed_numbers("0.1-0.2")] == [0.1, 0.2]  # a hyphen after a digit: a range too
    assert [n.value for n in printed_numbers("+6.1e-6 (+3.6e-7)")] == [6.1e-6, 3.6e-7]
    assert [n.value for n in printed_numbers("0.85 ± 0.02")] == [0.85, 0.02]
    assert [n.value for n in printed_numbers("1,000 of 5,000")] == [1000.0, 5000.0]
    assert [n.value for n in printed_numbers("gpt2 and 10⁴")] == [10.0]  # digits inside a word are not numbers


def test_within_one_unit_of_a_scientific_mantissa():
    assert_printed(2.7499e-5, "+2.8e-5")  # the case: rounded down now, up in the file
    assert_printed(2.7e-5, "+2.8e-5")  # exactly one unit (1e-6) below
    assert_printed(2.9e-5, "+2.8e-5")  # exactly one unit above
    for off in (2.69e-5, 2.91e-5, 2.6e-5):  # more than one unit
        with pytest.raises(AssertionError, match=r"the file prints '\+2\.8e-5' \(± 1e-06"):
            assert_printed(off, "+2.8e-5", "− same grid")


def test_within_one_unit_of_the_last_decimal():
    assert_printed(0.12345, "0.1234")
    assert_printed(0.1235, "0.1234")  # one unit (1e-4) either way
    assert_printed(0.1233, "0.1234")
    for off in (0.12351, 0.12329, 0.1236):
        with pytest.raises(AssertionError):
            assert_printed(off, "0.1234")
    assert_printed(4.3025, "4.3024")  # σ rounded up to 1e-4 one step further by another scipy
    with pytest.raises(AssertionError):
        assert_printed(4.3026, "4.3024")


def test_within_one_unit_of_an_integer_and_of_a_percentage():
    assert_printed(4999, "5,000")
    assert_printed(5001.0, "5,000")
    with pytest.raises(AssertionError):
        assert_printed(5001.5, "5,000")
    assert_printed(24.8, "24.7 %")
    assert_printed(24.6, "24.7 %")
    with pytest.raises(AssertionError):
        assert_printed(0.247, "24.7 %")  # a percentage is compared in percent, not as a fraction


def test_signs_count():
    assert_printed(-5.8e-3, "−5.8e-3")
    assert_printed(-5.8e-3, "-5.8e-3")
    with pytest.raises(AssertionError):
        assert_printed(2.7e-5, "−2.7e-5")
    with pytest.raises(AssertionError):
        assert_printed(-2.7e-5, "+2.7e-5")
    assert_printed(0.0, "-0.00")  # a negative value rounded to zero
    assert_printed(-0.004, "0.00")


def test_nan_matches_only_nan_and_inf_only_itself():
    assert_printed(math.nan, "nan")
    assert_printed(float("nan"), "NaN")
    with pytest.raises(AssertionError):
        assert_printed(math.nan, "0.5")
    with pytest.raises(AssertionError):
        assert_printed(0.5, "nan")
    assert_printed(math.inf, "inf")
    assert_printed(-math.inf, "−inf")
    with pytest.raises(AssertionError):
        assert_printed(math.inf, "−inf")
    with pytest.raises(AssertionError):
        assert_printed(1e300, "inf")


def test_one_number_expected():
    with pytest.raises(AssertionError, match="expected one number"):
        assert_printed(0.5, "0.5 / 0.6")
    with pytest.raises(AssertionError, match="expected one number"):
        assert_printed(0.5, "—")


def test_every_number_of_a_list_within_its_own_unit():
    assert_all_printed([3.6e-8, 2.7499e-5], "+3.6e-8 / +2.8e-5")  # the row
    assert_all_printed([0.50004, 0.99485], "0.5000 / 0.9949")
    assert_all_printed([0.335, 0.165, 0.37], "0.34 [0.16, 0.37]")
    assert_all_printed([3.6, 24.7], "3.6–24.7 %")
    assert_all_printed([1.0001, 0.0199], "1.0000 / 0.01")  # each number's own unit: 1e-4, then 1e-2
    with pytest.raises(AssertionError, match=r"0\.0201 vs 0\.01"):
        assert_all_printed([1.0001, 0.0201], "1.0000 / 0.01", "ε")
    with pytest.raises(AssertionError, match=r"1\.0002 vs 1\.0000"):
        assert_all_printed([1.0002, 0.01], "1.0000 / 0.01", "ε")
    with pytest.raises(AssertionError, match="2 values for the 3 numbers"):
        assert_all_printed([0.34, 0.16], "0.34 [0.16, 0.37]")
    with pytest.raises(AssertionError, match="ε, q 0.05"):
        assert_all_printed([0.5, 0.9951], "0.5000 / 0.9949", "ε, q 0.05")
