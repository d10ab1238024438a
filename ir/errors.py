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
