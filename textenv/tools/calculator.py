"""A safe arithmetic calculator tool: parses the query with :mod:`ast` and evaluates only numbers and
arithmetic operators (never ``eval``), with bounds on input length, tree size and result size."""

from __future__ import annotations

import ast
import math
import operator
from typing import Callable, Union

from .base import TOOL_ERROR_PREFIX

Number = Union[int, float]

_BINARY_OPERATORS: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPERATORS: dict[type, Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_NODE_DESCRIPTIONS: dict[type, str] = {
    ast.Name: "names",
    ast.Attribute: "attributes",
    ast.Call: "function calls",
    ast.Lambda: "lambdas",
    ast.Subscript: "subscripts",
    ast.Compare: "comparisons",
    ast.BoolOp: "boolean operators",
}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; its message is shown to the model."""


class Calculator:
    """Evaluate an arithmetic expression such as ``"(2 + 3) * -4 ^ 2"``.

    Supported: integer and float literals, ``+ - * /``, ``//`` and ``%``, parentheses, unary ``-``/``+``,
    and powers written ``**`` or ``^`` (``^`` is a power, not XOR). The expression is parsed with
    :mod:`ast` and only these nodes are evaluated; names, calls, attributes, strings, lambdas and
    everything else are refused. A trailing ``=`` is ignored.

    Result format (predictable, so prompts can show it):

    * integer arithmetic stays integer: ``"13-3"`` -> ``"10"``, ``"2**10"`` -> ``"1024"``;
    * ``/`` is true division and gives a float, like Python: ``"1/2"`` -> ``"0.5"``, ``"6/3"`` -> ``"2.0"``;
    * floats are rounded to 12 significant digits and shown with :func:`repr`: ``"0.1+0.2"`` -> ``"0.3"``,
      ``"1/3"`` -> ``"0.333333333333"``, ``"1e20*10"`` -> ``"1e+21"``;
    * with ``legacy_format=True`` every result is shown as a float, as the legacy TRL example tool
      (``ybelkada/simple-calculator``) did: ``"13-3"`` -> ``"10.0"``.

    Failures never raise: they are returned as ``"Tool error: <reason>"`` text (division by zero,
    refused syntax, limits exceeded).

    Args:
        max_length (`int`, *optional*, defaults to 256):
            Longest accepted expression, in characters.
        max_nodes (`int`, *optional*, defaults to 200):
            Largest accepted syntax tree, in nodes (numbers and operators).
        max_result_digits (`int`, *optional*, defaults to 1000):
            Largest integer (intermediate or final) in decimal digits; bounds ``9**9**9``-style inputs
            before they are computed.
        legacy_format (`bool`, *optional*, defaults to `False`):
            Show every result as a float (``"10.0"``), like the legacy TRL calculator tool.

    Example:

    ```python
    >>> calculator = Calculator()
    >>> calculator("13-3"), calculator("2^3 * -1"), calculator("1/0")
    ('10', '-8', 'Tool error: division by zero')
    ```
    """

    def __init__(
        self,
        max_length: int = 256,
        max_nodes: int = 200,
        max_result_digits: int = 1000,
        legacy_format: bool = False,
    ):
        self.max_length = max_length
        self.max_nodes = max_nodes
        self.max_result_digits = max_result_digits
        self.legacy_format = legacy_format
        # log2(10) bits per decimal digit; checked on bit lengths, which are cheap.
        self._max_bits = int(max_result_digits * math.log2(10)) + 1

    def __call__(self, query: str) -> str:
        """Evaluate an arithmetic expression and return the result, or ``"Tool error: ..."`` text.

        Args:
            query: the expression, for example ``13-3`` or ``(2+3)*4``.
        """
        try:
            return self._format(self.evaluate(query))
        except CalculatorError as error:
            return f"{TOOL_ERROR_PREFIX}{error}"
        except ZeroDivisionError:
            return f"{TOOL_ERROR_PREFIX}division by zero"
        except OverflowError:
            return f"{TOOL_ERROR_PREFIX}the result is too large"
        except (RecursionError, MemoryError):
            return f"{TOOL_ERROR_PREFIX}the expression is too deeply nested"
        except Exception as error:  # noqa: BLE001 - a tool never raises into the episode
            return f"{TOOL_ERROR_PREFIX}{type(error).__name__}: {error}"

    def evaluate(self, query: str) -> Number:
        """Evaluate ``query`` and return the number.

        Raises:
            CalculatorError: the expression is refused or a limit is exceeded.
            ZeroDivisionError, OverflowError: the arithmetic itself fails.
        """
        expression = self._clean(query)
        tree = self._parse(expression)
        return self._evaluate_node(tree.body)

    def _clean(self, query: str) -> str:
        if not isinstance(query, str):
            raise CalculatorError(f"expected a text expression, got {type(query).__name__}")
        if len(query) > self.max_length:
            raise CalculatorError(f"the expression is longer than {self.max_length} characters")
        expression = query.strip().rstrip("=").strip()
        if not expression:
            raise CalculatorError("empty expression")
        return expression.replace("^", "**")

    def _parse(self, expression: str) -> ast.Expression:
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError as error:
            raise CalculatorError(f"invalid expression ({error.msg})") from None
        node_count = sum(1 for _ in ast.walk(tree))
        if node_count > self.max_nodes:
            raise CalculatorError(f"the expression has more than {self.max_nodes} parts")
        return tree

    def _evaluate_node(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Constant):
            return self._literal(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
            return _UNARY_OPERATORS[type(node.op)](self._evaluate_node(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
            left, right = self._evaluate_node(node.left), self._evaluate_node(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            return self._checked(_BINARY_OPERATORS[type(node.op)](left, right))
        what = _NODE_DESCRIPTIONS.get(type(node), f"{type(node).__name__} expressions")
        raise CalculatorError(f"unsupported expression: {what} are not allowed, only numbers and + - * / ^ ( )")

    @staticmethod
    def _literal(value: object) -> Number:
        # bool is an int subclass; complex literals ("2j") and strings are refused too.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise CalculatorError(f"unsupported literal {value!r}: only numbers are allowed")

    def _check_power(self, base: Number, exponent: Number) -> None:
        # Only int ** positive int builds a big integer; float powers overflow (OverflowError) instead.
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            if (base.bit_length() - 1) * exponent > self._max_bits:
                raise CalculatorError(f"the result has more than {self.max_result_digits} digits")

    def _checked(self, value: Number) -> Number:
        if isinstance(value, complex):
            raise CalculatorError("the result is a complex number")
        if isinstance(value, int) and value.bit_length() > self._max_bits:
            raise CalculatorError(f"the result has more than {self.max_result_digits} digits")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("the result is too large")
        return value

    def _format(self, value: Number) -> str:
        if isinstance(value, int) and not self.legacy_format:
            return str(value)
        as_float = float(value)
        if not math.isfinite(as_float):
            raise CalculatorError("the result is too large")
        return repr(float(format(as_float, ".12g")))
