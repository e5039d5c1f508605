"""Built-in op families. Importing this package registers every op."""

from . import elementwise  # noqa: F401
