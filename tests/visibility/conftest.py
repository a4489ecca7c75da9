"""The visibility tests use the `store` fixture of tests/conftest.py (a real store on
SQLite and on PostgreSQL) and the live servers it starts."""
