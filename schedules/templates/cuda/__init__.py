"""GPU templates (`Template.kind = "cuda"`): the same workloads as the CPU templates, as
numba-cuda kernels (loops bound to blocks and threads, shared-memory staging). One module
per op family; importing this package registers them, in the CPU templates' order of
preference (dense before batch_matmul: both accept a plain MatMul; elementwise last)."""
from schedules.templates.cuda import dense  # noqa: F401,E402
from schedules.templates.cuda import conv2d  # noqa: F401,E402
from schedules.templates.cuda import batch_matmul  # noqa: F401,E402
from schedules.templates.cuda import pool  # noqa: F401,E402
from schedules.templates.cuda import reduce  # noqa: F401,E402
from schedules.templates.cuda import elementwise  # noqa: F401,E402
