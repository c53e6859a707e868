"""Mixed precision against the real CuPy module (imported only: no GPU is used).

CuPy has no bfloat16 dtype, so a ``mixed_bfloat16`` model on CuPy arrays is refused with a
typed error that names ``mixed_float16``; float16 computes as ``numpy.float16`` there.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.errors import ArrayInteropError
from hpcdist.nn import mixed_precision as mp

cupy = pytest.importorskip("cupy", reason="CuPy is part of the gpu extra (make gpu-contract)")


def test_bfloat16_on_cupy_is_a_typed_error_and_float16_is_float16() -> None:
    with pytest.raises(ArrayInteropError, match="CuPy has no bfloat16.*mixed_float16"):
        mp.compute_array_dtype("bfloat16", cupy)
    assert mp.compute_array_dtype("float16", cupy) == np.float16
