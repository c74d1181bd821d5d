"""Each rule of the package is written once, read from its source (the AST).

The default scale, the causal mask, the conversion of a boolean mask into an additive
one, the max shift of a stable softmax and the scaled score product ``q·kᵀ·scale`` each
have one home in ``attention/_core.py``; every other module calls it. A matcher per rule
finds every place that writes the rule out, and the test asserts that the only place is
its home. Each matcher is shown to find a planted copy and to pass over the legitimate
look-alikes the package holds (an initialisation bound ``1/sqrt(fan_in)``, a decay tile
multiplying ``q·kᵀ``, a running maximum inside ``torch.maximum``).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import attention

PACKAGE = Path(attention.__file__).parent

# --------------------------------------------------------------------------- shapes


HEAD_SIZE_NAMES = {"d", "dk", "d_k", "d_head", "head_dim"}
NEG_INF_NAMES = {"_INF", "INF", "inf"}


def _minus_one(node) -> bool:
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and node.operand.value == 1
    )


def _is_head_size(node) -> bool:
    """``x.shape[-1]``, ``x.size(-1)``, ``d``, ``head_dim``, ``self.head_dim``."""
    if isinstance(node, ast.Name):
        return node.id in HEAD_SIZE_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr == "head_dim"
    if isinstance(node, ast.Subscript):
        return (
            isinstance(node.value, ast.Attribute)
            and node.value.attr == "shape"
            and _minus_one(node.slice)
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return (
            node.func.attr == "size"
            and len(node.args) == 1
            and _minus_one(node.args[0])
        )
    return False


def _name(node) -> str:
    """The last name of a callee or value: ``torch.isneginf`` -> ``isneginf``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _called(node, *names: str) -> bool:
    return isinstance(node, ast.Call) and _name(node.func) in names


def _is_zero(node) -> bool:
    return (isinstance(node, ast.Constant) and node.value == 0) or _called(
        node, "zeros_like"
    )


def _is_neg_inf(node) -> bool:
    """``float("-inf")``, ``-math.inf``, ``-torch.inf``, ``-float("inf")``, ``-INF``."""
    if _called(node, "float") and node.args:
        arg = node.args[0]
        return isinstance(arg, ast.Constant) and arg.value == "-inf"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        return (
            _name(inner) in NEG_INF_NAMES
            or (isinstance(inner, ast.Attribute) and inner.attr == "inf")
            or (_called(inner, "float") and bool(inner.args))
        )
    return False


def _is_zeros(node, zero_names: set[str]) -> bool:
    """A tensor of zeros: ``torch.zeros(...)``, ``zeros_like``, ``new_zeros``, or a name
    bound to one earlier in the same function."""
    return _called(node, "zeros", "zeros_like", "new_zeros") or (
        isinstance(node, ast.Name) and node.id in zero_names
    )


def _mentions(node, *callees: str) -> bool:
    return any(_called(n, *callees) for n in ast.walk(node))


def _is_transposed(node) -> bool:
    """``k.transpose(-2, -1)``, ``k.transpose(-1, -2)``, ``k.mT``, ``k.T``."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("mT", "T")
    if _called(node, "transpose") and len(node.args) == 2:
        values = [ast.literal_eval(a) for a in node.args if isinstance(a, ast.UnaryOp)]
        return sorted(values) == [-2, -1]
    return False


def _is_scale(node) -> bool:
    """A factor that scales scores: a name holding ``scale`` (or ``s``), a call of
    ``default_scale``, a ``sqrt`` or a power ``-0.5``."""
    if _name(node) == "s" or "scale" in _name(node):
        return True
    return any(
        _called(n, "default_scale", "sqrt", "rsqrt")
        or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow))
        for n in ast.walk(node)
    )


# --------------------------------------------------------------------------- matchers


def default_scales(tree) -> list[ast.AST]:
    """``1/sqrt(d)``: a division by ``sqrt`` of a head size, or ``head size**-0.5``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if _called(right, "sqrt") and right.args and _is_head_size(right.args[0]):
                found.append(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
            half = (
                isinstance(exponent, ast.UnaryOp)
                and isinstance(exponent.operand, ast.Constant)
                and exponent.operand.value == 0.5
            ) or (isinstance(exponent, ast.Constant) and exponent.value == -0.5)
            if half and _is_head_size(node.left):
                found.append(node)
    return found


def causal_masks(tree) -> list[ast.AST]:
    """A lower (or upper) triangle: ``.tril(``, ``.triu(``, ``torch.tril(`` ..."""
    return [n for n in ast.walk(tree) if _called(n, "tril", "triu", "tril_", "triu_")]


def additive_conversions(tree) -> list[ast.AST]:
    """Zeros filled with ``-inf`` where a mask says so; ``torch.where(m, 0, -inf)``."""
    found = []
    for function in _scopes(tree):
        zero_names = {
            target.id
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and _is_zeros(node.value, set())
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            if (
                _called(node, "masked_fill", "masked_fill_")
                and len(node.args) == 2
                and _is_neg_inf(node.args[1])
                and _is_zeros(node.func.value, zero_names)
            ):
                found.append(node)
            if _called(node, "where") and len(node.args) == 3:
                a, b = node.args[1:]
                if (_is_zero(a) and _is_neg_inf(b)) or (_is_neg_inf(a) and _is_zero(b)):
                    found.append(node)
    return list(dict.fromkeys(found))


def max_shifts(tree) -> list[ast.AST]:
    """``x - x.amax(..., keepdim=True)``, or a ``-inf`` maximum replaced by 0 (with
    ``masked_fill(isneginf(m), 0)`` or ``torch.where(isneginf(m), 0, m)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            right = node.right
            if isinstance(right, ast.Attribute) and right.attr == "values":
                right = right.value
            if isinstance(right, ast.Subscript):
                right = right.value
            if _called(right, "amax", "max") and any(
                k.arg == "keepdim" for k in right.keywords
            ):
                found.append(node)
        if (
            _called(node, "masked_fill", "masked_fill_")
            and len(node.args) == 2
            and _is_zero(node.args[1])
            and _mentions(node.args[0], "isneginf", "isinf")
        ):
            found.append(node)
        if (
            _called(node, "where")
            and len(node.args) == 3
            and _mentions(node.args[0], "isneginf", "isinf")
            and _is_zero(node.args[1])
        ):
            found.append(node)
    return found


def score_products(tree) -> list[ast.AST]:
    """``q @ kᵀ`` scaled in the same expression: ``(q @ kᵀ) * scale``, ``/ sqrt(d)``,
    ``(q @ kᵀ).mul_(scale)``, or ``(q * scale) @ kᵀ``."""
    parents = {
        child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
    }
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.MatMult)
            and _is_transposed(node.right)
        ):
            continue
        parent = parents.get(node)
        scaled_after = isinstance(parent, ast.BinOp) and isinstance(
            parent.op, ast.Mult | ast.Div
        )
        if scaled_after:
            other = parent.right if parent.left is node else parent.left
            scaled_after = _is_scale(other)
        scaled_in_place = (
            isinstance(parent, ast.Attribute)
            and parent.attr in ("mul", "mul_", "div", "div_")
            and _called(parents.get(parent), "mul", "mul_", "div", "div_")
            and any(_is_scale(a) for a in parents[parent].args)
        )
        left = node.left
        scaled_before = (
            isinstance(left, ast.BinOp)
            and isinstance(left.op, ast.Mult)
            and (_is_scale(left.left) or _is_scale(left.right))
        )
        if scaled_after or scaled_in_place or scaled_before:
            found.append(node)
    return found


def _scopes(tree):
    """The module and every function in it (a function is searched with its module too,
    so a node may be found twice: callers deduplicate)."""
    return [tree] + [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


# --------------------------------------------------------------------------- where


def _owners(tree) -> dict:
    """``function`` (``Class.method``) holding each node, ``<module>`` outside any."""
    owner = {}

    def visit(node, name):
        for child in ast.iter_child_nodes(node):
            inner = name
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = child.name if name == "<module>" else f"{name}.{child.name}"
            owner[child] = inner
            visit(child, inner)

    visit(tree, "<module>")
    return owner


@functools.cache
def _package() -> list[tuple[str, ast.Module, dict]]:
    """Every module of the package (but the independent ones), parsed once:
    ``(module path, tree, owner of each node)``."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if not module.startswith(INDEPENDENT):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            modules.append((module, tree, _owners(tree)))
    return modules


def _found(matcher) -> set[tuple[str, str]]:
    """``(module path, function)`` of every place in the package the matcher finds."""
    return {
        (module, owner[node])
        for module, tree, owner in _package()
        for node in matcher(tree)
    }


# Each rule, its matcher and its one home.
RULES = {
    "default scale": (default_scales, {("_core.py", "default_scale")}),
    "causal mask": (causal_masks, {("_core.py", "tril_mask")}),
    "bool -> additive mask": (additive_conversions, {("_core.py", "additive_mask")}),
    "max shift": (max_shifts, {("_core.py", "max_shift")}),
    "scaled score product": (score_products, {("_core.py", "attention_scores")}),
}
# Copies being removed on another line of work, ``(rule, module, function): reason``: an
# entry fails once its copy is gone, so the list cannot outlive them. Empty today.
PENDING: dict[tuple[str, str, str], str] = {}
# The exercise checkers compute their expected answers independently of the package
# (as the tests do), so they may write a rule out again.
INDEPENDENT = ("exercises/",)


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_is_written_once(rule):
    matcher, home = RULES[rule]
    pending = {(m, f) for (r, m, f) in PENDING if r == rule}
    found = _found(matcher)
    assert home <= found, f"the matcher no longer finds the {rule} in its home {home}"
    copies = found - home - pending
    assert not copies, (
        f"the {rule} is written out again in {sorted(copies)}: call its one "
        f"implementation in attention/_core.py ({sorted(f for _, f in home)})"
    )
    stale = pending - found
    assert not stale, f"PENDING lists copies that are gone: {sorted(stale)}"


# ---------------------------------------------------------------- the rules can fail


def _lines(matcher, source: str) -> list[int]:
    return sorted(n.lineno for n in matcher(ast.parse(source)))


def test_the_default_scale_matcher_finds_a_copy_and_passes_over_other_roots():
    source = """
def f(q, k, fan_in, scale):
    a = 1.0 / math.sqrt(q.shape[-1])
    b = scores / math.sqrt(d)
    c = head_dim ** -0.5
    bound = 1 / math.sqrt(fan_in)
    e = torch.randn(3) / math.sqrt(k)
    return scale
"""
    assert _lines(default_scales, source) == [3, 4, 5]


def test_the_causal_mask_matcher_finds_a_triangle():
    source = """
def f(n, x):
    a = torch.ones(n, n, dtype=torch.bool).tril()
    b = torch.triu(x, 1)
    c = x.tril_()
    d = torch.arange(n) <= torch.arange(n)[:, None]
    return x.trim()
"""
    assert _lines(causal_masks, source) == [3, 4, 5]


def test_the_conversion_matcher_finds_zeros_filled_with_minus_inf():
    source = """
def f(mask, scores, hide):
    a = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    b = torch.zeros(3, 4)
    b = b.masked_fill(hide, -math.inf)
    c = torch.where(mask, 0.0, float("-inf"))
    scores = scores.masked_fill(~mask, float("-inf"))
    d = torch.zeros(3).masked_fill(hide, 1.0)
    return torch.where(mask, scores, float("-inf"))
"""
    assert _lines(additive_conversions, source) == [3, 5, 6]


def test_the_shift_matcher_finds_a_subtracted_maximum_and_a_zeroed_minus_inf():
    source = """
def f(x, m):
    a = torch.exp(x - x.amax(dim=-1, keepdim=True))
    b = x - x.max(-1, keepdim=True).values
    c = m.masked_fill(torch.isneginf(m), 0.0)
    d = torch.where(torch.isneginf(m), 0.0, m)
    e = torch.maximum(m, x.amax(dim=-1, keepdim=True))
    f = torch.where(torch.isneginf(m), float("inf"), m)
    return x - x.amax()
"""
    assert _lines(max_shifts, source) == [3, 4, 5, 6]


def test_the_score_matcher_finds_scaled_products_and_passes_over_other_products():
    source = """
def f(q, k, v, scale, tile, decay, s):
    a = (q @ k.transpose(-2, -1)) * scale
    b = q @ k.transpose(-1, -2) / math.sqrt(d)
    c = (q @ k.transpose(-2, -1)).mul_(default_scale(scale, 4))
    e = (q * scale) @ k.mT
    g = (q @ k.transpose(-2, -1)) * s
    linear = phi_q @ phi_k.transpose(-2, -1)
    decayed = (q @ k.transpose(-2, -1)) * tile
    state = k.transpose(-2, -1) @ v
    h = (q @ k) * scale
    return (q @ k.transpose(-2, -1)) * decay
"""
    assert _lines(score_products, source) == [3, 4, 5, 6, 7]
