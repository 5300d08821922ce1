"""MariaDB / MySQL store (extra: ``duetime[mysql]``, PyMySQL)."""

from duetime.backends.mysql.store import MysqlOptions, MysqlStore, SyncMysqlStore

__all__ = ["MysqlOptions", "MysqlStore", "SyncMysqlStore"]
