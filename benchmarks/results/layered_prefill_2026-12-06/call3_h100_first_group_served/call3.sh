export PYTHONPATH=.
timeout 200 python .probe/first_group.py fp16:layered8 > $OUT/first_group.txt 2>&1; echo rc=$?
grep -v "^ \|^-\|^$" $OUT/first_group.txt | grep "ms first" | head -40
grep -A30 "group profile" $OUT/first_group.txt | cut -c1-200 | head -80
source .device/setup.sh
mkdir -p $OUT/s
timeout 380 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "qwen3_30b_layered8 qwen3_30b"
ls $OUT/s $OUT/s/*
cd $OUT && tar czf s.tgz s && rm -rf s
