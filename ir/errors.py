"""Errors that name what is wrong; the CLIs print them as one line and exit != 0.

Every error text goes through `redact`, the one rule that keeps database passwords
out of what we print, log or raise."""
import argparse
import re

# scheme://user:PASSWORD@host (to the last @ of the token: an unencoded @ in a password
# must not leak its tail) and password=... in query strings / libpq conninfo
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)[^\s'\"]*@")
_PARAM_PASSWORD = re.compile(r"(?i)\b(password|passwd|pwd)=[^&\s'\"]*")
_SECRETS: set[str] = set()
_MIN_LITERAL = 4  # shorter passwords are masked inside URLs only (else every "ab" in a text would go)


def remember_secret(secret: str | None) -> None:
    """A password in use by this process: masked wherever its literal text appears
    (drivers quote parts of a connection string in their own words)."""
    if secret and len(secret) >= _MIN_LITERAL:
        _SECRETS.add(secret)


def redact(text) -> str:
    """`text` with every password we can recognize replaced by ***."""
    text = _PARAM_PASSWORD.sub(r"\1=***", _URL_PASSWORD.sub(r"\1***@", str(text)))
    for s in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


class TensortuneError(Exception):
    """Base of every error a user can cause (bad model, bad shape, bad database...)."""

    def __str__(self) -> str:
        return redact(super().__str__())


class ModelError(TensortuneError):
    """The model file is missing, unreadable, or not a valid ONNX graph."""


class UnsupportedOpError(TensortuneError):
    """An op (or an attribute value of an op) that tensortune cannot run."""


class ShapeError(TensortuneError):
    """A shape that is inconsistent, or a dynamic dim bound outside its declared range."""


class InputValueError(TensortuneError):
    """A value in the inputs that the model cannot take (an index out of range): found while running."""


class DataDependentShapeError(ShapeError):
    """An output shape depends on tensor data (not on shapes): only the model's annotation can tell."""


class CliParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line `PROG: error: ...` and exit 2, like every
    other CLI failure (argparse's own prints the usage block first)."""

    def error(self, message):
        import sys
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog.split()[0]} --help)", file=sys.stderr)
        sys.exit(2)


def one_line(e) -> str:
    """An error's text as one line, passwords masked."""
    return " ".join(redact(e).split()) or (type(e).__name__ if isinstance(e, BaseException) else "")


def run_cli(prog: str, run, args, interrupted: str = "") -> int:
    """Run a CLI body: a user error is one line `PROG: error: ...` and exit 2; an
    interrupt exits 130; a bug is one line too, unless TENSORTUNE_DEBUG is set."""
    import os
    import sys
    from ir.settings import Settings, current, use
    before = current()
    try:
        use(Settings.from_env())   # the one place the environment is read: settings passed down from here
        return run(args)
    except TensortuneError as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError as e:  # numpy names the size it could not allocate: a user-sized input
        print(f"{prog}: error: out of memory{': ' + one_line(e) if str(e) else ''} "
              "(try smaller --shape sizes or a smaller model)", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (`| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted{'; ' + interrupted if interrupted else ''}", file=sys.stderr)
        return 130
    except Exception as e:
        if current().debug:
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {one_line(e)} (set TENSORTUNE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
    finally:
        use(before)   # an in-process caller (a test) gets its own settings back
