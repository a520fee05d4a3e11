#!/usr/bin/env bash
# `mpirun -np P qkv train …` as a user types it (on loopback: shared memory and self):
#   equal    data-parallel training's final loss is one process's on the same batches, and
#            a second run with the same P writes the same checkpoint bytes
#   resume   a checkpoint written by 3 ranks with ZeRO-1 resumes on 2 (and 1) and ends where
#            one process training straight through ends
#   memory   a sequence that does not fit one process's memory limit (ulimit -d) trains
#            context-parallel on 2 ranks under the same limit per rank
#   kill     a rank killed mid-run ends the job within seconds; the last checkpoint is
#            intact and resumes on another number of ranks
#   raise    a rank that raises ends the job with its error, not a hang
# Usage: dist_cli_test.sh QKV MPIEXEC CASE
set -euo pipefail
qkv=$1
mpiexec=$2
case_name=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=("$mpiexec" --oversubscribe --mca btl self,vader)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

fail() { echo "FAIL: $*" >&2; exit 1; }
# A field of the JSON summary line (the last line of a file).
field() { tail -n 1 "$1" | python3 -c "import json, sys; print(json.load(sys.stdin)['$2'])"; }
# The step a checkpoint was saved at (its safetensors metadata).
saved_step() {
  python3 - "$1" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))["__metadata__"]["step"])
EOF
}
close() {  # |a - b| <= 1e-5 |b|
  python3 -c "import sys; a, b = float('$1'), float('$2'); sys.exit(abs(a - b) > 1e-5 * abs(b))" ||
    fail "$3: $1 and $2 differ by more than 1e-5 relative"
}

train=(train --steps 40 --batch 12 --eval-every 20 --json --quiet)
case $case_name in
equal)
  "$qkv" "${train[@]}" --checkpoint one.safetensors > one.json
  for np in 2 3 4; do
    "${mpirun[@]}" -np $np "$qkv" "${train[@]}" --checkpoint p$np.safetensors > p$np.json
    close "$(field p$np.json final_loss)" "$(field one.json final_loss)" "final loss, $np ranks"
    close "$(field p$np.json final_eval_loss)" "$(field one.json final_eval_loss)" "eval loss, $np ranks"
    [[ $(field p$np.json ranks) == "$np" ]] || fail "the summary does not say $np ranks"
  done
  "${mpirun[@]}" -np 3 "$qkv" "${train[@]}" --checkpoint again.safetensors > again.json
  cmp p3.safetensors again.safetensors || fail "two runs on 3 ranks wrote different checkpoints"
  ;;
resume)
  "$qkv" "${train[@]}" --checkpoint straight.safetensors > straight.json
  "${mpirun[@]}" -np 3 "$qkv" train --steps 20 --batch 12 --eval-every 20 --json --quiet --zero1 \
    --checkpoint part.safetensors > part.json
  [[ $(saved_step part.safetensors) == 20 ]] || fail "the ZeRO-1 checkpoint is not at step 20"
  cp part.safetensors part1.safetensors
  "${mpirun[@]}" -np 2 "$qkv" "${train[@]}" --resume part.safetensors --checkpoint part.safetensors > resumed.json
  close "$(field resumed.json final_loss)" "$(field straight.json final_loss)" "resumed on 2 ranks"
  "$qkv" "${train[@]}" --resume part1.safetensors --checkpoint part1.safetensors > resumed1.json
  close "$(field resumed1.json final_loss)" "$(field straight.json final_loss)" "resumed in one process"
  ;;
memory)
  # 4 sequences of 8192 bytes: one process needs about 1.5 GB of private memory (its
  # evaluation batch alone is 65,536 positions), each of 2 context-parallel ranks about 1 GB.
  long=(train --text "$dir/text.txt" --seq 8192 --batch 4 --steps 2 --eval-every 0 --d-model 64
        --layers 2 --threads 1 --json --quiet)
  python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefgh \n') for _ in range(400000)))" > text.txt
  limit_kb=1200000
  if (ulimit -d $limit_kb; "$qkv" "${long[@]}" --checkpoint one.safetensors > one.json 2> one.err); then
    fail "one process trained within the ${limit_kb} kB limit: the test proves nothing"
  fi
  grep -q "cannot allocate" one.err || { cat one.err; fail "one process: no allocation error"; }
  "${mpirun[@]}" -np 2 bash -c "ulimit -d $limit_kb; exec \"$qkv\" ${long[*]} --context-parallel \
    --checkpoint cp.safetensors" > cp.json || fail "2 context-parallel ranks failed within the limit"
  [[ $(field cp.json steps) == 2 ]] || fail "the context-parallel run did not finish"
  ;;
kill)
  "${mpirun[@]}" -np 2 "$qkv" train --steps 1000000 --batch 12 --eval-every 0 --save-every 10 \
    --quiet --checkpoint k.safetensors > kill.out 2>&1 &
  job=$!
  for _ in $(seq 300); do [[ -f k.safetensors ]] && break; sleep 0.1; done
  [[ -f k.safetensors ]] || fail "no checkpoint after 30 s"
  sleep 0.5
  # A rank: a qkv process whose command line names this checkpoint (not mpirun).
  victim=""
  for pid in $(pgrep -f -- "--checkpoint k.safetensors"); do
    [[ $(ps -o comm= -p "$pid") == qkv ]] && victim=$pid
  done
  [[ -n $victim ]] || fail "no rank found"
  kill -9 "$victim"
  start=$(date +%s.%N)
  for _ in $(seq 200); do kill -0 $job 2>/dev/null || break; sleep 0.05; done
  kill -0 $job 2>/dev/null && { kill -9 $job; fail "the job still runs 10 s after a rank was killed"; }
  status=0
  wait $job || status=$?
  echo "job ended $(python3 -c "print(round($(date +%s.%N) - $start, 2))") s after the kill, status $status"
  [[ $status != 0 ]] || fail "the job exited 0 after losing a rank"
  grep -q "signal 9\|killed" kill.out || { cat kill.out; fail "mpirun did not say a rank was killed"; }
  # The last checkpoint is whole (saved atomically) and resumes, on 3 ranks.
  step=$(saved_step k.safetensors)
  echo "checkpoint at step $step"
  "${mpirun[@]}" -np 3 "$qkv" train --steps $((step + 5)) --batch 12 --eval-every 0 --json --quiet \
    --resume k.safetensors --checkpoint k.safetensors > resumed.json
  [[ $(field resumed.json steps) == $((step + 5)) ]] || fail "the resumed run did not reach step $((step + 5))"
  ;;
raise)
  echo "some text to train on, long enough for a few windows of sixteen bytes" > text.txt
  status=0
  timeout 60 "${mpirun[@]}" -np 1 "$qkv" train --text text.txt --seq 16 --steps 100000 --quiet \
    --checkpoint r.safetensors : -np 1 "$qkv" train --text missing.txt --seq 16 --steps 100000 \
    --quiet --checkpoint r.safetensors > raise.out 2>&1 || status=$?
  [[ $status != 0 && $status != 124 ]] || { cat raise.out; fail "status $status (124: it hung)"; }
  grep -q "qkv: rank 1: error: .*missing.txt" raise.out || { cat raise.out; fail "no error naming the file"; }
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
