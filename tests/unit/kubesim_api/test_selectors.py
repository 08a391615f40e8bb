"""Label and field selectors."""

from __future__ import annotations

import pytest

from kubesim.apiserver import errors, selectors


def obj(labels: dict[str, str] | None = None, name: str = "a", ns: str = "default") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app in (web, db)", {"app": "db"}, True),
        ("app notin (web,db)", {"app": "db"}, False),
        ("app notin (web)", {}, True),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("app=web,tier in (a,b),!debug", {"app": "web", "tier": "b"}, True),
        ("app=web,tier in (a,b),!debug", {"app": "web", "tier": "b", "debug": "1"}, False),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    pred = selectors.label_selector(selector)
    assert pred is not None
    assert pred(obj(labels)) is expected


def test_empty_selector_selects_everything() -> None:
    assert selectors.label_selector("") is None
    assert selectors.field_selector(None) is None


def test_field_selector() -> None:
    pred = selectors.field_selector("metadata.name=a,metadata.namespace!=kube-system")
    assert pred is not None
    assert pred(obj(name="a"))
    assert not pred(obj(name="b"))
    assert not pred(obj(name="a", ns="kube-system"))
    phase = selectors.field_selector("status.phase=Running")
    assert phase is not None
    assert phase(obj())


def test_custom_resources_only_support_name_and_namespace_fields() -> None:
    with pytest.raises(errors.ApiError) as exc:
        selectors.field_selector("spec.replicas=1", custom=True)
    assert exc.value.code == 400
    assert "field label not supported: spec.replicas" in exc.value.message


def test_exact_name() -> None:
    assert selectors.exact_name("metadata.name=x") == "x"
    assert selectors.exact_name("metadata.name==x") == "x"
    assert selectors.exact_name("metadata.name!=x") is None
    assert selectors.exact_name("metadata.name=x,metadata.namespace=y") is None
