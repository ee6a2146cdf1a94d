"""The resume report: which bindings changed since the previous launch, and their fate.

Every launch writes `ROOT/config/operative_config-<train_step>.gin`. On a resume
the newest one is compared with this launch's operative config; each changed
binding is either applied or refused. A refused change stops the launch with
exit status 2 before anything in ROOT is touched.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from typing import Dict, List, Optional

import gin
from gin import config_parser

from harness.base.errors import UsageError

# Changes that cannot apply to a restored run, with the reason shown to the user.
REFUSED = {
    'make_agent.fc_layer_params': 'the Q-network shapes are in the checkpoint',
    'make_agent.conv_layer_params': 'the Q-network shapes are in the checkpoint',
    'make_agent.n_step_update': 'it changes the sequence length stored in the replay table',
    'make_agent.optimizer': "the optimizer's slot variables are in the checkpoint",
    'make_agent.rmsprop_momentum': ("RMSProp's momentum slots are in the checkpoint, or "
                                    'missing from it'),
    'make_agent.agent': 'the checkpoint holds another agent and network',
    'make_agent.dueling': 'the Q-network shapes are in the checkpoint',
    'make_agent.num_atoms': 'the Q-network shapes are in the checkpoint',
    'make_agent.num_quantiles': 'the Q-network shapes are in the checkpoint',
    'make_agent.min_q_value': "the trained logits are of the old support's atoms",
    'make_agent.max_q_value': "the trained logits are of the old support's atoms",
    'make_agent.noisy': 'the Q-network layers (and their noise scales) are in the checkpoint',
    'make_agent.noisy_sigma0': ('it only sets the initial noise scale; the learned scales are '
                                'in the checkpoint'),
    'make_env.env_id': 'the checkpoint and the replay table hold another environment',
    'train_eval.replay_capacity': ("Reverb restores the table's old max_size from its "
                                   'checkpoint and would ignore the new one'),
    'train_eval.prioritized_replay': "Reverb restores the table's old sampler from its checkpoint",
    'PrioritizedReplay.priority_exponent': "Reverb restores the table's old sampler from its checkpoint",
    'frame_replay.enabled': 'the replay table stores another item layout',
    'atari_preprocessing.stack_size': 'the Q-network input and the stored stacks depend on it',
    'atari_preprocessing.screen_size': 'the Q-network input and the stored frames depend on it',
}
# Not settings of the run: paths and addresses may differ from launch to launch.
IGNORED = {'train_eval.root_dir', 'train_eval.replay_address', 'train_eval.job',
           'train_eval.collector_id'}


@dataclasses.dataclass
class Change:
  binding: str
  before: str
  after: str
  refused_because: Optional[str] = None

  def line(self) -> str:
    fate = f'refused: {self.refused_because}' if self.refused_because else 'applied'
    return f'{self.binding}: {self.before} -> {self.after} [{fate}]'


def parse_bindings(text: str) -> Dict[str, str]:
  """`{'configurable.param': 'value as written'}` of an operative config."""
  parser = config_parser.ConfigParser(text, gin.config.ParserDelegate(skip_unknown=True))
  bindings = {}
  for statement in parser:
    if isinstance(statement, config_parser.BindingStatement):
      scope = f'{statement.scope}/' if statement.scope else ''
      bindings[f'{scope}{statement.selector}.{statement.arg_name}'] = repr(statement.value)
  return bindings


def _step_of(path: str) -> int:
  match = re.search(r'operative_config-(\d+)\.gin$', path)
  return int(match.group(1)) if match else -1


def previous_config(config_dir: str) -> Optional[str]:
  """Path of the newest operative config in ROOT/config, if any."""
  paths = glob.glob(os.path.join(config_dir, 'operative_config-*.gin'))
  return max(paths, key=lambda p: (_step_of(p), os.path.getmtime(p))) if paths else None


def compare(previous_text: str, current_text: str) -> List[Change]:
  """Every binding whose value differs between two operative configs."""
  before, after = parse_bindings(previous_text), parse_bindings(current_text)
  changes = []
  for name in sorted(set(before) | set(after)):
    if name in IGNORED or before.get(name) == after.get(name):
      continue
    changes.append(Change(name, before.get(name, '(unset)'), after.get(name, '(unset)'),
                          REFUSED.get(name)))
  return changes


def check_changes(config_dir: str, current_text: str) -> List[Change]:
  """Compares with the previous launch; raises UsageError on a refused change."""
  previous = previous_config(config_dir)
  if previous is None:
    return []
  with open(previous) as f:
    changes = compare(f.read(), current_text)
  refused = [c for c in changes if c.refused_because]
  if refused:
    c = refused[0]
    raise UsageError(
        f'cannot resume {os.path.dirname(config_dir)} with {c.binding}={c.after} '
        f'(it was {c.before}): {c.refused_because}; keep {c.before} or start a new --root_dir')
  return changes


def write_report(config_dir: str, train_step: int, changes: List[Change],
                 reapplied: list, pair_warning: Optional[str]) -> str:
  """Writes ROOT/config/resume-<train_step>.txt and returns its path."""
  lines = [f'Resumed at train_step {train_step}.', '',
           'Bindings changed since the previous launch:']
  lines += [f'  {c.line()}' for c in changes] or ['  (none)']
  lines += ['', 'Settings the checkpoint restored and this launch set back '
            '(checkpoint value -> value now in effect):']
  lines += [f'  {r.line()}' for r in reapplied] or ['  (none)']
  if pair_warning:
    lines += ['', f'Warning: {pair_warning}']
  path = os.path.join(config_dir, f'resume-{train_step}.txt')
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return path
