"""The CEL subset used by x-kubernetes-validations."""

from __future__ import annotations

from kubesim.apiserver import cel

RULE = (
    "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && "
    "(!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)"
)


def test_immutability_rule() -> None:
    expr = cel.parse(RULE)
    assert expr.fn is not None
    assert expr.uses_old_self
    assert expr.evaluate({}, {}) is True
    assert expr.evaluate({"volumeClaimTemplates": [1]}, {"volumeClaimTemplates": [1]}) is True
    assert expr.evaluate({"volumeClaimTemplates": [1]}, {}) is False
    assert expr.evaluate({"volumeClaimTemplates": [2]}, {"volumeClaimTemplates": [1]}) is False


def test_comparisons_and_size() -> None:
    assert cel.parse("self.replicas <= 3").evaluate({"replicas": 2}, None) is True
    assert cel.parse("size(self.name) > 2 || self.name == 'ab'").evaluate({"name": "ab"}, None) is True
    assert cel.parse("self.items.size() == 0").evaluate({"items": [1]}, None) is False


def test_unsupported_rules_are_not_enforced() -> None:
    expr = cel.parse("self.all(x, x > 0)")
    assert expr.fn is None
    assert expr.evaluate([-1], None) is True
