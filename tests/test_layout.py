"""The package layout: the floors as folders, their import contract, no import circle."""

import ast
import os
import shutil
import subprocess
import sys

import grimp

from tests.cli import REPO, harness_train

HARNESS = os.path.join(REPO, 'harness')
COMMANDS = {'__init__.py', 'train.py', 'sweep.py', 'launch.py', 'plot.py', 'evaluate.py'}
SUBPACKAGES = ('base', 'rl', 'rl/agents', 'rundir', 'run', 'sweeps', 'distributed')


def _lint_imports(cwd: str, env=None) -> subprocess.CompletedProcess:
  program = os.path.join(os.path.dirname(sys.executable), 'lint-imports')
  return subprocess.run([program, '--no-cache'], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=120)


def test_the_top_level_holds_the_commands_and_every_module_sits_in_a_documented_subpackage():
  top = {name for name in os.listdir(HARNESS) if name.endswith('.py')}
  assert top == COMMANDS
  for folder, dirs, files in os.walk(HARNESS):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    if folder == HARNESS or not any(f.endswith('.py') for f in files):
      continue
    init = os.path.join(folder, '__init__.py')
    assert os.path.isfile(init), f'{folder} has modules but no __init__.py'
    with open(init) as f:
      docstring = ast.get_docstring(ast.parse(f.read()))
    lines = [line for line in (docstring or '').splitlines() if line.strip()]
    assert 2 <= len(lines) <= 4, (
        f'{init}: a docstring of two to four lines says what lives here and what it imports')
  for package in SUBPACKAGES:
    assert os.path.isfile(os.path.join(HARNESS, package, '__init__.py')), package


def test_the_import_contract_holds():
  result = _lint_imports(REPO)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  assert 'Contracts: 3 kept, 0 broken.' in result.stdout


def test_the_import_contract_fails_on_an_rl_part_that_imports_the_run_loop(tmp_path):
  # A copy of the package with one forbidden arrow: lint-imports must name it.
  shutil.copytree(HARNESS, tmp_path / 'harness',
                  ignore=shutil.ignore_patterns('__pycache__'))
  shutil.copy(os.path.join(REPO, 'setup.cfg'), tmp_path / 'setup.cfg')
  with open(tmp_path / 'harness' / 'rl' / 'collect.py', 'a') as f:
    f.write('\nfrom harness.run import loop  # forbidden: a component imports the loop\n')
  env = dict(os.environ, PYTHONPATH=str(tmp_path))
  result = _lint_imports(str(tmp_path), env)
  assert result.returncode != 0, result.stdout[-3000:]
  assert 'harness.rl is not allowed to import harness.run' in result.stdout
  assert 'harness.rl.collect -> harness.run.loop' in result.stdout


def test_no_module_under_harness_is_in_an_import_circle():
  graph = grimp.build_graph('harness')
  modules = sorted(graph.modules)
  state, circles = {}, []

  def visit(module, path):
    state[module] = 'open'
    for imported in sorted(graph.find_modules_directly_imported_by(module)):
      if state.get(imported) == 'open':
        circles.append(' -> '.join(path[path.index(imported):] + [imported]))
      elif imported not in state:
        visit(imported, path + [imported])
    state[module] = 'done'

  for module in modules:
    if module not in state:
      visit(module, [module])
  assert not circles, circles[:5]


def test_a_gin_file_with_an_old_module_path_gets_the_new_one_in_one_line(tmp_path):
  old = tmp_path / 'old_layout.gin'
  old.write_text("import harness.atari\nmake_env.env_id = 'CartPole-v1'\n")
  result = harness_train(None, gin_files=[str(old)], extra_flags=['--check_only'])
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert 'harness.atari has moved to harness.rl.atari' in lines[0]
  assert '`import harness.rl.atari`' in lines[0]
