"""What the GPU machine has, what travels to it as wheels, and the one command that runs there.

The device (``python3`` 3.12 with torch 2.11.0+cu130 and the packages in ``DEVICE_PACKAGES``) has
none of orch's own requirements and no ultralytics. ``python -m bench.gpu_wheels`` (``make
gpu-wheels``; ``bench/gpu_smoke.py --fetch-wheels`` is the same) downloads ``CARRIED``, at the
versions installed here, for cp312 manylinux x86_64 into the ignored ``.whl/`` (one version of
each: two would stop the install there), checks that every requirement of every wheel is on the
device or carried (``NOT_CARRIED`` says what is left behind on purpose, and why) and that the
wheels and the working tree together stay under the 64 MiB a ``run`` call may carry. The dry run
of ``bench/gpu_smoke.py`` makes every other module unimportable in its children
(``device_site``), so a missing requirement shows here, before any device time is spent.

The ``run`` call: ``carry: [".whl"]``, ``timeout_s: 480``, command ``RUN_COMMAND``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 || exit; python3 bench/gpu_smoke.py --out $OUT
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEEL_DIR = ".whl"
SITE = "/tmp/site"
RUN_TIMEOUT_S = 480
"""The run call's timeout_s: the script's 420 s budget, the install, the stop of an overrunning step."""
CARRY_LIMIT = 64 << 20
"""What may travel to the device in one call: the working tree plus the carried paths."""
RUN_COMMAND = (
    f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target {SITE} "
    f"{WHEEL_DIR}/*.whl && export PYTHONPATH={SITE} PATH={SITE}/bin:$PATH PYTHONUNBUFFERED=1 || exit; "
    "python3 bench/gpu_smoke.py --out $OUT"
)
"""The one `run` command that installs the wheels and runs the GPU validation on the device."""

CARRIED = (
    "ultralytics",
    "ultralytics-thop",
    "paramiko",
    "invoke",
    "fabric",
    "decorator",
    "deprecated",
    "ClusterShell",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "ntplib",
    "py-spy",
    "cryptography",
    "cffi",
    "pycparser",
    "bcrypt",
    "pynacl",
)
"""Distributions carried as wheels: orch's and the trainer's requirements the device lacks, and
theirs (typing-extensions too: pydantic-core needs a newer one than the device may have)."""
NOT_CARRIED = {
    "polars": "ultralytics imports it only to copy results.csv into its checkpoints "
    "(BaseTrainer.read_results_csv) and for plots; its runtime wheel alone is 54 MB, past what a "
    "call may carry with the tree: the ultralytics side reads results.csv with the csv module instead "
    "(the same dict), plots are off",
    "polars-runtime-32": "polars' compiled runtime (see polars)",
    "opencv-python": "the device has opencv-python-headless: the same cv2 module",
    "ultralytics-platform": "imported lazily by ultralytics, only for its hosted-platform client",
}
"""Requirements deliberately left behind, and why."""
_DEVICE_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
DEVICE_PACKAGES = tuple(_DEVICE_IMAGE.split())
"""The Python distributions of the device's image ('cuda'), as the device's KINDS.md lists them
(read there on 2026-11-17)."""
DEVICE_MODULES = {"cv2": "opencv-python-headless"}
"""Modules the device has under another distribution's name than this machine's."""
OWN_DISTRIBUTIONS = ("orch",)
"""This repository, installed here in development mode; the device runs it from the working tree."""
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


def norm(name: str) -> str:
    """A distribution name in PEP 503 form (``Py_Spy`` -> ``py-spy``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def blocked_modules(packages: Mapping[str, Sequence[str]], allowed: Iterable[str]) -> set[str]:
    """Top-level modules installed here that no distribution the device has (or is carried) provides.

    ``packages``: importlib.metadata.packages_distributions() of this machine.
    """
    ok = {norm(a) for a in allowed}
    return {
        module
        for module, dists in packages.items()
        if module not in DEVICE_MODULES and not any(norm(d) in ok for d in dists)
    }


SITECUSTOMIZE = '''"""Written by bench/gpu_smoke.py --cpu-dry-run: these modules are not on the GPU machine."""
import importlib.abc
import sys

BLOCKED = frozenset({blocked!r})


class _NotOnTheDevice(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {{name!r}} (gpu_smoke --cpu-dry-run: the GPU machine does not have it "
                "and .whl does not carry it)", name=name)
        return None


sys.meta_path.insert(0, _NotOnTheDevice())
'''


def requirements(metadata: str, python: str = "3.12") -> list[str]:
    """The distributions a wheel's METADATA requires on the device (Linux x86-64, CPython
    ``python``): names of its ``Requires-Dist`` lines, extras' lines left out."""
    env = {
        "python_version": python,
        "python_full_version": python + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "platform_python_implementation": "CPython",
        "implementation_name": "cpython",
        "extra": "",
    }
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec, _, marker = line.split(":", 1)[1].partition(";")
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if not name or "extra" in marker:
            continue
        if marker.strip() and not marker_holds(marker, env):
            continue
        out.append(norm(name.group(1)))
    return out


def marker_holds(marker: str, env: Mapping[str, str]) -> bool:
    """A PEP 508 environment marker evaluated for the device (``packaging`` does it)."""
    import importlib

    try:
        markers = importlib.import_module("packaging.markers")
    except ImportError:  # pip vendors it
        markers = importlib.import_module("pip._vendor.packaging.markers")
    return bool(markers.Marker(marker.strip()).evaluate(dict(env)))


def closure_problems(wheels: Mapping[str, Sequence[str]]) -> list[str]:
    """Requirements of the carried wheels that the device will lack: ``{wheel: [required names]}``
    in, one line per missing name out."""
    have = {norm(n) for n in (*DEVICE_PACKAGES, *CARRIED, *wheels)}
    skipped = {norm(n) for n in NOT_CARRIED}
    out = []
    for wheel, needs in sorted(wheels.items()):
        for name in needs:
            if name not in have and name not in skipped:
                out.append(f"{wheel} requires {name}: neither on the device nor carried (add it to CARRIED)")
    return out


def local_versions(names: Sequence[str]) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def pip_download_argv(python: str, dest: Path, specs: Sequence[str], py: str = "3.12") -> list[str]:
    argv = [
        python,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        py,
        "--implementation",
        "cp",
    ]
    for p in PLATFORMS:
        argv += ["--platform", p]
    return [*argv, "-d", str(dest), *specs]


def wheel_name(path: Path) -> str:
    return norm(path.name.split("-", 1)[0])


def wheel_requirements(path: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return requirements(z.read(meta).decode("utf-8", "replace"))


def tree_bytes(repo: Path) -> int:
    """What a `run` call sends besides the carried paths: tracked and untracked-not-ignored files."""
    p = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True, check=True
    )
    total = 0
    for name in p.stdout.decode().split("\0"):
        f = repo / name
        if name and f.is_file():
            total += f.stat().st_size
    return total


def fetch_wheels(dest: Path = REPO / WHEEL_DIR) -> int:
    """Download CARRIED (at this machine's versions) for the device; check the closure and the size."""
    versions = local_versions(CARRIED)
    missing = [n for n, v in versions.items() if v is None]
    if missing:
        print(
            f"gpu_smoke: {', '.join(missing)} not installed here: make install first (their versions are taken "
            "from this environment)",
            file=sys.stderr,
        )
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {norm(n): f"{n}=={v}" for n, v in versions.items()}
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install there
        version = old.name.split("-")[1]
        if wheel_name(old) not in wanted or wanted[wheel_name(old)].split("==")[1] != version:
            old.unlink()
    p = subprocess.run(pip_download_argv(sys.executable, dest, list(wanted.values())))
    if p.returncode:
        print("gpu_smoke: pip download failed (above)", file=sys.stderr)
        return 1
    wheels = sorted(dest.glob("*.whl"))
    problems = closure_problems({wheel_name(w): wheel_requirements(w) for w in wheels})
    got = {wheel_name(w) for w in wheels}
    problems += [f"{n}: no wheel downloaded" for n in wanted if n not in got]
    size, tree = sum(w.stat().st_size for w in wheels), tree_bytes(REPO)
    for w in wheels:
        print(f"  {w.stat().st_size / 1e6:7.2f} MB  {w.name}")
    print(
        f"{len(wheels)} wheels, {size / 2**20:.1f} MiB; with the working tree ({tree / 2**20:.1f} MiB): "
        f"{(size + tree) / 2**20:.1f} MiB of the {CARRY_LIMIT >> 20} MiB a call may carry"
    )
    for name, why in NOT_CARRIED.items():
        print(f"  not carried: {name}: {why}")
    if size + tree > CARRY_LIMIT:
        problems.append(f"{(size + tree) / 2**20:.1f} MiB would not travel (limit {CARRY_LIMIT >> 20} MiB)")
    for line in problems:
        print(f"gpu_smoke: {line}", file=sys.stderr)
    if not problems:
        print(f'ready: run with carry ["{WHEEL_DIR}"], timeout_s {RUN_TIMEOUT_S}, command:\n{RUN_COMMAND}')
    return 1 if problems else 0


def device_site(work: Path) -> Path:
    """A sitecustomize.py that makes every module the device would lack unimportable (dry run)."""
    from importlib.metadata import packages_distributions

    blocked = blocked_modules(packages_distributions(), (*DEVICE_PACKAGES, *CARRIED, *OWN_DISTRIBUTIONS))
    site = work / "device-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=sorted(blocked)))
    return site


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.gpu_wheels",
        description=__doc__.split("\n\n")[0],
        epilog=f'run on the device with carry ["{WHEEL_DIR}"], timeout_s {RUN_TIMEOUT_S}:\n  {RUN_COMMAND}',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dest", type=Path, default=REPO / WHEEL_DIR, help=f"where the wheels go (default {WHEEL_DIR}/)")
    ap.add_argument("--print-run-command", action="store_true", help="print the device's run command and exit")
    a = ap.parse_args(argv)
    if a.print_run_command:
        print(RUN_COMMAND)
        return 0
    return fetch_wheels(a.dest)


if __name__ == "__main__":
    raise SystemExit(main())
