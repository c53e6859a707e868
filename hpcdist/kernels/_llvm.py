"""Small LLVM intrinsics the CPU kernels are built from (private).

Each one is a few lines of LLVM IR that Numba cannot express in Python:
an integer address turned into a typed pointer, a ``memcpy`` between two
addresses, bit casts between ``float32`` and ``uint32``, atomic loads and
stores with acquire/release ordering, and a CPU spin-wait hint.

Example: ``pointer(addr, np.dtype(np.float32))`` inside ``@njit`` code is a
``float32*`` to ``addr``; ``numba.carray(ptr, n)`` makes it an array view.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.core.extending import intrinsic

# Numba's on-disk cache writes object code through LLVM's streamer, which
# aborts on inline asm (the spin-wait hint) unless the asm parser is set up.
binding.initialize_native_asmparser()

# An intrinsic's code generator: (target context, IR builder, signature, argument values).
_Codegen = Callable[[Any, Any, Any, Any], Any]


def storage_type(scalar: types.Type) -> types.Type:
    """The Numba type whose bits hold ``scalar``: ``uint16`` for ``float16``, else itself.

    Numba has no ``float16`` arithmetic on the CPU, so half floats are moved as
    ``uint16`` bit patterns and converted by :mod:`hpcdist.kernels.half`.

    Example: ``storage_type(types.float16) is types.uint16``.
    """
    return types.uint16 if scalar == types.float16 else scalar


def _scalar_of(dt: types.Type) -> types.Type:
    if isinstance(dt, (types.DType, types.NumberClass)):
        return dt.dtype
    raise TypingError(f"expected a dtype (such as arr.dtype), found {dt}")


@intrinsic
def pointer(typingctx: Any, addr: types.Type, dt: types.Type) -> tuple[Any, _Codegen]:
    """``addr`` (an integer) as a pointer to ``dt``'s storage type."""
    if not isinstance(addr, types.Integer):
        raise TypingError(f"expected an integer address, found {addr}")
    ptrty = types.CPointer(storage_type(_scalar_of(dt)))
    sig = ptrty(types.int64, dt)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@intrinsic
def memcpy(
    typingctx: Any, dst: types.Type, src: types.Type, nbytes: types.Type
) -> tuple[Any, _Codegen]:
    """``memcpy(dst, src, nbytes)`` for integer addresses (the regions must not overlap)."""
    sig = types.void(types.int64, types.int64, types.int64)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        bytep = context.get_value_type(types.CPointer(types.uint8))
        d = builder.inttoptr(args[0], bytep)
        s = builder.inttoptr(args[1], bytep)
        cgutils.raw_memcpy(builder, d, s, args[2], 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx: Any, bits: types.Type) -> tuple[Any, _Codegen]:
    """The ``float32`` whose bit pattern is the low 32 bits of ``bits``."""
    sig = types.float32(types.uint32)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx: Any, value: types.Type) -> tuple[Any, _Codegen]:
    """The bit pattern of a ``float32`` as ``uint32``."""
    sig = types.uint32(types.float32)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


def _check_flags(arr: types.Type) -> None:
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64):
        raise TypingError(f"expected a 1-D int64 array of flags, found {arr}")


@intrinsic
def load_acquire(typingctx: Any, flags: types.Type, index: types.Type) -> tuple[Any, _Codegen]:
    """``flags[index]`` read with an atomic acquire load (no bounds check)."""
    _check_flags(flags)
    sig = types.int64(flags, types.intp)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


@intrinsic
def store_release(
    typingctx: Any, flags: types.Type, index: types.Type, value: types.Type
) -> tuple[Any, _Codegen]:
    """``flags[index] = value`` with an atomic release store (no bounds check)."""
    _check_flags(flags)
    sig = types.void(flags, types.intp, types.int64)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()

    return sig, codegen


_MACHINE = platform.machine().lower()
if _MACHINE in ("x86_64", "amd64", "i386", "i686", "x86"):
    _PAUSE_ASM: str | None = "pause"
elif _MACHINE in ("aarch64", "arm64"):
    _PAUSE_ASM = "yield"
else:
    _PAUSE_ASM = None


@intrinsic
def pause_hint(typingctx: Any) -> tuple[Any, _Codegen]:
    """A spin-wait hint (x86 ``pause``, ARM ``yield``), nothing elsewhere."""
    sig = types.void()

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        if _PAUSE_ASM is not None:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.asm(fnty, _PAUSE_ASM, "~{memory}", [], True)
        return context.get_dummy_value()

    return sig, codegen


def accumulator_type(scalar: types.Type) -> types.Type:
    """The type sums of ``scalar`` are kept in: ``float32`` for ``float16``, else itself.

    Example: ``accumulator_type(types.float16) is types.float32``.
    """
    return types.float32 if scalar == types.float16 else scalar


@intrinsic
def stack_block(typingctx: Any, size: types.Type, dt: types.Type) -> tuple[Any, _Codegen]:
    """A pointer to ``size`` (a compile-time constant) accumulator slots on the stack."""
    if not isinstance(size, types.IntegerLiteral):
        raise TypingError(f"expected a constant block size, found {size}")
    n = size.literal_value
    ptrty = types.CPointer(accumulator_type(_scalar_of(dt)))
    sig = ptrty(size, dt)

    def codegen(
        context: Any, builder: ir.IRBuilder, signature: Any, args: list[ir.Value]
    ) -> ir.Value:
        elem = context.get_data_type(ptrty.dtype)
        return cgutils.alloca_once(builder, elem, size=n)

    return sig, codegen
