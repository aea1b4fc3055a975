"""The safe formula evaluator: whitelist, evaluation, rendering back to Python."""
import pytest

from opgen.errors import ExprError
from opgen.spec.expr import cdiv, parse, pow2, python_helpers


@pytest.mark.parametrize("source, env, expected", [
    ("32 if K <= 32 else (128 if K % 128 == 0 else 64)", {"K": 96}, 64),
    ("32 if K <= 32 else (128 if K % 128 == 0 else 64)", {"K": 256}, 128),
    ("cdiv(T, BT)", {"T": 100, "BT": 64}, 2),
    ("pow2(K)", {"K": 48}, 64),
    ("max(16, min(K, 64))", {"K": 8}, 16),
    ("dtype in ('float16', 'bfloat16')", {"dtype": "bfloat16"}, True),
    ("not (a and b) or c", {"a": True, "b": False, "c": False}, True),
    ("abs(scale) > 1", {"scale": -2.5}, True),
    ("2 ** 10 // 3 % 7", {}, 5),
    ("1 < x <= 3", {"x": 3}, True),
])
def test_evaluates(source, env, expected):
    assert parse(source).evaluate(env) == expected


@pytest.mark.parametrize("source, fragment", [
    ("__import__('os').system('true')", "call of \"__import__"),
    ("__import__('os')", "call of '__import__'"),
    ("open('/etc/passwd')", "call of 'open'"),
    ("eval('1')", "call of 'eval'"),
    ("q.shape", "attribute access"),
    ("().__class__", "attribute access"),
    ("x[0]", "subscript"),
    ("(lambda: 1)()", "call of"),
    ("[i for i in range(3)]", "ListComp"),
    ("x := 3", "syntax error"),
    ("max", "must be called"),
    ("min(*xs)", "starred"),
    ("max(a, key=b)", "keyword"),
    ("1 +", "syntax error"),
])
def test_refuses(source, fragment):
    with pytest.raises(ExprError) as info:
        parse(source)
    assert fragment in str(info.value)
    assert repr(source) in str(info.value)


def test_unknown_name_at_evaluation_lists_known_names():
    with pytest.raises(ExprError, match="unknown name 'Q'.*known: K, T"):
        parse("Q + 1").evaluate({"K": 1, "T": 2})


def test_huge_exponent_refused():
    with pytest.raises(ExprError, match="exponent"):
        parse("2 ** n").evaluate({"n": 10_000})


def test_arithmetic_error_is_expr_error():
    with pytest.raises(ExprError, match="ZeroDivisionError"):
        parse("K // 0").evaluate({"K": 3})


def test_names_and_calls_are_listed():
    e = parse("cdiv(T, BT) + max(K, 1)")
    assert e.names == ("BT", "K", "T")
    assert e.calls == ("cdiv", "max")


@pytest.mark.parametrize("source", [
    "32 if K <= 32 else (128 if K % 128 == 0 else 64)",
    "cdiv(T, BT) * pow2(K) - abs(s)",
    "dtype == 'float16' and not flag",
])
def test_python_rendering_round_trips(source):
    expr = parse(source)
    helpers = {}
    exec(python_helpers(expr.python_calls()), helpers)  # noqa: S102 - the test checks the rendered text
    for K in (1, 31, 32, 33, 96, 128, 300):
        env = {"K": K, "T": 3 * K + 1, "BT": 64, "s": -K, "dtype": "float16", "flag": K % 2 == 0}
        rendered = eval(expr.to_python(), dict(helpers), dict(env))  # noqa: S307
        assert rendered == expr.evaluate(env)


def test_helpers():
    assert [cdiv(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert [pow2(x) for x in (0, 1, 2, 3, 64, 65)] == [1, 1, 2, 4, 64, 128]


def test_generated_helpers_are_the_evaluated_ones():
    rendered = {}
    exec(python_helpers({"cdiv", "pow2", "log2", "min"}), rendered)  # noqa: S102
    assert set(rendered) - {"__builtins__"} == {"cdiv", "pow2", "log2"}
    assert [rendered["log2"](x) for x in (1, 2, 3, 64)] == [0, 1, 1, 6]
    with pytest.raises(ValueError, match="non-positive"):
        rendered["log2"](0)  # the rendered copy keeps the x <= 0 check


def test_constant_formulas():
    assert parse(3).evaluate({}) == 3
    assert parse(True).evaluate({}) is True
