"""``tagplan demo``, the README's run command: embedded service on loopback, a zoo model
submitted over HTTP without a key, the summary printed, the service stopped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.backends import environment_without_settings


@pytest.mark.slow
def test_demo_plans_a_zoo_model_and_exits() -> None:
    env = environment_without_settings()
    done = subprocess.run(
        [sys.executable, "-m", "tagplan", "demo", "--model", "mlp", "--budget-s", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout
    assert "predicted step time" in done.stdout and "baselines" in done.stdout
