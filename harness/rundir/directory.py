"""`RunDirectory`: opens ROOT for a launch, refuses bad resumes, restores, writes launch files."""

from __future__ import annotations

import os
from typing import Optional

from absl import logging
import gin

from harness.base import disk
from harness.rundir import checkpoints
from harness.rundir import resume
from harness.rundir.checkpoints import AgentParts


class RunDirectory:
  """Opens ROOT for a launch: refuses bad resumes, restores, writes launch files.

  Nothing is written to ROOT until `write_launch_files`, so a refused resume
  (exit status 2) leaves ROOT as it was.
  """

  def __init__(self, root_dir: str, parts: AgentParts):
    self.root_dir = root_dir
    self.config_dir = os.path.join(root_dir, 'config')
    self._operative_config = gin.operative_config_str()
    self._changes = resume.check_changes(self.config_dir, self._operative_config)
    self.checkpointer = checkpoints.ResumableCheckpointer(root_dir, parts.built,
                                                          parts.run_state)
    self._reapplied = self.checkpointer.initialize_or_restore()
    self.restored_step = int(parts.train_step.numpy())
    if self.checkpointer.restored:
      logging.info('Resumed from %s at train_step %d, env_steps %d',
                   self.checkpointer.latest(), self.restored_step,
                   int(parts.run_state.env_steps.numpy()))

  def write_launch_files(self, pair_warning: Optional[str]) -> None:
    """The operative config of this launch and, on a resume, its report."""
    path = os.path.join(self.config_dir, f'operative_config-{self.restored_step}.gin')
    with disk.writing(path):
      os.makedirs(self.config_dir, exist_ok=True)
      with open(path, 'w') as f:
        f.write(self._operative_config)
    if self.checkpointer.restored:
      report_path = os.path.join(self.config_dir, f'resume-{self.restored_step}.txt')
      with disk.writing(report_path):
        report = resume.write_report(self.config_dir, self.restored_step, self._changes,
                                     self._reapplied, pair_warning)
      with open(report) as f:
        logging.info('Resume report (%s):\n%s', report, f.read())
