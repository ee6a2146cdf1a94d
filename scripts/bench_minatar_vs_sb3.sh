#!/usr/bin/env bash
# The harness and SB3 alternating on one MinAtar game, same frames and cadence (one
# gradient step per 4 frames), PAIRS pairs; prints each side's results line: env steps/s
# over the whole wall time (the harness's includes its Reverb server, first trace and
# final checkpoint with policy exports; SB3's only model.learn) and over the learning phase
# (from the first step after the 5,000 random frames to the last, the same on both sides),
# then each side's medians and the ratios. Run it alone: SB3's two torch threads slowed to
# about 20 frames/s beside a two-trial sweep on two cores.
#   SB3_PYTHON=/tmp/sb3/bin/python bash scripts/bench_minatar_vs_sb3.sh [GAME] [FRAMES] [PAIRS]
# SB3_PYTHON: a venv with torch, stable-baselines3 and minatar (scripts/sb3_minatar.py).
# VARIANTS (optional): harness settings that each take a turn in every pair, separated
# by spaces, each 'shipped' (the file as it is) or LABEL=BINDINGS (gin bindings separated
# by ';'), e.g.
#   VARIANTS="shipped bf16=make_agent.compute_dtype='bfloat16';configure_allocator.tf_cpu_pool=True"
set -euo pipefail
cd "$(dirname "$0")/.."
GAME=${1:-Breakout}; FRAMES=${2:-100000}; PAIRS=${3:-2}
SB3_PYTHON=${SB3_PYTHON:?set SB3_PYTHON to the python of a venv with stable-baselines3}
ROOT=$(mktemp -d)
VARIANTS=${VARIANTS:-shipped}
for pair in $(seq "$PAIRS"); do
  {
  for variant in $VARIANTS; do
    label=harness; extra=()
    if [ "$variant" != shipped ]; then
      label="harness[${variant%%=*}]"
      IFS=';' read -ra bindings <<< "${variant#*=}"
      for binding in "${bindings[@]}"; do extra+=(--gin_bindings="$binding"); done
    fi
    rm -rf "$ROOT/run"
    python -m harness.train --root_dir="$ROOT/run" --gin_file=gin/ddqn_minatar.gin \
      --gin_bindings="make_env.env_id='MinAtar/$GAME-v0'" \
      --gin_bindings=train_eval.num_env_steps="$FRAMES" \
      --gin_bindings=train_eval.eval_interval=100000000 \
      --gin_bindings=train_eval.checkpoint_interval=100000000 \
      --gin_bindings=train_eval.log_interval=5000 "${extra[@]}" > "$ROOT/harness.log" 2>&1
    python - "$ROOT/run" "$label pair $pair" <<'PY'
import csv, json, os, sys
r = json.load(open(os.path.join(sys.argv[1], 'results.json')))
# The learning phase, as SB3's side measures it: from the first metrics row after the
# 5,000 random frames to the last row (the final checkpoint and exports come after it).
rows = [row for row in csv.DictReader(open(os.path.join(sys.argv[1], 'metrics.csv')))
        if int(row['env_steps']) >= 5000]
first, last = rows[0], rows[-1]
rate = ((int(last['env_steps']) - int(first['env_steps']))
        / (float(last['wall_time']) - float(first['wall_time'])))
print(sys.argv[2], json.dumps({k: r[k] for k in (
    'wall_seconds', 'env_steps', 'train_step', 'train_return_last100', 'final_return')}
    | {'env_steps_per_sec': round(r['env_steps'] / r['wall_seconds'], 1),
       'learning_phase_env_steps_per_sec': round(rate, 1)}))
PY
  done
  echo "sb3 pair $pair $("$SB3_PYTHON" scripts/sb3_minatar.py --game="$GAME" --frames="$FRAMES" 2>/dev/null | tail -1)"
  } | tee -a "$ROOT/lines"
done
# Each side's medians and each harness setting's ratios to SB3: of the medians, and the
# median of the pair ratios (SB3's own rate swings between pairs, so both are printed).
python - "$ROOT/lines" <<'PY'
import collections, json, statistics, sys
rates = collections.defaultdict(dict)  # label -> pair -> (learning phase, whole wall)
for line in open(sys.argv[1]):
  label, _, pair, payload = line.split(' ', 3)
  r = json.loads(payload)
  rates[label][pair] = (r['learning_phase_env_steps_per_sec'], r['env_steps_per_sec'])
sb3 = rates.pop('sb3')
for label, by_pair in rates.items():
  for index, name in enumerate(('learning phase', 'whole wall')):
    ours = statistics.median(v[index] for v in by_pair.values())
    theirs = statistics.median(v[index] for v in sb3.values())
    pair_ratios = [v[index] / sb3[p][index] for p, v in by_pair.items()]
    print(f'{label} / sb3, {name}: {ours:.0f} / {theirs:.0f} frames/s = {ours / theirs:.2f}x '
          f'of the medians; pair ratios {", ".join(f"{x:.2f}" for x in pair_ratios)}, '
          f'median {statistics.median(pair_ratios):.2f}x (target >= 2x)')
PY
rm -rf "$ROOT"
