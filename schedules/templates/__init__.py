"""One module per op family; importing this package registers them in order of preference."""
from schedules.templates import dense  # noqa: F401
from schedules.templates import conv2d  # noqa: F401
from schedules.templates import reduce  # noqa: F401
from schedules.templates import elementwise  # noqa: F401
