"""Database errors: one line naming the database (password masked) and the cause."""
from ir.errors import TensortuneError


class DatabaseError(TensortuneError):
    """A database that cannot be opened, read or written, or a bad import file."""
