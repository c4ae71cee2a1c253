"""Node 0 of a gang picks its c10d rendezvous port from TORCHYARD_RENDEZVOUS_PORTS, outside the ports the kernel hands
to outgoing connections: one of those took a gang's port between the pick and torchrun's bind (EADDRINUSE)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobs.settings import Settings
from tests.quick_examples import examples
from worker.node import free_port


@contextmanager
def listening(ports: list[int]) -> Iterator[None]:
    """Another program's listeners on ``ports``."""
    with ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def test_the_default_range_lies_below_the_kernels_outgoing_ports() -> None:
    low, high = Settings().rendezvous_ports
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low, ephemeral_high = map(int, f.read().split())
    assert high < ephemeral_low or low > ephemeral_high


@given(st.integers(21000, 21900), st.integers(0, 40))
@settings(max_examples=examples(40), deadline=None)
def test_the_port_is_one_of_the_range(low: int, width: int) -> None:
    assert low <= free_port("127.0.0.1", (low, low + width)) <= low + width


def test_a_port_another_program_listens_on_is_never_picked() -> None:
    with listening([22500, 22502]):
        assert {free_port("localhost", (22500, 22502)) for _ in range(20)} == {22501}


def test_a_range_with_no_free_port_says_which_setting() -> None:
    with listening([22600, 22601]), pytest.raises(RuntimeError, match="no free port in 22600-22601.*TORCHYARD_RENDEZVOUS_PORTS"):
        free_port("127.0.0.1", (22600, 22601))


def test_the_setting_is_a_range_of_unprivileged_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHYARD_RENDEZVOUS_PORTS", "29400-29499")
    assert Settings().rendezvous_ports == (29400, 29499)
    for bad in ("29400", "29499-29400", "80-90", "29400-70000", "a-b"):
        monkeypatch.setenv("TORCHYARD_RENDEZVOUS_PORTS", bad)
        with pytest.raises(ValidationError, match="TORCHYARD_RENDEZVOUS_PORTS must be"):
            Settings()
