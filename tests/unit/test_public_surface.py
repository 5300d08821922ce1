"""``duetime.__all__`` is exactly the public surface: every name it lists exists, every public name
the package exposes is listed, and the list changes only on purpose (this snapshot)."""

from __future__ import annotations

import types

import duetime

SURFACE = {
    "ConfigurationError", "CriticalError", "DeadlineExceeded", "DelayedDeliverySettings",
    "DelayedMessage", "DelayedMessageClient", "DelayedMessageStore", "DestinationNotFound",
    "DispatchStats", "Dispatcher", "DuetimeError", "DuplicateMessageId", "FrontDoor",
    "InvalidMessage", "ListQuery", "MessageInFlight", "MessageNotFound", "MissingExtra", "Page",
    "ReceivedMessage", "ReceivingTransport", "StoreCounts", "StoreNotReady",
    "SyncDelayedMessageClient", "SyncDelayedMessageStore", "SystemClock", "TransactionMode",
    "Transport", "TransportError", "TransportUnavailable", "UnknownScheme",
    "UnsupportedTransactionMode", "new_message_id", "open_store", "open_sync_store",
    "open_transport", "send_delayed", "connect", "connect_sync",
}  # fmt: skip


def test_all_is_exactly_the_public_surface() -> None:
    exposed = {
        name
        for name, value in vars(duetime).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(duetime.__all__) == exposed, "__all__ and the package's public names differ"
    assert len(duetime.__all__) == len(set(duetime.__all__))
    assert set(duetime.__all__) == SURFACE, "the public surface changed: update SURFACE on purpose"


def test_the_version_is_written_once() -> None:
    from importlib.metadata import version

    assert version("duetime") == duetime.__version__
