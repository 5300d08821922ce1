"""A MariaDB (or MySQL) database as the bulk jobs and the delivery log see it (:class:`Database`'s
MariaDB answers): backquotes, ``LONGBLOB``, unbuffered cursors, ``INSERT IGNORE … RETURNING``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from duetime.backends.mysql.bulk_rows import MariaDbBulkRows, source_rows
from duetime.backends.mysql.store import MysqlOptions, mysql_connect
from duetime.backends.source_rows import SourceRows
from duetime.backends.sqldb import Database
from duetime.inputs.identifiers import mariadb_name

#: Ids an ``INSERT IGNORE``: two parameters each, well under the server's placeholders.
IDS_A_STATEMENT = 500


@dataclass(frozen=True)
class MariaDbDatabase(Database):
    """A MariaDB database (``mysql://``, ``mariadb://``)."""

    dialect: ClassVar[str] = "mysql"
    blob: ClassVar[str] = "LONGBLOB"
    text: ClassVar[str] = "LONGTEXT"

    def quote(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def kept_name(self, table: str) -> str:
        return mariadb_name(table)

    def source_rows(self, table: str) -> SourceRows:
        return source_rows(self.qualified(table))

    def store_rows(self, table: str) -> MariaDbBulkRows:
        return MariaDbBulkRows(table)

    def lock_ledger_row(self, conn: Any, run_id: str, batch: int) -> None:
        """The ledger row first: a concurrent twin of the batch waits here (MariaDB's gap locks
        would otherwise deadlock the two)."""
        self.execute(conn, self.query("lock_ledger_row"), [run_id, batch])

    def claim_ids(self, conn: Any, job: str, ids: Sequence[str]) -> set[str]:
        claimed: set[str] = set()
        for chunk in self.chunks(ids, IDS_A_STATEMENT):
            values = ", ".join(["(%s, %s)"] * len(chunk))
            cur = self.execute(
                conn, self.query("claim_ids", values=values), [v for i in chunk for v in (job, i)]
            )
            claimed |= {r[0] for r in cur.fetchall()}
        return claimed

    def connect(self, write: bool = True) -> Any:
        return mysql_connect(MysqlOptions.from_url(self.url), autocommit=False)

    def _streaming_cursor(self, conn: Any, size: int) -> Any:
        """An unbuffered cursor (the connection runs nothing else meanwhile)."""
        import pymysql.cursors

        return conn.cursor(pymysql.cursors.SSCursor)
