"""Alembic revisions of the store's schema, oldest first (0001_initial, ...)."""
