"""Property: whatever valid message goes into the SQLite store comes back identical."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime import DelayedMessage, TransactionMode
from duetime.backends.sqlite import SyncSqliteStore

text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1)
messages = st.builds(
    DelayedMessage,
    message_id=text.filter(str.strip).map(lambda s: s[:250]),
    destination=text.filter(str.strip).map(lambda s: s[:200]),
    due_at=st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(9998, 12, 31), timezones=st.just(UTC)
    ),
    body=st.binary(max_size=2048),
    headers=st.dictionaries(text, st.text(), max_size=8),
)

folder = Path(tempfile.mkdtemp(prefix="duetime-prop-"))
store = SyncSqliteStore(folder / "prop.db")
store.setup_infrastructure("prop")
store.initialize("prop", TransactionMode.AT_LEAST_ONCE)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_sqlite_round_trip_is_exact(message: DelayedMessage) -> None:
    store.remove(message.message_id)
    store.store(message)
    assert store.get(message.message_id) == message
    claimed = store.fetch_due(message.due_at + timedelta(microseconds=0), 10_000)
    assert message.message_id in [m.message_id for m in claimed]
    store.remove(message.message_id)
