"""The agents: `make_agent` builds the run's agent from its `make_agent.*` bindings.

Networks, schedules held in variables, and one module per agent type. May import
harness.base only. The names below are the package's public face.
"""

from harness.rl.agents.factory import BuiltAgent, check_settings, make_agent
from harness.rl.agents.networks import DuelingHead, ScaleByMaximum
from harness.rl.agents.schedules import SCHEDULE_BINDINGS, LinearSchedule, schedule_changes

__all__ = ['BuiltAgent', 'DuelingHead', 'LinearSchedule', 'SCHEDULE_BINDINGS', 'ScaleByMaximum',
           'check_settings', 'make_agent', 'schedule_changes']
