# Served, one server after the other: each model of $1 (Locust 1, 8, 32 users, 20 s a step)
export PYTHONPATH=.
mkdir -p $OUT/s
timeout 570 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$1"
for m in $1; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png
cd $OUT && tar czf s.tgz s && rm -rf s
