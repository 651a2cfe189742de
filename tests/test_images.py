"""Both images run the service as an unprivileged user, uid 1000 as the Kubernetes
manifests' ``runAsUser``: no process needs root, and Celery warns at every start under it."""

from __future__ import annotations

import re

import pytest
import yaml

from .services import ROOT


@pytest.mark.parametrize("image", ["Dockerfile", "Dockerfile.gpu"])
def test_the_image_ends_as_an_unprivileged_user(image):
    text = (ROOT / image).read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), users
    assert "--uid 1000" in text
    after = text.rsplit("\nUSER ", 1)[1]
    assert not re.search(r"^(RUN|USER\s+(root|0))\b", after, re.M)  # nothing as root after


def test_the_manifests_run_as_that_user():
    checked = 0
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec")
            if spec and spec.get("containers"):
                assert spec.get("securityContext", {}).get("runAsUser") == 1000, path
                checked += 1
    assert checked >= 5  # the API, the workers, maintenance, the migration job
