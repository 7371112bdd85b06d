#!/usr/bin/env bash
# Build the offline wheel bundle a lent GPU machine needs to run the measured probes and
# benchmarks/gpu_validate.sh (the launches too: transformers >= 5.23, liger-kernel, peft). That machine has CPython 3.12 (x86_64, Linux), torch and a few
# other packages (BOX_HAS below), and no package registry: everything else travels as wheels.
#
#   bash benchmarks/gpu_bundle.sh [OUTDIR=gpu-bundle] [--check-only]
#
# Run from the repository root, on this machine (it needs the registry, and `wheel` and
# `packaging` in $PY's environment; PY defaults to .venv/bin/python). --check-only skips the
# download and only runs the checks (steps 3-5) on an existing OUTDIR.
# Then carry OUTDIR to the device (it is git-ignored) and run benchmarks/gpu_validate.sh there.
#
# Steps: 1. download exact pins   2. slim bitsandbytes   3. completeness of dependencies
#        4. offline install on 3.12, one version per distribution   5. size limit
set -euo pipefail
OUT=${1:-gpu-bundle}
MODE=${2:-}
PY=${PY:-.venv/bin/python}
LIMIT_MIB=60   # the device carry limit is 64 MiB, and the repo's own ignored files travel too

# The target interpreter: wheels must fit CPython 3.12 on x86_64 manylinux, whatever $PY is.
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

# Exact pins: without them --only-binary silently picks ANCIENT wheels (deepspeed 0.3.1.dev5,
# bitsandbytes 0.42.0). --no-deps: every dependency is listed here on purpose; step 3 checks
# that nothing is missing.
PKGS=(
  # transformers >= 5.23: the emitted training_args.json uses `activation_checkpointing` (the box
  # has 5.17); it needs regex >= 2025.10.22 (the box's regex version is unknown); peft: adapters;
  # liger-kernel: the chunked loss
  transformers==5.24.0 regex==2026.11.19 peft==0.21.2 liger-kernel==0.8.5
  # quantization and optimizer kernels
  bitsandbytes==0.50.2 torchao==0.18.0
  # optuna and its dependencies
  optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 colorlog==6.12.0 mako==1.4.3
  # pydantic (the planner's models; deepspeed needs it too)
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  # deepspeed's dependencies (deepspeed itself is built below)
  hjson==3.1.0 ninja==1.13.2 py-cpuinfo==9.0.0 msgpack==1.2.4 einops==0.8.2 psutil==7.2.2
  # the planner's own CLI dependencies and the measured extra's
  typer==0.20.0 click==8.3.1 shellingham==1.5.4 rich==14.2.0 markdown-it-py==4.0.0 mdurl==0.1.2
  pygments==2.19.2 pyyaml==6.0.3 adam-mini==1.1.1 nvidia-ml-py==13.580.82
  # TRL's trainers for the DPO and GRPO launches, and datasets with its own dependencies
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
DEEPSPEED=deepspeed==0.19.8

# What the box already has: source /work/.library/device/KINDS.md, "Python packages already there"
# (read on a machine running the 'cuda' image on 2026-11-17), versions from its pip list where known.
# A requirement met here need not travel. transformers is listed at the box's 5.17.0, but the bundle
# carries 5.24.0, and a bundled wheel always takes precedence in the checks.
BOX_HAS=(
  accelerate==1.15.0 huggingface-hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0 numpy==2.5.2
  triton==3.6.0 torch==2.11.0 transformers==5.17.0
  typer rich pyyaml tqdm packaging filelock psutil jinja2 markupsafe sympy networkx fsspec requests
  nvidia-ml-py click pygments markdown-it-py mdurl shellingham typing-extensions regex
  pyarrow pandas xxhash
)
# Never carry these: they are on the box, and a second copy would shadow the box's own build.
NEVER_CARRY=(torch triton accelerate numpy tokenizers safetensors huggingface-hub)

if [ "$MODE" != "--check-only" ]; then
  # Start from an empty bundle, so that no stale wheel (another version) survives.
  mkdir -p "$OUT"
  rm -f "$OUT"/*.whl

  # 1. Download the pinned wheels for the target interpreter.
  echo "== 1. downloading ${#PKGS[@]} pinned wheels into $OUT"
  $PY -m pip download -qq --no-deps "${TARGET[@]}" -d "$OUT" "${PKGS[@]}"
  # deepspeed has no modern wheel on PyPI (only 0.3.1.devN): build the pure-python wheel from the
  # sdist. DS_BUILD_OPS=0 (and torch being invisible in pip's isolated build env) means no ops are
  # precompiled; they JIT on first use on the box.
  echo "== 1. building $DEEPSPEED (pure python, DS_BUILD_OPS=0)"
  DS_BUILD_OPS=0 $PY -m pip wheel -qq --no-deps --no-cache-dir "$DEEPSPEED" -w "$OUT"
  # this project, as users install it: gpu_validate.sh imports planner from the installed wheel
  # (planner.strategies and planner.probes inside it), not from the carried source tree
  echo "== 1. building this project's wheel (llm-train-planner)"
  $PY -m pip wheel -qq --no-deps --no-cache-dir . -w "$OUT"

  # 2. Slim bitsandbytes: keep only the cpu and CUDA 13.x kernels (the box has torch cu130);
  # the other CUDA versions' libraries are most of the wheel's size.
  echo "== 2. slimming bitsandbytes to cpu + cuda130/cuda132 kernels"
  T=$(mktemp -d)
  $PY -m wheel unpack -d "$T" "$OUT"/bitsandbytes-0.50.2-*.whl >/dev/null
  find "$T"/bitsandbytes-0.50.2/bitsandbytes -name 'libbitsandbytes_*.so' \
    ! -name '*_cpu.so' ! -name '*_cuda130.so' ! -name '*_cuda132.so' -delete
  rm "$OUT"/bitsandbytes-0.50.2-*.whl
  $PY -m wheel pack -d "$OUT" "$T"/bitsandbytes-0.50.2 >/dev/null   # `wheel pack` rewrites RECORD
  rm -rf "$T"
fi

# 3. Completeness: every Requires-Dist of every wheel (markers evaluated for CPython 3.12 on
# Linux x86_64, extras skipped) is met by the bundle (version checked) or by BOX_HAS (version
# checked where known). Also: nothing from NEVER_CARRY, and one wheel per distribution.
echo "== 3. checking dependencies of the wheels in $OUT"
BOX_HAS="${BOX_HAS[*]}" NEVER_CARRY="${NEVER_CARRY[*]}" $PY - "$OUT" <<'EOF'
import glob, os, sys, zipfile
from collections import defaultdict
from email.parser import Parser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

out = sys.argv[1]
# The box's interpreter, for environment markers; extra="" makes every `extra == "..."` false.
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
       "implementation_version": "3.12.3", "platform_python_implementation": "CPython",
       "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "platform_release": "", "platform_version": "", "extra": ""}

box = {}   # name -> Version, or None where the version is unknown
for item in os.environ["BOX_HAS"].split():
    name, _, ver = item.partition("==")
    box[canonicalize_name(name)] = Version(ver) if ver else None
never = {canonicalize_name(n) for n in os.environ["NEVER_CARRY"].split()}

wheels = sorted(glob.glob(os.path.join(out, "*.whl")))
if not wheels:
    sys.exit(f"FAIL: no wheels in {out}")
bundle = defaultdict(list)   # name -> [(Version, wheel file, metadata)]
for path in wheels:
    with zipfile.ZipFile(path) as z:
        meta_name = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(meta_name) != 1:
            sys.exit(f"FAIL: {os.path.basename(path)} has no single .dist-info/METADATA")
        meta = Parser().parsestr(z.read(meta_name[0]).decode("utf-8"))
    bundle[canonicalize_name(meta["Name"])].append((Version(meta["Version"]), os.path.basename(path), meta))

errors = []
for name, entries in sorted(bundle.items()):
    if len(entries) > 1:   # two versions (or builds) of one package break the install on the box
        errors.append(f"{name}: {len(entries)} wheels in the bundle: " + ", ".join(w for _, w, _ in entries))
    if name in never:
        errors.append(f"{name}: must not be carried (the box has it; a second copy would shadow it): "
                      + ", ".join(w for _, w, _ in entries))

checked = 0
for name, entries in sorted(bundle.items()):
    for _, whl, meta in entries:
        for line in meta.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(ENV):
                continue   # an extra, or not for Python 3.12 on Linux
            checked += 1
            dep = canonicalize_name(req.name)
            if dep in bundle:
                have, where = bundle[dep][0][0], f"bundled {bundle[dep][0][1]}"
            elif dep in box:
                have, where = box[dep], "on the box"
            else:
                errors.append(f"missing: {whl} requires '{line}', which is neither in the bundle "
                              f"nor on the box (BOX_HAS)")
                continue
            if have is not None and not req.specifier.contains(have, prereleases=True):
                errors.append(f"version: {whl} requires '{line}', but {dep} {have} is {where}")

if errors:
    print("\n".join("FAIL " + e for e in errors), file=sys.stderr)
    sys.exit(f"FAIL: {len(errors)} problem(s) in {out}")
print(f"ok: {len(bundle)} distributions, one wheel each; {checked} requirements met "
      f"(bundle or BOX_HAS), none of: {' '.join(sorted(never))}")
EOF

# 4. The bundle installs offline for CPython 3.12 on manylinux x86_64 (tags, Requires-Python,
# wheel integrity), with no index and no dependency fetching, as on the box.
echo "== 4. offline install check (CPython 3.12, manylinux x86_64)"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
$PY -m pip install -qq --no-index --no-deps "${TARGET[@]}" --target "$T" "$OUT"/*.whl
echo "ok: $(ls "$OUT"/*.whl | wc -l) wheels install into a 3.12 target"

# 5. Size: the bundle must fit the carry limit with room for the repo's other ignored files.
BYTES=$(du -sb "$OUT" | cut -f1)
FILES=$(find "$OUT" -type f | wc -l)
MIB=$(awk "BEGIN { printf \"%.1f\", $BYTES / 1048576 }")
echo "== 5. $OUT: $MIB MiB ($BYTES bytes), $FILES files (limit $LIMIT_MIB MiB)"
if [ "$BYTES" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "FAIL: $OUT is $MIB MiB, over the $LIMIT_MIB MiB limit" >&2
  exit 1
fi
echo "ok: bundle complete"
