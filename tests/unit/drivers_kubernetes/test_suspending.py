"""Pause and resume's pure parts on Kubernetes: which Sandbox API can suspend, and the writes."""

from __future__ import annotations

import pytest

from warmshell.core.errors import FailedPreconditionError
from warmshell.drivers.kubernetes import kube, labels, status, suspending


def test_only_a_sandbox_api_with_the_operating_mode_can_suspend() -> None:
    suspending.check_served(kube.sandboxes("v1beta1"))
    with pytest.raises(FailedPreconditionError, match="Sandbox v1alpha1, which has no operatingMode"):
        suspending.check_served(kube.sandboxes("v1alpha1"))


def test_the_writes_and_what_they_read_back_as() -> None:
    written = {"metadata": {"name": "s"}, **suspending.mode_patch(suspending.SUSPENDED)}
    assert status.is_suspended(written)
    assert not status.is_suspended({"spec": suspending.mode_patch(suspending.RUNNING)["spec"]})
    assert not status.is_suspended({"spec": {}})  # the CRD's default is Running
    assert suspending.proof_patch("sealed") == {"metadata": {"annotations": {labels.ACTIVATION_PROOF: "sealed"}}}
