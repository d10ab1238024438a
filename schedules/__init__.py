"""Compute definitions as loop nests, config spaces, and one template per op family."""
from schedules.registry import all_templates, find_template, get_template, register_template
from schedules.space import Config, ConfigError, ConfigSpace, Knob
from schedules.template import Lowered, Template

__all__ = ["Config", "ConfigError", "ConfigSpace", "Knob", "Template", "Lowered",
           "get_template", "find_template", "all_templates", "register_template"]
