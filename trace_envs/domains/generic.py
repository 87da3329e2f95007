"""The generic tools every τ²-style domain shares: ``calculate`` and ``transfer_to_human_agents``.

Domain toolkits inherit :class:`GenericTools`, so both tools have one implementation and one schema
in every domain (as in τ²-bench, where they are not domain-specific).
"""

from __future__ import annotations

import ast
import math
import operator

from ..core.tools import ToolError, tool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = frozenset("0123456789+-*/(). ")
MAX_EXPRESSION_CHARS = 500


def safe_arithmetic(expression: str) -> float:
    """Evaluate ``+ - * / ( )`` over numbers, parsed with ``ast`` — no names, calls, powers or ``eval``.

    Raises:
        ToolError: with an agent-readable reason for anything else.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is too long (at most {MAX_EXPRESSION_CHARS} characters).")
    if not expression.strip() or not set(expression) <= _ALLOWED:
        raise ToolError("the expression may contain only numbers, + - * /, parentheses and spaces.")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}.") from None
    except (RecursionError, MemoryError):  # parentheses nested too deep for the parser
        raise ToolError("the expression is nested too deeply; simplify it.") from None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ToolError("division by zero.")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        raise ToolError("the expression may contain only numbers, + - * /, parentheses and spaces.")

    try:
        value = float(ev(tree))
    except OverflowError:  # an integer too large for a float, or a float product past 1.8e308
        raise ToolError("the result is too large to compute; check the numbers in the expression.") from None
    if not math.isfinite(value):
        raise ToolError("the result is too large to compute; check the numbers in the expression.")
    return value


def calculate(expression: str) -> str:
    """The result of ``expression`` rounded to 2 decimals, as text (what the ``calculate`` tool returns)."""
    return str(round(safe_arithmetic(expression), 2))


class GenericTools:
    """Tools shared by every τ²-style domain."""

    @tool
    def calculate(self, expression: str) -> str:
        """Calculate the result of an arithmetic expression.

        Args:
            expression: The expression, with numbers, + - * /, parentheses and spaces, such as '2 * (150 + 30)'.
        """
        return calculate(expression)

    @tool
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the issue. Transfer only if the user explicitly
        asks for a human agent, or if the request cannot be handled within the policy and the tools.

        Args:
            summary: A short summary of the user's issue.
        """
        return "Transfer successful"
