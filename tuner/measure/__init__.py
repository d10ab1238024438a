"""Measurement: build candidates, check them against NumPy, time them, in workers."""
from tuner.measure.base import Builder, BuildResult, Runner, measure
from tuner.measure.local import LocalBuilder, LocalRunner
from tuner.measure.registry import (MeasureStageError, builder_names, make_builder, make_runner, register_builder,
                                    register_runner, runner_names)
from tuner.measure.replay import ReplayBuilder, ReplayRunner, ReplayTemplate, Table
from tuner.measure.result import STATUSES, MeasureInput, MeasureResult

__all__ = ["Builder", "BuildResult", "Runner", "measure", "LocalBuilder", "LocalRunner", "MeasureInput",
           "MeasureResult", "STATUSES", "ReplayBuilder", "ReplayRunner", "ReplayTemplate", "Table",
           "make_builder", "make_runner", "register_builder", "register_runner", "builder_names", "runner_names",
           "MeasureStageError"]
