#!/usr/bin/env bash
# Record sample_traces/nsys/rank{0,1}.nsys-rep: gloo_steps.py on 2 CPU ranks, one Nsight Systems report per rank.
#
# Needs: torch (CPU build is enough), the `nvtx` package 0.2.11 (pip install nvtx==0.2.11; nsys 2022.4 drops the
# ranges of newer releases), and nsys on PATH. Nsight Systems 2022.4 from Debian's non-free component works without
# a GPU, unpacked without its libcuda dependency:
#   apt-get download nsight-systems nsight-systems-target
#   dpkg -x nsight-systems-target_*.deb /opt/nsys && dpkg -x nsight-systems_2022*.deb /opt/nsys
#   export PATH=/opt/nsys/usr/lib/nsight-systems/bin:$PATH
# (libssh-4 from apt, linked as /opt/nsys/usr/lib/x86_64-linux-gnu/libssh.so.4, lets QdstrmImporter run.)
# Only exporting a report (what the tests do) needs just nsight-systems-target: nsys is
# /opt/nsys/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys.
# torchrun starts nsys once per rank (--no-python). Newer nsys records each rank's RANK in META_DATA_CAPTURE;
# 2022.4 exports have no such table, so traceana takes the ranks from the file names rank0 / rank1.
set -euo pipefail
cd "$(dirname "$0")"
rm -f rank*.nsys-rep rank*.qdstrm
OMP_NUM_THREADS=1 torchrun --nproc-per-node=2 --master-port="${MASTER_PORT:-29531}" --no-python \
    nsys profile --trace=nvtx --sample=none --cpuctxsw=none --force-overwrite=true \
    --output='rank%q{RANK}' python gloo_steps.py
# nsys 2022.4 may fail to find its own importer and leave .qdstrm files: convert them by hand.
importer="${QDSTRM_IMPORTER:-}"
for guess in "$(dirname "$(command -v nsys)")/../host-linux-x64/QdstrmImporter" \
             /usr/lib/nsight-systems/host-linux-x64/QdstrmImporter; do
    [ -n "$importer" ] || { [ -x "$guess" ] && importer="$guess"; } || true
done
for q in rank*.qdstrm; do
    [ -e "$q" ] || continue
    "$importer" -i "$q"
    rm -f "$q"
done
ls -l rank*.nsys-rep
