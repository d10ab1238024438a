"""pool template: MaxPool / AveragePool windows (pads, strides, dilations, ceil_mode,
count_include_pad) agree with the NumPy reference."""
from __future__ import annotations

import pytest

from schedules import get_template
from tests.template_cases import check, make_wl

POOL = get_template("pool")


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs,owtile,unroll", [
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 8, True),             # ResNet's
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 8, False),            # its default
    ({"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0], "ceil_mode": 1,
      "dilations": [1, 2], "count_include_pad": 1}, 1, False),
])
def test_windows_match_numpy(op, attrs, owtile, unroll):
    if op == "MaxPool":
        attrs = {k: v for k, v in attrs.items() if k != "count_include_pad"}
    else:
        attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    for shape in [(1, 3, 11, 9), (2, 1, 5, 6)]:
        wl = make_wl([(op, ["i0"], attrs)], [(shape, "float32", False)])
        assert POOL.matches(wl)
        cfg = POOL.space(wl).validate({**POOL.default_config(wl).to_json(), "owtile": owtile, "unroll": unroll,
                                       "PB": 1 if shape[0] == 2 else 4})
        check(POOL, wl, cfg)
