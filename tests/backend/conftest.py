"""The fake Tinker service's state, reset around each test that asks for it (`fake_service`)."""

import fake_tinker
import pytest


@pytest.fixture
def fake_service(monkeypatch):
    fake_tinker.reset()
    monkeypatch.setenv("TINKER_API_KEY", "tk-test-secret")
    yield
    fake_tinker.reset()
