"""Alembic environment and revisions of the store's schema, shipped inside the package."""
