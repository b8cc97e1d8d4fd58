"""What differs between the two databases in the SQL the store writes: :class:`Dialect`.

The store's statements are written once, with ``?`` placeholders and the portable ``INSERT ...
ON CONFLICT`` (:func:`upsert`); the migrations' DDL is written once too, over the column types a
dialect names (``$serial``, ``$real``, ``$bigint``: :meth:`Dialect.ddl`). :data:`SQLITE` and
:data:`POSTGRESQL` are the two dialects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from string import Template


@dataclass(frozen=True)
class Dialect:
    """One database's spelling of the store's SQL.

    Attributes:
        name: ``"sqlite"`` or ``"postgresql"`` (a store's ``dialect``).
        serial: an auto-numbered primary key column (SQLite ``INTEGER PRIMARY KEY AUTOINCREMENT``,
            PostgreSQL ``BIGSERIAL PRIMARY KEY``).
        real: a float column (Unix seconds): ``REAL`` / ``DOUBLE PRECISION`` (8 bytes both).
        bigint: a 64-bit integer column (versions, fencing tokens): ``INTEGER`` / ``BIGINT``.
        claim_suffix: what ends a claim's SELECT (PostgreSQL ``FOR UPDATE SKIP LOCKED``: rows another
            replica is claiming are skipped).
        row_lock: what ends a SELECT whose row is then updated (PostgreSQL ``FOR UPDATE``).
        pyformat: the driver takes ``%s`` placeholders (psycopg), so ``?`` becomes ``%s`` and a
            literal ``%`` doubles (:meth:`q`).
    """

    name: str
    serial: str
    real: str
    bigint: str
    claim_suffix: str = ""
    row_lock: str = ""
    pyformat: bool = False

    def q(self, sql: str) -> str:
        """``sql`` written with ``?`` placeholders, as this database's driver takes it."""
        return sql.replace("%", "%%").replace("?", "%s") if self.pyformat else sql

    def ddl(self, template: str) -> str:
        """``template`` with ``$serial``, ``$real`` and ``$bigint`` replaced by this dialect's column
        types. Raises KeyError for another ``$name``."""
        return Template(template).substitute(serial=self.serial, real=self.real, bigint=self.bigint)


SQLITE = Dialect("sqlite", serial="INTEGER PRIMARY KEY AUTOINCREMENT", real="REAL", bigint="INTEGER")
POSTGRESQL = Dialect("postgresql", serial="BIGSERIAL PRIMARY KEY", real="DOUBLE PRECISION", bigint="BIGINT",
                     claim_suffix=" FOR UPDATE SKIP LOCKED", row_lock=" FOR UPDATE", pyformat=True)


def marks(n: int) -> str:
    """``n`` placeholders for ``IN (...)``: ``"?,?,?"``."""
    return ",".join("?" * n)


def upsert(table: str, columns: Sequence[str], key: Sequence[str], update: Sequence[str] = ()) -> str:
    """``INSERT INTO table (columns) VALUES (?, ...) ON CONFLICT (key)`` then ``DO UPDATE SET`` each of
    ``update`` to the inserted value, or ``DO NOTHING`` when ``update`` is empty (the same on both
    databases)."""
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
           f"ON CONFLICT ({', '.join(key)}) DO ")
    if not update:
        return sql + "NOTHING"
    return sql + "UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in update)
