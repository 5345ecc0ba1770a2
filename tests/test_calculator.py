import time

import pytest

from textenv.tools import TOOL_ERROR_PREFIX, Calculator, call_tool


@pytest.fixture()
def calculator():
    return Calculator()


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("13-3", "10"),
        ("4*3", "12"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("10 - 4 - 3", "3"),
        ("-5 + 2", "-3"),
        ("-(-3)", "3"),
        ("2 * -3", "-6"),
        ("+7", "7"),
        ("2**10", "1024"),
        ("2^10", "1024"),
        ("2^3^2", "512"),  # right-associative, as in Python
        ("-2^2", "-4"),  # unary minus binds looser than the power
        ("2**-2", "0.25"),
        ("1/2", "0.5"),
        ("6/3", "2.0"),
        ("7//2", "3"),
        ("7 % 3", "1"),
        ("0.1 + 0.2", "0.3"),
        ("1/3", "0.333333333333"),
        ("2.5 * 4", "10.0"),
        ("1e20 * 10", "1e+21"),
        ("  12 * 12 = ", "144"),
        ("123456789 * 987654321", "121932631112635269"),
    ],
)
def test_arithmetic(calculator, expression, expected):
    assert calculator(expression) == expected


def test_legacy_format_shows_floats_like_the_legacy_tool():
    legacy = Calculator(legacy_format=True)
    assert legacy("13-3") == "10.0"
    assert legacy("4*3") == "12.0"
    assert legacy("1/4") == "0.25"


def test_evaluate_returns_numbers(calculator):
    assert calculator.evaluate("2^3") == 8
    assert isinstance(calculator.evaluate("2^3"), int)
    assert calculator.evaluate("1/4") == pytest.approx(0.25)


@pytest.mark.parametrize(
    "expression, reason",
    [
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("9**9**9", "digits"),
        ("10**100000", "digits"),
        ("(10**600) * (10**600)", "digits"),
        ("1e308 * 10", "too large"),
        ("2.0 ** 100000", "too large"),
        ("(-8) ** 0.5", "complex"),
        ("", "empty"),
        ("   ", "empty"),
        ("x + 1", "names"),
        ("__import__('os').system('echo hi')", "not allowed"),
        ("().__class__", "not allowed"),
        ("abs(-1)", "function calls"),
        ("lambda: 1", "lambdas"),
        ("'a' * 3", "literal"),
        ("True + 1", "literal"),
        ("2j", "literal"),
        ("1 < 2", "comparisons"),
        ("[1, 2]", "not allowed"),
        ("1 +", "invalid expression"),
        ("2(3)", "function calls"),
        ("1" + "+1" * 120, "parts"),
        ("(" * 200 + "1" + ")" * 200, "longer than"),
        ("1" * 10_000, "longer than"),
    ],
)
def test_refused_or_failing_input_is_a_quick_tool_error(calculator, expression, reason):
    started = time.perf_counter()
    result = calculator(expression)
    assert time.perf_counter() - started < 0.5
    assert result.startswith(TOOL_ERROR_PREFIX)
    assert reason in result


def test_nesting_within_the_length_limit_still_works(calculator):
    assert calculator("(" * 100 + "1+1" + ")" * 100) == "2"


def test_result_size_limit_is_configurable():
    assert Calculator(max_result_digits=10)("10**9") == "1000000000"
    assert Calculator(max_result_digits=10)("10**20").startswith(TOOL_ERROR_PREFIX)


def test_non_string_input_is_a_tool_error(calculator):
    assert calculator(12).startswith(TOOL_ERROR_PREFIX)


def test_works_through_the_tool_protocol(calculator):
    assert call_tool(calculator, "6*7") == "42"
