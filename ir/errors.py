"""Errors that name what is wrong; the CLIs print them as one line and exit != 0."""


class TensortuneError(Exception):
    """Base of every error a user can cause (bad model, bad shape, bad database...)."""


class ModelError(TensortuneError):
    """The model file is missing, unreadable, or not a valid ONNX graph."""


class UnsupportedOpError(TensortuneError):
    """An op (or an attribute value of an op) that tensortune cannot run."""


class ShapeError(TensortuneError):
    """A shape that is inconsistent, or a dynamic dim bound outside its declared range."""


class DataDependentShapeError(ShapeError):
    """An output shape depends on tensor data (not on shapes): only the model's annotation can tell."""


def run_cli(prog: str, run, args, interrupted: str = "") -> int:
    """Run a CLI body: a user error is one line `PROG: error: ...` and exit 2; an
    interrupt exits 130; a bug is one line too, unless TENSORTUNE_DEBUG is set."""
    import os
    import sys
    try:
        return run(args)
    except TensortuneError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted{'; ' + interrupted if interrupted else ''}", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("TENSORTUNE_DEBUG"):
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {e} (set TENSORTUNE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
