"""GPU templates (`Template.kind = "cuda"`): the same workloads as the CPU templates, as
numba-cuda kernels (loops bound to blocks and threads, shared-memory staging). One module
per op family; importing this package registers them."""
from schedules.templates.cuda import elementwise  # noqa: F401,E402
from schedules.templates.cuda import reduce  # noqa: F401,E402
