"""The PostgreSQL backend of the Store (the only package that talks to psycopg).

``PostgresStore`` runs the capability classes shared with the SQLite backend on a
PostgreSQL server; see storage/postgres/store.py.
"""

from keepstep.storage.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
