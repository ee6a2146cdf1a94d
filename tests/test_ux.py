"""What a user sees: a quiet log, videos while training, W&B tracking, --help.

One 3,000-step CartPole run (with checkpoints, evaluations and videos inside
it, and `--track` in W&B's offline mode when the `wandb` extra is installed)
serves the quiet-log, video and tracking checks; a copy of it is resumed once.
"""

import dataclasses
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from harness.base import quiet
from tests.cli import REPO, TINY_BINDINGS, harness_train, tail

HARNESS_MODULES = {name for _, _, names in os.walk(os.path.join(REPO, 'harness'))
                   for name in names if name.endswith('.py')}
# An absl log line: "I1130 12:01:40.532190 140341181119360 single_process.py:28] ..."
ABSL_LINE = re.compile(r'^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ ([\w.]+):\d+\] ')

# What may remain on stderr of a good run (docs/logging.md): Reverb's C++
# informational lines (`quiet.NATIVE_CHATTER`), should Reverb write one from a
# thread of its own outside the calls that hold fd 2. Nothing else.
ALLOWED_STDERR = quiet.NATIVE_CHATTER

HAS_WANDB = importlib.util.find_spec('wandb') is not None
NO_WANDB = "the wandb extra is not installed (pip install -e '.[wandb]')"

RUN_BINDINGS = TINY_BINDINGS + [
    'train_eval.num_env_steps=3000',
    'train_eval.log_interval=1000',
    'train_eval.eval_interval=1500',
    'train_eval.checkpoint_interval=1500',
    'train_eval.video_interval=1500',
    'train_eval.final_eval_episodes=2',
    # Four envs and a replay ratio of 1/4 keep the run short.
    'train_eval.num_envs=4',
    'train_eval.collect_steps_per_iteration=4',
]


def _offline_env(tmp_path):
  env = dict(os.environ, WANDB_MODE='offline',
             WANDB_CONFIG_DIR=str(tmp_path / 'wandb_config'),
             WANDB_CACHE_DIR=str(tmp_path / 'wandb_cache'))
  env.pop('WANDB_API_KEY', None)
  return env


@pytest.fixture(scope='module')
def ux_run(tmp_path_factory):
  """A finished 3,000-step run with videos (tracked offline when wandb is there)."""
  tmp = tmp_path_factory.mktemp('ux')
  root = str(tmp / 'cartpole')
  flags = ['--track'] if HAS_WANDB else []
  result = harness_train(root, RUN_BINDINGS, extra_flags=flags, env=_offline_env(tmp))
  assert result.returncode == 0, tail(result)
  return root, result


# --- a quiet log ----------------------------------------------------------------


@pytest.mark.slow
def test_stdout_holds_only_harness_log_lines(ux_run):
  _, result = ux_run
  lines = [line for line in result.stdout.splitlines() if line.strip()]
  foreign = [line for line in lines
             if not (ABSL_LINE.match(line) and ABSL_LINE.match(line).group(1) in HARNESS_MODULES)]
  assert not foreign, 'lines not from a harness module:\n' + '\n'.join(foreign[:20])
  text = result.stdout
  for expected in ('single_process.py', 'env_steps', 'eval at env_steps', 'Checkpoint at',
                   'video at env_steps', 'final policy', 'Done: env_steps'):
    assert expected in text, tail(result)
  # The start-up summary names the environment, the target and ROOT.
  assert re.search(r'Run .*cartpole: DDQN.* on CartPole-v1, 3000 env steps', text), text[:2000]


@pytest.mark.slow
def test_stderr_holds_nothing_but_allowed_lines(ux_run):
  _, result = ux_run
  unexpected = [line for line in result.stderr.splitlines()
                if line.strip() and not any(p.match(line) for p in ALLOWED_STDERR)]
  assert not unexpected, 'stderr of a good run:\n' + '\n'.join(unexpected[:30])


def test_verbosity_1_shows_the_libraries_lines():
  """The filter passes other modules' records only when --verbosity asks."""
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  record = std_logging.LogRecord('tensorflow', std_logging.WARNING, '/site-packages/tf/x.py', 1,
                                 'Found untraced functions', (), None)
  mine = std_logging.LogRecord('absl', std_logging.INFO, quiet.__file__, 1, 'ours', (), None)
  error = std_logging.LogRecord('tensorflow', std_logging.ERROR, '/x.py', 1, 'bad', (), None)
  saved = logging.get_verbosity()
  try:
    logging.set_verbosity(logging.INFO)
    chatter = quiet.LibraryFilter()
    assert not chatter.filter(record)
    assert chatter.filter(mine) and chatter.filter(error)
    logging.set_verbosity(logging.DEBUG)
    assert chatter.filter(record)
  finally:
    logging.set_verbosity(saved)


def test_native_chatter_is_dropped_and_problems_kept():
  text = ('[reverb/cc/platform/default/server.cc:84] Started replay server on port 1234\n'
          '[reverb/cc/client.cc:165] Sampler and server are owned by the same process (1) so '
          'Table t is accessed directly without gRPC.\n'
          '[reverb/cc/platform/default/server.cc:93] Shutting down replay server'
          'Fatal Python error: Segmentation fault\n'
          'E1130 real problem\n')
  assert quiet.keep_lines(text) == 'Fatal Python error: Segmentation fault\nE1130 real problem\n'


# --- videos while training --------------------------------------------------------


@pytest.mark.slow
def test_video_interval_writes_gifs_of_the_episode(ux_run):
  from harness.rl import envs  # pylint: disable=g-import-not-at-top
  from harness.run import video  # pylint: disable=g-import-not-at-top
  root, result = ux_run
  logged = re.findall(r'video at env_steps (\d+): (\S+) \((\d+) steps', result.stdout)
  assert len(logged) == 2, tail(result)  # at 1,500 env steps and at the target
  env = envs.make_env('CartPole-v1', seed=0, render_mode='rgb_array')
  env.reset()
  shape = np.asarray(env.render()).shape
  env.close()
  for env_steps, path, length in logged:
    assert path == os.path.join(root, 'videos', f'{env_steps}.gif')
    frames = video.read_gif(path)
    assert len(frames) == int(length) + 1
    assert all(frame.shape == shape for frame in frames)
  assert sorted(os.listdir(os.path.join(root, 'videos'))) == sorted(
      f'{s}.gif' for s, _, _ in logged)


def test_played_frames_are_the_episodes_and_survive_the_gif(tmp_path):
  from harness.rl import envs  # pylint: disable=g-import-not-at-top
  from harness.run import video  # pylint: disable=g-import-not-at-top
  env = envs.make_env('CartPole-v1', seed=3, render_mode='rgb_array')
  rng = np.random.default_rng(0)
  returns, lengths, frames = video.play(lambda _: np.asarray(rng.integers(2), np.int64), env)
  env.close()
  assert len(frames) == lengths[0] + 1 and returns[0] == lengths[0]
  assert not np.array_equal(frames[0], frames[-1])  # the pole moved
  path = video.write(frames, str(tmp_path / 'v.gif'))
  back = video.read_gif(path)
  assert len(back) == len(frames)
  for mine, theirs in zip(frames, back):
    assert mine.shape == theirs.shape
    assert np.mean(np.abs(mine.astype(int) - theirs.astype(int))) < 2.0


def test_mp4_needs_its_extra_and_writes_a_file(tmp_path):
  from harness.run import video  # pylint: disable=g-import-not-at-top
  from harness.base.errors import UsageError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UsageError, match=r"'gif' or 'mp4'"):
    video.check_format('avi')
  if not video.ffmpeg_available():
    with pytest.raises(UsageError, match=re.escape(video.MP4_EXTRA)):
      video.check_format('mp4')
    return
  frames = [np.full((45, 61, 3), i * 20, np.uint8) for i in range(6)]
  path = video.write(frames, str(tmp_path / 'v.mp4'), fps=10)
  import imageio.v2 as imageio  # pylint: disable=g-import-not-at-top
  with imageio.get_reader(path) as reader:
    assert sum(1 for _ in reader) == 6


def test_video_settings_are_validated():
  from harness.run import experiment  # pylint: disable=g-import-not-at-top
  from harness.base.errors import UsageError  # pylint: disable=g-import-not-at-top
  cfg = experiment.settings_from_gin(root_dir='r', job='all', replay_address=None,
                                     collector_id=0)
  assert cfg.video_interval == 0 and cfg.video_format == 'gif' and not cfg.track
  with pytest.raises(UsageError, match='train_eval.video_interval=-1 must be an integer >= 0'):
    dataclasses.replace(cfg, video_interval=-1).validate()
  with pytest.raises(UsageError, match='train_eval.video_format'):
    dataclasses.replace(cfg, video_interval=100, video_format='avi').validate()


# --- W&B tracking (offline) -----------------------------------------------------------


def _offline_runs(root):
  return sorted(glob.glob(os.path.join(root, 'wandb', 'offline-run-*', 'run-*.wandb')))


def _read_offline_run(path):
  """The run id, config and history rows of an offline W&B run file."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  from wandb.sdk.internal import datastore  # pylint: disable=g-import-not-at-top
  store = datastore.DataStore()
  store.open_for_scan(path)
  run_id, config, rows = None, {}, []
  while True:
    data = store.scan_data()
    if data is None:
      break
    record = wandb_internal_pb2.Record()
    record.ParseFromString(data)
    kind = record.WhichOneof('record_type')
    if kind == 'run':
      run_id = record.run.run_id
      config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    elif kind == 'config':
      config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    elif kind == 'history':
      rows.append({i.key or '/'.join(i.nested_key): json.loads(i.value_json)
                   for i in record.history.item})
  return run_id, config, rows


def _value(entry):
  return entry.get('value', entry) if isinstance(entry, dict) else entry


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WANDB, reason=NO_WANDB)
def test_track_offline_run_holds_metrics_evals_config_and_videos(ux_run):
  root, _ = ux_run
  runs = _offline_runs(root)
  assert len(runs) == 1, os.listdir(os.path.join(root, 'wandb'))
  run_id, config, rows = _read_offline_run(runs[0])
  with open(os.path.join(root, 'wandb', 'run_id')) as f:
    assert f.read().strip() == run_id
  with open(os.path.join(root, 'metrics.csv')) as f:
    metrics_rows = len(f.readlines()) - 1
  train = [r for r in rows if 'train/loss' in r]
  assert len(train) == metrics_rows and all('env_steps' in r for r in train)
  assert [r['env_steps'] for r in train] == sorted(r['env_steps'] for r in train)
  assert len([r for r in rows if 'eval/avg_return' in r]) == 2
  assert len([r for r in rows if 'video/path' in r]) == 2
  assert 'make_agent.learning_rate' in _value(config['gin'])
  assert _value(config['num_env_steps']) == 3000


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WANDB, reason=NO_WANDB)
def test_track_resumed_run_keeps_its_run_id(ux_run, tmp_path):
  source, _ = ux_run
  root = str(tmp_path / 'resumed')
  shutil.copytree(source, root)
  with open(os.path.join(root, 'wandb', 'run_id')) as f:
    run_id = f.read().strip()
  bindings = [b for b in RUN_BINDINGS if 'num_env_steps' not in b]
  result = harness_train(root, bindings + ['train_eval.num_env_steps=3600'],
                         extra_flags=['--track'], env=_offline_env(tmp_path))
  assert result.returncode == 0, tail(result)
  assert f'Tracking on W&B: run {run_id} (continued)' in result.stdout
  runs = _offline_runs(root)
  assert len(runs) == 2
  resumed_id, _, rows = _read_offline_run(runs[-1])
  assert resumed_id == run_id
  assert max(r['env_steps'] for r in rows if 'train/loss' in r) >= 3600


@pytest.mark.slow
def test_track_without_the_extra_is_one_line_exit_2(tmp_path):
  fake = tmp_path / 'no_wandb' / 'wandb'
  fake.mkdir(parents=True)
  (fake / '__init__.py').write_text("raise ImportError('No module named wandb')\n")
  env = dict(os.environ, PYTHONPATH=str(fake.parent))
  result = harness_train(None, ['train_eval.num_env_steps=100'],
                         extra_flags=['--check_only', '--track'], env=env)
  assert result.returncode == 2, tail(result)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert "pip install -e '.[wandb]'" in lines[0] and lines[0].startswith('harness-train: error:')


def test_sweep_passes_track_on_with_one_group():
  from harness.sweeps import trial as sweep_trial  # pylint: disable=g-import-not-at-top
  child = sweep_trial.ChildSpec('t0', '/s/trials/t0', '/s/logs/t0.log', ['f.gin'], ['a.b=1'],
                                track_group='sweep_lr')
  assert child.command()[-1] == '--track'
  assert child.environment()['WANDB_RUN_GROUP'] == 'sweep_lr'
  plain = dataclasses.replace(child, track_group=None)
  assert '--track' not in plain.command() and plain.environment() is None


# --- --help -----------------------------------------------------------------------------

HELP = {
    'train': ['--root_dir', '--gin_file', '--gin_bindings', '--job', '--track', '--check_only'],
    'sweep': ['--root_dir', '--gin_file', '--sweep', '--seeds', '--search', '--track'],
    'plot': ['--out', '--title'],
    'evaluate': ['--policy_dir', '--episodes', '--video', '--env_id'],
    'launch': ['--root_dir', '--gin_file', '--num_collectors', '--eval_job', '--ray_address'],
}
FOREIGN_FLAGS = ['--logtostderr', '--alsologtostderr', '--log_dir', '--only_check_args',
                 '--pdb_post_mortem', '--run_with_profiling', '--test_srcdir']


@pytest.mark.slow
def test_help_of_each_command_lists_its_own_flags():
  processes = {module: subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, '-m', f'harness.{module}', '--help'], cwd=REPO, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for module in HELP}
  for module, process in processes.items():
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (module, err[-2000:])
    for flag in HELP[module]:
      assert re.search(rf'^  {re.escape(flag)}\b|^  --\[no\]{flag[2:]}\b', out, re.M), (
          module, flag, out)
    for flag in FOREIGN_FLAGS:
      assert flag not in out, (module, flag)
    assert '\nexample:\n  harness-' in out, out
    flag_lines = out.split('flags:\n', 1)[1].split('\n\n', 1)[0].splitlines()
    assert all(len(line) <= 160 for line in flag_lines), out
