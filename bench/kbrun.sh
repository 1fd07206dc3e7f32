#!/usr/bin/env bash
# The H200's KernelBench run (issue #15): the offline proposer (TorchInductor's start, then the
# tuner) on the 32 lowest-numbered level-1 and the 11 lowest-numbered level-2 problems in
# bench/kernelbench/problems, at their default sizes, two attempts each, one lane. The problems
# are listed in KernelBench's order with the levels interleaved, so a run cut by its time limit has
# covered both. The run needs more than one call's limit: a later call carries the first call's
# archive back as .kbrun/kbrun.db (an ignored path) and this resumes it.
# Usage: bash bench/kbrun.sh DB SECONDS   (DB: the archive written; the run is stopped (SIGTERM: it
# abandons the verdict in flight and records what it has) SECONDS after its start, then its
# KernelBench report is written beside DB as JSON)
set -u
DB=$1
LIMIT=$2
P=bench/kernelbench/problems
# every thread's stack every two minutes into STACKS.txt beside DB: a run that makes no verdict says where it waits
STACKS="${DB%.db}.stacks.txt"
kf() { timeout -s TERM "$LIMIT" python3 -c "import faulthandler, sys; faulthandler.dump_traceback_later(120, repeat=True, file=open(sys.argv.pop(1), 'w')); from kernforge.cli import main; main()" "$STACKS" "$@"; }
# a carried archive judged on another kind of GPU is not resumed (one run, one GPU): this one starts afresh
if [ -f .kbrun/kbrun.db ]; then
  HERE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  THERE=$(python3 -c "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(\"SELECT gpu FROM attempts WHERE gpu != 'cpu' LIMIT 1\").fetchone()[0])" .kbrun/kbrun.db 2>/dev/null)
  if [ -n "$HERE" ] && [ -n "$THERE" ] && [ "$HERE" != "$THERE" ]; then
    echo "kbrun: the carried archive was judged on $THERE, this GPU is $HERE: a fresh run"
    mv .kbrun/kbrun.db .kbrun/kbrun.other-gpu.db
  fi
fi
if [ -f .kbrun/kbrun.db ]; then
  cp .kbrun/kbrun.db "$DB"
  kf bench kernelbench --resume 1 --db "$DB"
else
  L1=$(ls $P/level1 | grep -v '\.meta\.py$' | sort -n | head -32 | sed "s|^|$P/level1/|")
  L2=$(ls $P/level2 | grep -v '\.meta\.py$' | sort -n | head -11 | sed "s|^|$P/level2/|")
  # one level-2 problem after every three of level 1
  ORDER=$(paste -d'\n' <(echo "$L1" | paste -d' ' - - -) <(echo "$L2") | tr ' ' '\n' | grep -v '^$')
  kf bench kernelbench --offline --max-attempts 2 --lanes 1 --db "$DB" $ORDER
fi
python3 -c "from kernforge.cli import main; main()" bench report 1 --db "$DB" --json > "${DB%.db}.json"
# one file to bring back: the archive out of WAL mode (its -wal and -shm folded in)
python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()" "$DB"
