"""What counts as the compiler's own failure (dynamo or inductor), as opposed to the model's, the device's or a
cancel, and undoing a module's compile: a compiled load, generation or training step that meets one runs
uncompiled instead of failing, and says so. On the H200 an inductor bug once failed every compiled FLUX load
although the model was sound."""
from __future__ import annotations

COMPILER_MODULES = ("torch._dynamo", "torch._inductor")


def compile_failed(error: BaseException | None) -> bool:
    """Whether an error came from the compiler, raised there or wrapped with `raise ... from`. Only the explicit
    cause is followed (an error raised while another was being handled is its own), and a service error such as
    a cancel is never the compiler's, whatever it wraps."""
    from service_kit.errors import ServiceError

    seen = set()
    while error is not None and id(error) not in seen and not isinstance(error, ServiceError):
        seen.add(id(error))
        if type(error).__module__.startswith(COMPILER_MODULES):
            return True
        error = error.__cause__
    return False


def compiler_error(error: BaseException) -> str:
    """The error in one line, for a record or an event."""
    return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"


def uncompile(root) -> None:
    """Every submodule compiled with `nn.Module.compile` (as diffusers' compile_repeated_blocks does) runs its own
    forward again."""
    for module in root.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
