"""What processes and Ray actors share above their transport: every instance ends a weight update on one
version, a disagreement or a lost instance is a clear error, and the next update starts them all again."""

from __future__ import annotations

import pytest

from seer.rollout.backends.remote import RemoteBackend
from seer.rollout.config import RolloutConfig
from tests.rollout.fake_transport import FakeTransport


def backend(versions: list[int], instances: int) -> tuple[RemoteBackend, FakeTransport]:
    config = RolloutConfig(instances=instances)
    link = FakeTransport(versions)
    return RemoteBackend("m", config, config.instance_engine("m", default_threads=1), link), link


def test_update_weights_records_the_version_of_every_instance() -> None:
    """Each proxy's snapshot gets its own instance's new version, so the coordinator sees them agree."""
    b, link = backend([3, 3, 3], instances=3)
    assert b.weight_versions() == [0]  # nothing started yet
    assert b.update_weights("ckpt") == 3 and link.spawned == 1
    assert b.weight_versions() == [3, 3, 3]
    assert b._weights == ("ckpt", 3)  # what restarted instances will be given


def test_instances_that_disagree_after_an_update_are_an_error() -> None:
    b, _ = backend([3, 4], instances=2)
    with pytest.raises(RuntimeError, match=r"different weight versions: \[3, 4\]"):
        b.update_weights("ckpt")


def test_an_instance_lost_during_an_update_is_an_error_then_all_restart() -> None:
    # first update: 1, 1; the failed one: 2 (instance 0 only); restarted hosts reload 1, 1, then take 3, 3
    b, link = backend([1, 1, 2, 1, 1, 3, 3], instances=2)
    assert b.update_weights("a") == 1
    b.after_weights_sent = lambda: b.kill_instance(1)
    with pytest.raises(RuntimeError, match="instance 1 was lost during its weight update"):
        b.update_weights("b")
    b.after_weights_sent = None
    assert not link.alive(1)
    assert b.update_weights("c") == 3 and link.spawned == 2
    assert b.weight_versions() == [3, 3] and b._weights == ("c", 3)
