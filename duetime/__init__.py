"""duetime: durable delayed-message delivery, on time, never lost.

Keep delayed messages in a store (SQLite by default), and a dispatcher forwards each to its
destination when it is due.
"""

from duetime.client import DelayedMessageClient, SyncDelayedMessageClient
from duetime.clock import SystemClock
from duetime.engine.dispatcher import Dispatcher
from duetime.engine.observe import DispatchObserver, Settled
from duetime.engine.sinks import DispatchStats
from duetime.errors import (
    ConfigurationError,
    CriticalError,
    DeadlineExceeded,
    DestinationNotFound,
    DestinationUnavailable,
    DuetimeError,
    DuplicateMessageId,
    InvalidMessage,
    InvalidSchedule,
    MessageInFlight,
    MessageNotFound,
    MessageRefused,
    MissingExtra,
    NotReplicated,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
    StoreNotReady,
    TransportError,
    TransportUnavailable,
    UnknownScheme,
    UnsupportedTransactionMode,
)
from duetime.interfaces import (
    DelayedMessageStore,
    IfExists,
    ListQuery,
    Page,
    Put,
    ReceivedMessage,
    ReceivingTransport,
    StoreCounts,
    SyncDelayedMessageStore,
    Transport,
)
from duetime.message import DelayedMessage, new_message_id
from duetime.nservicebus.frontdoor import FrontDoor, send_delayed
from duetime.registry import connect, connect_sync, open_store, open_sync_store, open_transport
from duetime.service import Service
from duetime.settings import DelayedDeliverySettings, TransactionMode
from duetime.version import __version__ as __version__

__all__ = [
    "ConfigurationError",
    "CriticalError",
    "DeadlineExceeded",
    "DelayedDeliverySettings",
    "DelayedMessage",
    "DelayedMessageClient",
    "DelayedMessageStore",
    "DestinationNotFound",
    "DestinationUnavailable",
    "DispatchObserver",
    "DispatchStats",
    "Dispatcher",
    "DuetimeError",
    "DuplicateMessageId",
    "FrontDoor",
    "IfExists",
    "InvalidMessage",
    "InvalidSchedule",
    "ListQuery",
    "MessageInFlight",
    "MessageNotFound",
    "MessageRefused",
    "MissingExtra",
    "NotReplicated",
    "Page",
    "Put",
    "ReceivedMessage",
    "ReceivingTransport",
    "ScheduleExists",
    "ScheduleNotFound",
    "Service",
    "Settled",
    "StoreCounts",
    "StoreError",
    "StoreNotReady",
    "SyncDelayedMessageClient",
    "SyncDelayedMessageStore",
    "SystemClock",
    "TransactionMode",
    "Transport",
    "TransportError",
    "TransportUnavailable",
    "UnknownScheme",
    "UnsupportedTransactionMode",
    "connect",
    "connect_sync",
    "new_message_id",
    "open_store",
    "open_sync_store",
    "open_transport",
    "send_delayed",
]
