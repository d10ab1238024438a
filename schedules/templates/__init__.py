"""One module per op family; importing this package registers them in order of preference
(more specific first: dense before batch_matmul, the generic elementwise template last)."""
from schedules.templates import dense  # noqa: F401
from schedules.templates import conv2d  # noqa: F401
from schedules.templates import batch_matmul  # noqa: F401
from schedules.templates import pool  # noqa: F401
from schedules.templates import reduce  # noqa: F401
from schedules.templates import elementwise  # noqa: F401
from schedules.templates import cuda  # noqa: F401,E402  (GPU templates: kind "cuda")
