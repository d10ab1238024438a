"""Alembic environment: always run programmatically by `database.migrate` on a live connection."""
from alembic import context

from database.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
