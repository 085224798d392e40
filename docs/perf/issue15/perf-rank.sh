set -e
PY=${PY:-$PWD/target/python-venv/bin/python}  # the demo runs CMD in the repository root
port=29510
for round in ${ROUNDS:-1 2 3 4 5}; do
  for n in 1 262144 16777216; do
    port=$((port+1))
    it=50; [ $n = 16777216 ] && it=8
    inccl-allreduce $WORLD_SIZE $MASTER_ADDR:$port $RANK $n --iters $it --warmup 2 | grep -E '^ +[0-9]' | sed "s/^/# rust round $round /"
  done
  port=$((port+1))
  INCCL_MASTER_PORT=$port $PY python/examples/bench_allreduce.py 1 262144 --iters 50 --warmup 2 | sed "s/^/# round $round /"
  port=$((port+1))
  INCCL_MASTER_PORT=$port $PY python/examples/bench_allreduce.py 16777216 --iters 8 --warmup 2 | sed "s/^/# round $round /"
done
