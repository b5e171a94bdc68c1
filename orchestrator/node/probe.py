"""The node probe: a stdlib-only script that runs ON each node and prints what the checks need.

This file is sent as it is (compressed, in `python -c`) to every node and must run on any
Python >= 3.8 with nothing but the standard library: no orch imports, no third-party modules,
no `X | Y` outside annotations. A missing tool (nvidia-smi, ibv_rc_pingpong) or file is a fact,
never a crash. The controller side is `orchestrator.preflight.facts` (sending it, its protocol),
`orchestrator.preflight.shapes` (its answer held to its shape) and `orchestrator.preflight.parsers`
(what the tools it runs print).

One run per node per preflight, one SSH exec (argv[1] is a JSON object of what to do; with
`env_on_stdin` the first line on stdin is the job's environment as a JSON object, applied before
anything else, so no env value is ever on the command line where `ps` shows it):

1. open the listeners first (the master port on the master; an ephemeral "ring" port on every
   node), print `ORCH-LISTEN {...}`, gather facts, print `ORCH-FACTS {...}`. Listening before
   gathering means a slow node (importing torch) never makes a fast peer's connect test fail.
2. then answer connections on the listeners and, on the same SSH channel, the controller's
   commands, one line each on stdin:
   - `PING SEQ` → `ORCH-TIME {"seq": SEQ, "time": T}`, T this node's clock when the line arrived
     (the controller takes the midpoint of its round trip: the clock offset, ± rtt/2);
   - `CONNECT {"targets": [...], "timeout": S}` → connect to each (addr, port) target (the
     master's port, the ring successor's probe; a verbs ping), expecting the listener's token
     line, then `ORCH-REACH [...]`.
   Until stdin ends (the controller is done, or gone) or the deadline passes.

A controller that goes away while the facts are gathered (Ctrl-C, SIGTERM or a lost connection:
its end of stdin closes) ends what the probe started (`watch_controller`): its processes (the
job's check) are killed, and the throw-away container of the job's image is removed by its stop
hook (`job_stop`) by a guard of its own (`Guarded`), which a kill of the probe's whole process
group (a local transport's close) does not reach.

Tests select recorded tool output with `ORCH_PROBE_FIXTURES=<dir>` (set only through the test
sshd's SetEnv): `<dir>/nvidia-smi-query-gpu.csv` stands for the `--query-gpu` CSV,
`<dir>/nvidia-smi.txt` for the plain `nvidia-smi` table, `<dir>/infiniband/` for
/sys/class/infiniband. A file missing from the directory means "tool absent".
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time

PROBE_VERSION = 1
# The exact field list of the one real multi-GPU CSV we have on record (OmniOpt A100 sample), so
# the recorded output is parsed exactly as the live tool prints it (without a header: these columns).
GPU_QUERY = (
    "timestamp,name,pci.bus_id,driver_version,pstate,pcie.link.gen.max,pcie.link.gen.current,"
    "temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.free,memory.used"
)
# Asked for too (the header then names every column): the index and UUID CUDA_VISIBLE_DEVICES
# names GPUs by, and the compute capability torch's kernels must match. A driver whose nvidia-smi
# lacks a field (compute_cap came with R510) refuses the whole query: then GPU_QUERY alone.
GPU_QUERY_EXTRA = "index,uuid,compute_cap"
# Run in a child on nodes that declare GPUs: what CUDA the node's torch was built for, and the
# GPU architectures it carries kernels (sm_XY) and PTX (compute_XY) for. The list is compiled into
# torch (torch._C._cuda_getArchFlags), so only torch can say it; importing torch is the cost, and a
# child makes a crash or a hang a fact. Nothing here initialises CUDA or touches a GPU.
TORCH_CUDA_CODE = r"""
import json, platform
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = getattr(torch.version, "cuda", None)
    flags = torch._C._cuda_getArchFlags() if hasattr(torch._C, "_cuda_getArchFlags") else None
    out["arch_list"] = flags.split() if flags else []
    out["device_count"] = torch.cuda.device_count()
    releases = getattr(torch.cuda, "PYTORCH_RELEASES_CODE_CC", None)
    if isinstance(releases, dict):
        host = "aarch64" if platform.machine().lower() == "aarch64" else "x86_64"
        out["releases"] = {str(k): sorted(int(c) for c in v.get(host, ())) for k, v in releases.items()}
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""
ENV_PREFIXES = (
    "NCCL_",
    "TORCH_NCCL_",
    "GLOO_",
    "TORCH_DISTRIBUTED_",
    "CUDA_VISIBLE_DEVICES",
    "TZ",
    "ORCH_PROBE_FIXTURES",
)
MAX_TEXT = 1 << 20  # data YAML texts sent back for parsing on the controller
MAX_HASH = 8 << 30  # files above this are compared by size only
NTP_EPOCH = 2208988800  # seconds from 1900-01-01 (NTP) to 1970-01-01 (Unix)
# Run in a child (`python -c`) only when the files cannot tell (see `software_from_files`): a
# crashing or hanging `import torch` is then a fact, not a dead probe.
SOFTWARE_CODE = r"""
import json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = getattr(torch.version, "cuda", None)
    out["source"] = "import"
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as exc:
        out["nccl"] = None
        out["nccl_error"] = type(exc).__name__
except Exception as exc:
    out["torch"] = None
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    from importlib import metadata
    out["ultralytics"] = metadata.version("ultralytics")
except Exception:
    out["ultralytics"] = None
try:  # the job's /dev/shm (a container's own is 64 MB unless it shares the host's IPC)
    import os
    st = os.statvfs("/dev/shm")
    out["shm_bytes"] = st.f_frsize * st.f_blocks
except Exception:
    out["shm_bytes"] = None
try:  # what RDMA needs of the job's process: pinned memory without limit, the verbs devices
    import resource
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    out["memlock"] = -1 if soft == resource.RLIM_INFINITY else soft
    out["infiniband"] = sorted(os.listdir("/dev/infiniband")) if os.path.isdir("/dev/infiniband") else []
except Exception:
    out["memlock"] = None
print(json.dumps(out))
"""


_EMIT = threading.Lock()


def emit(tag: str, obj: object) -> None:
    """One tagged JSON line on stdout, flushed: the controller reads the stream line by line."""
    line = f"{tag} {json.dumps(obj, sort_keys=True)}\n"
    with _EMIT:
        sys.stdout.write(line)
        sys.stdout.flush()


def pause(seconds: float) -> None:
    """Sleep without time.sleep: under libfaketime (how tests skew a node's clock) Python's
    clock_nanosleep-based sleep fails with EINVAL, while select() timeouts keep working."""
    select.select([], [], [], seconds)


def which(name: str) -> str | None:
    """shutil.which for a plain command name (importing shutil costs the probe more than this)."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.access(p, os.X_OK) and not os.path.isdir(p):
            return p
    return None


def run_capture(argv: list, timeout: float, env: dict | None = None, cwd: str | None = None) -> tuple:
    """(returncode, stdout bytes, stderr bytes); returncode None on timeout.

    A watchdog timer kills the child instead of `communicate(timeout=)`, whose polling wait
    sleeps with time.sleep (see `pause`)."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    killed = []

    def kill() -> None:
        killed.append(True)
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        out, err = proc.communicate()
    finally:
        timer.cancel()
    return (None if killed else proc.returncode), out, err


def run_tool(argv: list, timeout: float = 20.0) -> dict:
    """Run a tool and return {rc, out, err}; rc is None when the tool is absent or hangs."""
    if which(argv[0]) is None:
        return {"rc": None, "out": "", "err": f"{argv[0]}: not found in PATH"}
    try:
        rc, out, err = run_capture(argv, timeout)
    except OSError as exc:
        return {"rc": None, "out": "", "err": f"{argv[0]}: {exc}"}
    if rc is None:
        return {"rc": None, "out": "", "err": f"{argv[0]}: timed out after {timeout:.0f}s"}
    return {"rc": rc, "out": out.decode("utf-8", "replace"), "err": err.decode("utf-8", "replace")[-2000:]}


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def fixture_dir() -> str | None:
    return os.environ.get("ORCH_PROBE_FIXTURES") or None


def tool_path(name: str) -> str | None:
    """Where a tool is: in fixture mode only `<fixtures>/bin/` counts (a stand-in that replays
    recorded output), else PATH."""
    fx = fixture_dir()
    if fx:
        p = os.path.join(fx, "bin", name)
        return p if os.access(p, os.X_OK) else None
    return which(name)


def ib_root() -> str:
    fx = fixture_dir()
    return os.path.join(fx, "infiniband") if fx else "/sys/class/infiniband"


# ----------------------------------------------------------------------------- facts


def gather_env(args: dict) -> dict:
    """The variables a job would see here that matter to NCCL/Gloo/time (login env + inventory env)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}


def gather_tz() -> dict:
    link = None
    try:
        link = os.readlink("/etc/localtime")
    except OSError:
        pass
    return {
        "TZ": os.environ.get("TZ"),
        "localtime": link,
        "etc_timezone": read_text("/etc/timezone"),
        "abbr": time.strftime("%Z"),
        "utcoffset": time.strftime("%z"),
    }


def ipv4_of(name: str) -> list:
    """The interface's primary IPv4 address (SIOCGIFADDR), [] if it has none."""
    import fcntl

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        return [socket.inet_ntoa(packed[20:24])]
    except OSError:
        return []
    finally:
        s.close()


def iface_up(name: str) -> bool:
    """IFF_UP from SIOCGIFFLAGS (operstate says 'unknown' for up dummy/loopback links)."""
    import fcntl

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8913, struct.pack("256s", name.encode()[:15]))
        return bool(struct.unpack("H", packed[16:18])[0] & 0x1)
    except OSError:
        return False
    finally:
        s.close()


def gather_ifaces() -> list:
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    return [{"name": n, "up": iface_up(n), "ipv4": ipv4_of(n)} for n in names]


def gather_net_stack() -> str | None:
    """Which network stack this process runs in: the boot's id and the network namespace's inode
    (`net:[4026531840]`). Nodes that give the same are one machine's one stack, however their
    interface lists differ (a veth that came or went between two probes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        return boot + " " + os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def gather_gloo_host() -> dict:
    """Where Gloo listens here without GLOO_SOCKET_IFNAME (torch's default Gloo device): the first
    address the hostname resolves to that a socket can bind, else loopback. `addrs`: every address
    the hostname resolves to, in order; `usable`: those a socket bound."""
    host = socket.gethostname()
    addrs, usable = [], []  # type: list, list
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except OSError as exc:
        return {"hostname": host, "addrs": addrs, "usable": usable, "error": f"{type(exc).__name__}: {exc}"}
    for family, kind, proto, _, sockaddr in infos:
        addr = str(sockaddr[0])
        if addr in addrs:
            continue
        addrs.append(addr)
        s = socket.socket(family, kind, proto)
        try:
            s.bind((addr, 0) + tuple(sockaddr[2:]))
            usable.append(addr)
        except OSError:
            pass
        finally:
            s.close()
    return {"hostname": host, "addrs": addrs, "usable": usable, "error": None}


def gather_master_addr(addr: str) -> dict:
    """What the master's address resolves to on this node (the rendezvous: torchrun's store, and
    where its Gloo and NCCL listen), in getaddrinfo's order."""
    addrs = []  # type: list
    try:
        infos = socket.getaddrinfo(addr, None, 0, socket.SOCK_STREAM)
    except OSError as exc:
        return {"addr": addr, "addrs": addrs, "error": f"{type(exc).__name__}: {exc}"}
    for _family, _kind, _proto, _name, sockaddr in infos:
        if str(sockaddr[0]) not in addrs:
            addrs.append(str(sockaddr[0]))
    return {"addr": addr, "addrs": addrs, "error": None}


def gather_ib() -> dict:
    """Every device and port attribute under /sys/class/infiniband (or the fixture tree), raw."""
    root = ib_root()
    out: dict = {
        "root": root,
        "source": "fixture" if fixture_dir() else "sysfs",
        "devices": {},
        "tools": {t: tool_path(t) for t in ("ibv_rc_pingpong", "ibstat", "ibv_devinfo")},
    }
    if not os.path.isdir(root):
        return out
    for dev in sorted(os.listdir(root)):
        d = os.path.join(root, dev)
        info: dict = {k: read_text(os.path.join(d, k)) for k in ("hca_type", "fw_ver", "board_id")}
        ports = {}
        pdir = os.path.join(d, "ports")
        for port in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
            ports[port] = {
                k: read_text(os.path.join(pdir, port, k)) for k in ("state", "phys_state", "rate", "link_layer")
            }
        info["ports"] = ports
        out["devices"][dev] = info
    return out


def gather_gpus() -> dict:
    """`nvidia-smi --query-gpu` CSV and the plain table (processes, CUDA version), or fixtures."""
    fx = fixture_dir()
    if fx:

        def fixture(name: str) -> dict:
            text = read_text(os.path.join(fx, name))
            if text is None:
                return {"rc": None, "out": "", "err": f"nvidia-smi: not found (fixture {name} absent)"}
            return {"rc": 0, "out": text + "\n", "err": ""}

        return {
            "source": "fixture " + fx,
            "query": fixture("nvidia-smi-query-gpu.csv"),
            "table": fixture("nvidia-smi.txt"),
        }
    query = run_tool(["nvidia-smi", "--query-gpu=" + GPU_QUERY + "," + GPU_QUERY_EXTRA, "--format=csv"])
    if query["rc"] not in (0, None):  # an older nvidia-smi that lacks a field: the fields it has
        query = run_tool(["nvidia-smi", "--query-gpu=" + GPU_QUERY, "--format=csv"])
    table = run_tool(["nvidia-smi"]) if query["rc"] is not None else {"rc": None, "out": "", "err": query["err"]}
    return {"source": "nvidia-smi", "query": query, "table": table}


NODE_VALUES = ("{ORCH_RUN_DIR}", "{ORCH_UID}", "{ORCH_GID}", "{ORCH_HOME}")
"""What only the node knows in the plan's argv (orchestrator/config/plan.py `NODE_VALUES`), as the
agent fills it in (node/agent.py); here the run directory is the probe's own (`probe_dir`)."""
_probe_dir: list = []
_probe_dir_lock = threading.Lock()


def probe_dir() -> str:
    """A private directory standing in for the run directory ({ORCH_RUN_DIR}) of the job's
    throw-away containers (mounted at the same path, as the launch mounts the run's); removed
    when the probe exits."""
    with _probe_dir_lock:
        if not _probe_dir:
            import atexit
            import shutil
            import tempfile

            path = tempfile.mkdtemp(prefix="orch-probe-")
            atexit.register(shutil.rmtree, path, True)
            _probe_dir.append(path)
        return _probe_dir[0]


def job_python(args: dict) -> list:
    """The job's interpreter as the controller's plan runs it (`job_python`: the host's python, or
    the runtime's command that runs it in the job's container, the node's values filled in)."""
    return fill_node_values(list(args.get("job_python") or [sys.executable]))


def fill_node_values(argv: list) -> list:
    """`argv` with every `NODE_VALUES` name replaced by this node's value (as the agent does)."""
    if not any(name in str(arg) for arg in argv for name in NODE_VALUES):
        return argv
    values = {
        "{ORCH_RUN_DIR}": probe_dir(),
        "{ORCH_UID}": str(os.getuid()),
        "{ORCH_GID}": str(os.getgid()),
        "{ORCH_HOME}": os.path.expanduser("~"),
    }
    out = []
    for arg in argv:
        arg = str(arg)
        for name, value in values.items():
            arg = arg.replace(name, value)
        out.append(arg)
    return out


def gather_torch_cuda(args: dict) -> dict:
    """The node's torch: its CUDA version and the GPU architectures it has kernels for
    (`TORCH_CUDA_CODE` in a child, with a timeout); an error or silence is the answer."""
    timeout = float(args.get("software_timeout", 120))
    rc, so, err = run_capture([sys.executable, "-c", TORCH_CUDA_CODE], timeout)
    return read_torch_cuda(rc, so.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timeout)


def read_torch_cuda(rc: int | None, out: str, err: str, timeout: float) -> dict:
    if rc is None:
        return {"error": f"importing torch took over {timeout:.0f}s"}
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "python could not tell torch's CUDA build: " + err[-500:].strip()}


def gather_job_check(args: dict) -> dict | None:
    """The job's own check, run as the job would be (its python, workdir and environment, plus
    the torchrun variables of this node's first rank): `python -m trainer --check ARGS`, or
    whether `job.module` imports. The controller reads its answer (preflight/jobcheck.py)."""
    req = args.get("job_check")
    if not req:
        return None
    cwd = expand(req["cwd"]) if req.get("cwd") else None
    if cwd and not os.path.isdir(cwd):
        return {"kind": req.get("kind", ""), "error": f"not run: workdir {req['cwd']} is not a directory here"}
    env = dict(os.environ)
    env.update(req.get("env") or {})
    timeout = float(req.get("timeout", 90))
    argv = job_python(args) + list(req["inner"])
    t0 = time.time()
    try:
        rc, so, err = run_capture(argv, timeout, env=env, cwd=cwd)
    except OSError as exc:
        return {"kind": req.get("kind", ""), "error": f"cannot run {argv[0]}: {exc.strerror or exc}"}
    return read_job_check(req, rc, so.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.time() - t0)


def read_job_check(req: dict, rc: int | None, out: str, err: str, seconds: float) -> dict:
    answer = {
        "kind": req.get("kind", ""),
        "rc": rc,
        "out": out[-20000:],
        "err": err[-4000:],
        "seconds": round(seconds, 2),
    }
    if rc is None:
        answer["error"] = f"no answer within {float(req.get('timeout', 90)):.0f} s"
    return answer


def norm_dist(name: str) -> str:
    """A distribution name as its `.dist-info` directory spells it, lower case (PEP 503/427)."""
    out = name.lower()
    for ch in "-.":
        out = out.replace(ch, "_")
    return out


def dist_versions(names: tuple, prefixes: tuple = ()) -> dict:
    """{name or prefix: version} of installed distributions, from `<name>-<ver>.dist-info/METADATA`
    in sys.path order (first wins, as for imports): a directory listing per path entry instead of
    importlib.metadata, which imports a dozen modules and reads every distribution's metadata."""
    want = {norm_dist(n): n for n in names}
    found: dict = {}
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in sorted(listing):
            if not item.endswith(".dist-info"):
                continue
            dist = norm_dist(item[: -len(".dist-info")].rsplit("-", 1)[0])
            keys = [want[dist]] if dist in want else []
            keys += [p for p in prefixes if dist.startswith(norm_dist(p))]
            keys = [k for k in keys if k not in found]
            if not keys:
                continue
            version = None
            try:
                with open(os.path.join(entry or ".", item, "METADATA"), encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            version = line.split(":", 1)[1].strip()
                            break
                        if not line.strip():
                            break
            except OSError:
                continue
            for k in keys:
                found[k] = version
    return found


def software_from_files() -> dict | None:
    """torch, CUDA and NCCL versions without importing torch, or None where the files cannot tell.

    torch.__version__ and torch.version.cuda are literals in torch/version.py; a pip build's NCCL
    is the nvidia-nccl-* wheel it links. Reading them costs a millisecond where `import torch`
    costs seconds of CPU per node (and the probe runs on every node of every check)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\b[^=\n]*=\s*(?:['\"]([^'\"]*)['\"]|None)", text, re.M)
    if not version or not cuda:
        return None
    dists = dist_versions(("ultralytics",), ("nvidia-nccl",))
    nccl = dists.get("nvidia-nccl")
    if cuda.group(1) and nccl is None:
        return None  # a CUDA build whose NCCL only torch itself can tell (conda, source builds)
    ultralytics = dists.get("ultralytics")
    if ultralytics is None:  # not a plain dist-info install (egg-link, ...): ask importlib
        try:
            from importlib import metadata

            ultralytics = metadata.version("ultralytics")
        except Exception:
            ultralytics = None
    return {
        "torch": version.group(1),
        "cuda": cuda.group(1) or None,
        "nccl": nccl,
        "source": "files",
        "ultralytics": ultralytics,
    }


def gather_software(args: dict) -> dict:
    """Versions as the job's python sees them: from files in this process when they tell, else
    torch is imported in a child so that a crash is a fact."""
    if not os.environ.get("ORCH_PROBE_IMPORT_TORCH"):
        fast = software_from_files()
        if fast is not None:
            return {"python": sys.version.split()[0], "executable": sys.executable, **fast}
    timeout = float(args.get("software_timeout", 120))
    rc, so, err = run_capture([sys.executable, "-c", SOFTWARE_CODE], timeout)
    return read_software(rc, so.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timeout)


def read_software(rc: int | None, out: str, err: str, timeout: float) -> dict:
    if rc is None:
        return {"python": sys.version.split()[0], "error": f"importing torch took over {timeout:.0f}s"}
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"python": sys.version.split()[0], "error": "version probe failed: " + err[-500:]}


def expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


def run_root_problem(root: str) -> str | None:
    """Why the agent would refuse a run directory under `job.run_root` (`trust.py`, the agent's
    own rule: the preflight and the agent judge it by one definition), or None."""
    try:
        from . import trust
    except ImportError:  # run as a file from its directory
        import trust  # type: ignore[no-redef]
    return trust.run_root_problem(expand(root))


def file_facts(path: str, want_text: bool, mounts: tuple = ()) -> dict:
    """exists / size / sha256 of one path; small YAML texts come back for parsing upstream."""
    p = expand(path)
    out: dict = {"path": path, "exists": os.path.exists(p), "is_file": os.path.isfile(p), "is_dir": os.path.isdir(p)}
    if not out["is_file"]:
        return out
    try:
        out["size"] = os.path.getsize(p)
        if out["size"] <= MAX_HASH:
            import hashlib

            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            out["sha256"] = h.hexdigest()
        if want_text and out["size"] <= MAX_TEXT:
            out["text"] = read_text(p)
            if out["text"] is not None:  # a data YAML: what it lists, to compare node against node
                try:
                    out["dataset"] = dataset_facts(path, out["text"], mounts)
                except Exception as exc:  # a fact, not a crash
                    out["dataset_error"] = f"{type(exc).__name__}: {exc}"
    except OSError as exc:
        out["error"] = str(exc)
    return out


DATA_KEYS = ("path", "train", "val", "test")
LIST_MAX_FILES = 300000  # per split: a larger split is compared on its first files in name order
LIST_BUDGET_S = 60.0  # for the whole dataset; past it the listing stops, said, and nothing is compared
SAMPLE_FILES = 8  # files of each split whose bytes are hashed, spread evenly over the names
SAMPLE_BYTES = 4 << 20  # of each sampled file


def _yaml_scalar(text: str) -> str | None:
    """One YAML scalar as written in a data YAML: quotes and a trailing comment off; null/~ -> None."""
    text = text.strip()
    if text[:1] in ("'", '"') and text[-1:] == text[:1] and len(text) > 1:
        return text[1:-1]
    text = re.split(r"\s+#", text, maxsplit=1)[0].strip()
    return None if text in ("", "null", "~", "Null", "NULL") else text


def data_splits(text: str) -> dict:
    """`path`, `train`, `val`, `test` of a data YAML read without a YAML library (the probe has the
    standard library only): top-level keys whose value is a scalar, a flow list `[a, b]` or a
    block list (`- a` lines under it)."""
    out: dict = {}
    key = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace() and not line.startswith("-"):
            key = None
            m = re.match(r"^(path|train|val|test)\s*:(.*)$", line)
            if not m:
                continue
            value = m.group(2).strip()
            if value == "" or value.startswith("#"):
                out[m.group(1)] = []
                key = m.group(1)
            elif value.startswith("["):
                inner = value[1 : value.index("]")] if "]" in value else value[1:]
                out[m.group(1)] = [v for v in (_yaml_scalar(x) for x in inner.split(",")) if v is not None]
            else:
                out[m.group(1)] = _yaml_scalar(value)
        elif key is not None and line.strip().startswith("- "):
            item = _yaml_scalar(line.strip()[2:])
            if item is not None:
                out[key].append(item)
    return {k: v for k, v in out.items() if v not in (None, [])}


def _walk(top: str, deadline: float, entries: list) -> bool:
    """(relative name, size) of every file under `top`, in name order, into `entries`; False when
    LIST_MAX_FILES or the deadline stopped it. Symbolic links are followed, each directory walked
    once (a link back up the tree ends there, as the deadline would)."""
    stack = [""]
    seen: set = set()
    while stack:
        if time.time() > deadline:
            return False
        rel = stack.pop()
        here = os.path.join(top, rel) if rel else top
        try:
            st = os.stat(here)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(here) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs = []
        for entry in found:
            name = rel + "/" + entry.name if rel else entry.name
            try:
                if entry.is_dir():
                    dirs.append(name)
                elif entry.is_file():
                    entries.append((name, entry.stat().st_size))
            except OSError:
                continue
            if len(entries) >= LIST_MAX_FILES or time.time() > deadline:
                return False
        stack.extend(reversed(dirs))
    return True


def _listed(items: list, root: str, deadline: float) -> dict:
    """The files of one split (directories walked, a .txt list read, a file itself): count, bytes,
    a hash of the names and sizes, and a hash of a sample of their bytes."""
    import hashlib

    entries: list = []
    complete = True
    shown = []
    for i, item in enumerate(items):
        path = item if os.path.isabs(item) else os.path.join(root, item)
        shown.append(path)
        prefix = f"{i}:" if len(items) > 1 else ""
        if os.path.isdir(path):
            mine: list = []
            complete = _walk(path, deadline, mine) and complete
            entries += [(prefix + name, size, os.path.join(path, name)) for name, size in mine]
        elif os.path.isfile(path) and path.endswith(".txt"):
            parent = os.path.dirname(path)
            for line in (read_text(path) or "").splitlines():
                line = line.strip()
                if not line:
                    continue
                full = os.path.join(parent, line[2:]) if line.startswith("./") else line
                try:
                    entries.append((prefix + line, os.path.getsize(full), full))
                except OSError:
                    entries.append((prefix + line, -1, full))
        elif os.path.isfile(path):
            entries.append((prefix + os.path.basename(path), os.path.getsize(path), path))
        else:
            return {"path": ", ".join(shown), "error": f"{path} does not exist"}
        if not complete:
            break
    listing = hashlib.sha256()
    for name, size, _ in entries:
        listing.update(f"{name}\t{size}\n".encode("utf-8", "surrogateescape"))
    sample = hashlib.sha256()
    n = len(entries)
    picks = sorted({round(k * (n - 1) / (SAMPLE_FILES - 1)) for k in range(SAMPLE_FILES)}) if n else []
    for k in picks:
        name, _, full = entries[k]
        sample.update(name.encode("utf-8", "surrogateescape") + b"\0")
        try:
            with open(full, "rb") as fh:
                sample.update(fh.read(SAMPLE_BYTES))
        except OSError as exc:
            sample.update(str(exc).encode())
    out = {
        "path": ", ".join(shown),
        "files": n,
        "bytes": sum(max(size, 0) for _, size, _ in entries),
        "listing": listing.hexdigest(),
        "sample": sample.hexdigest(),
        "capped": n >= LIST_MAX_FILES,
    }
    if not complete and n < LIST_MAX_FILES:
        out["error"] = f"listing stopped after {n} files ({LIST_BUDGET_S:.0f} s)"
    return out


def labels_dir(path: str) -> str | None:
    """ultralytics' label folder of an image folder: the last `/images/` of the path as `/labels/`."""
    sep = os.sep + "images" + os.sep
    probe = path.rstrip(os.sep) + os.sep
    if sep not in probe:
        return None
    head, tail = probe.rsplit(sep, 1)
    return (head + os.sep + "labels" + os.sep + tail).rstrip(os.sep)


def dataset_facts(yaml_path: str, text: str, mounts: tuple = ()) -> dict:
    """What a data YAML lists on this node, split by split (`train`, `val`, `test`, and each image
    folder's `labels` beside it as `train labels`...): files, bytes, the names' hash and a sample
    of the bytes, for the controller to compare node against node. The split paths resolve as the
    trainer resolves them (`path:`, else the YAML's folder; relative to the YAML's folder)."""
    splits = data_splits(text)
    base = os.path.dirname(os.path.abspath(expand(yaml_path)))
    root = splits.get("path")
    root = base if not isinstance(root, str) else os.path.realpath(os.path.join(base, to_host(root, mounts)))
    deadline = time.time() + LIST_BUDGET_S
    out = {}
    for split in ("train", "val", "test"):
        items = splits.get(split)
        if items is None:
            continue
        items = [to_host(i, mounts) for i in (items if isinstance(items, list) else [items])]
        out[split] = _listed(items, root, deadline)
        folders = [i if os.path.isabs(i) else os.path.join(root, i) for i in items]
        labels = [labels_dir(f) for f in folders if os.path.isdir(f)]
        labels = [d for d in labels if d and os.path.isdir(d)]
        if labels and "error" not in out[split]:
            out[split + " labels"] = _listed(labels, root, deadline)
    return out


def output_facts(path: str) -> dict:
    """A directory the job will write: whether it exists (and is writable), else the nearest
    existing ancestor and whether this user can create entries there."""
    p = os.path.abspath(expand(path))
    out: dict = {
        "path": path,
        "output": True,
        "exists": os.path.exists(p),
        "is_file": os.path.isfile(p),
        "is_dir": os.path.isdir(p),
    }
    if out["is_dir"]:
        out["writable"] = os.access(p, os.W_OK | os.X_OK)
        return out
    if out["exists"]:
        return out
    parent = os.path.dirname(p)
    while parent != os.path.dirname(parent) and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    out["ancestor"] = parent
    out["ancestor_is_dir"] = os.path.isdir(parent)
    out["ancestor_writable"] = os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)
    return out


WRITABLE_CODE = r"""
import json, os, sys
out = {}
for key, path in json.loads(sys.argv[1]).items():
    p = os.path.expanduser(path)
    while p and not os.path.exists(p):
        p = os.path.dirname(p.rstrip("/")) or "/"
    out[key] = {"checked": p, "writable": os.access(p, os.W_OK)}
print(json.dumps(out))
"""


def read_outputs_inside(rc: int | None, out: str, err: str, timeout: float) -> dict:
    """Whether the job's output folders (or their nearest existing parent) are writable inside
    the job's container, as its user: a read-only mount or another owner shows only there."""
    try:
        return {"paths": json.loads(out.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"error": "could not look inside the container: " + err[-500:].strip()}


EXISTS_CODE = r"""
import json, os, sys
out = {}
for key, path in json.loads(sys.argv[1]).items():
    p = os.path.expanduser(path)
    out[key] = {"path": path, "exists": os.path.exists(p), "is_file": os.path.isfile(p), "is_dir": os.path.isdir(p)}
print(json.dumps(out))
"""


def read_paths_inside(rc: int | None, out: str, err: str, timeout: float) -> dict:
    """The job's inputs that are in the image's own files (under no mount), as the job's container
    sees them: whether each exists and is a file (the same image ID everywhere holds the same bytes)."""
    try:
        return {"paths": json.loads(out.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"error": "could not look inside the container: " + err[-500:].strip()}


IN_IMAGE_CODE = r"""
import json, os, subprocess, sys, threading, time
req = json.loads(sys.argv[1])
hidden = set(req["check_env"])
answers = {}
def run(key, task):
    env = dict(os.environ)
    if not task.get("check"):
        env = {k: v for k, v in env.items() if k not in hidden}
    t0 = time.time()
    try:
        proc = subprocess.Popen([sys.executable] + task["argv"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        answers[key] = {"rc": 1, "out": "", "err": "%s: %s" % (type(exc).__name__, exc), "seconds": 0.0}
        return
    killed = []
    timer = threading.Timer(task["timeout"], lambda: (killed.append(1), proc.kill()))
    timer.start()
    try:
        out, err = proc.communicate()
    finally:
        timer.cancel()
    answers[key] = {"rc": None if killed else proc.returncode, "out": out.decode("utf-8", "replace")[-20000:],
                    "err": err.decode("utf-8", "replace")[-4000:], "seconds": round(time.time() - t0, 2)}
threads = [threading.Thread(target=run, args=item) for item in req["tasks"].items()]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ORCH-IN-IMAGE " + json.dumps(answers))
"""
"""Run by the job's python in the job's container: each of the probe's in-image questions (its
`tasks`: software, torch_cuda, outputs_inside, job_check) in a child of its own, at once, each
with its timeout; one tagged JSON line of every answer. The job's check alone sees the check's
environment (`check_env`)."""
IN_IMAGE_START_S = 60.0
"""What the container's own start may take beyond its slowest question."""
IN_IMAGE_READERS = {
    "software": read_software,
    "torch_cuda": read_torch_cuda,
    "outputs_inside": read_outputs_inside,
    "paths_inside": read_paths_inside,
}


GUARD_CODE = r"""
import os, subprocess, sys
said = os.read(0, 5)
if said != b"done\n":
    try:
        subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
    except Exception:
        pass
"""
"""The guard of a throw-away container: it waits on a pipe from the probe, and unless the probe says
`done` (the container ended with its run), runs the container's stop hook (its argv)."""


class Guarded:
    """A guard for what `stop` removes, while the `with` block runs: in a session of its own, so a
    kill of the probe's process group (a local transport's close) leaves it to act."""

    def __init__(self, stop: list | None) -> None:
        self.stop = [str(a) for a in stop or []]
        self.write = -1

    def __enter__(self) -> Guarded:
        if self.stop:
            read, self.write = os.pipe()
            try:
                subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", GUARD_CODE, *self.stop],
                    stdin=read,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError:
                os.close(self.write)
                self.write = -1
            finally:
                os.close(read)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.write >= 0:
            try:
                os.write(self.write, b"done\n")
            except OSError:
                pass
            os.close(self.write)


def watch_controller(done: threading.Event) -> None:
    """Until `done`: when the controller's end of stdin closes (Ctrl-C, SIGTERM, a lost
    connection), kill every other process of this probe's process group (the job's check, a
    container's client: their guards act), remove the probe's own files, and end the probe."""
    poller = select.poll()
    poller.register(sys.stdin.fileno(), select.POLLHUP | getattr(select, "POLLRDHUP", 0))
    while not done.is_set():
        events = poller.poll(200)
        if any(e & select.POLLNVAL for _, e in events):
            return  # no stdin to watch
        if not any(e & (select.POLLHUP | getattr(select, "POLLRDHUP", 0) | select.POLLERR) for _, e in events):
            continue
        if done.is_set():
            return
        me, group = os.getpid(), os.getpgrp()
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != me:
                try:
                    if os.getpgid(int(name)) == group:
                        os.kill(int(name), 9)
                except OSError:
                    pass
        for path in _probe_dir:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        os._exit(1)


def gather_in_image(args: dict) -> dict:
    """Every fact the job's interpreter answers, from one run of the job's container (one
    container per node per preflight, `IN_IMAGE_CODE`): its software and torch, the output
    folders as the container's user sees them, and the job's own check. A container that does not
    start answers every question with what the runtime said."""
    timeout = float(args.get("software_timeout", 120))
    tasks: dict = {}
    if args.get("software", True):
        tasks["software"] = {"argv": ["-c", SOFTWARE_CODE], "timeout": timeout}
    if args.get("torch_cuda"):
        tasks["torch_cuda"] = {"argv": ["-c", TORCH_CUDA_CODE], "timeout": timeout}
    seen = args.get("in_container") or {}
    if args.get("outputs_inside"):
        outputs = {k: v for k, v in seen.items() if k in set(args.get("outputs", ()))}
        tasks["outputs_inside"] = {"argv": ["-c", WRITABLE_CODE, json.dumps(outputs)], "timeout": timeout}
    if args.get("inside_only"):
        only = {k: seen[k] for k in args["inside_only"] if k in seen}
        tasks["paths_inside"] = {"argv": ["-c", EXISTS_CODE, json.dumps(only)], "timeout": timeout}
    results: dict = {}
    env, cwd, req = dict(os.environ), None, args.get("job_check") or {}
    if req:
        cwd = expand(req["cwd"]) if req.get("cwd") else None
        if cwd and not os.path.isdir(cwd):
            results["job_check"] = {
                "kind": req.get("kind", ""),
                "error": f"not run: workdir {req['cwd']} is not a directory here",
            }
            cwd = None
        else:
            env.update(req.get("env") or {})
            tasks["job_check"] = {"argv": list(req["inner"]), "timeout": float(req.get("timeout", 90)), "check": True}
    if not tasks:
        return results
    argv = job_python(args) + [
        "-c",
        IN_IMAGE_CODE,
        json.dumps({"tasks": tasks, "check_env": sorted(req.get("env") or {})}),
    ]
    t0 = time.time()
    try:
        with Guarded(args.get("job_stop")):  # removed if the probe is killed before the container ends
            limit = max(t["timeout"] for t in tasks.values()) + IN_IMAGE_START_S
            rc, so, err = run_capture(argv, limit, env=env, cwd=cwd)
    except OSError as exc:
        for key in tasks:
            results[key] = (
                {"kind": req.get("kind", ""), "error": f"cannot run {argv[0]}: {exc.strerror or exc}"}
                if key == "job_check"
                else {"error": f"{type(exc).__name__}: {exc}"}
            )
        return results
    out, said = so.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    answers = {}
    for line in out.splitlines():
        if line.startswith("ORCH-IN-IMAGE "):
            try:
                answers = json.loads(line[len("ORCH-IN-IMAGE ") :])
            except ValueError:
                pass
    whole = {"rc": rc, "out": out, "err": said, "seconds": time.time() - t0}
    if not answers:  # nothing ran inside: the runtime's own words, for the container row
        results["container_start"] = {"rc": rc, "out": out[-2000:], "err": said[-4000:]}
    for key, task in tasks.items():
        got = answers.get(key)
        got = got if isinstance(got, dict) else whole
        rc, text, errors = got.get("rc"), str(got.get("out") or ""), str(got.get("err") or "")
        if key == "job_check":
            results[key] = read_job_check(req, rc, text, errors, float(got.get("seconds") or 0))
        else:
            results[key] = IN_IMAGE_READERS[key](rc, text, errors, task["timeout"])
    return results


def image_gone(args: dict, results: dict) -> bool:
    """The image is not on this node (its runtime's `inspect` failed) and the job's container would
    not pull it (`image_required`): no container of it is started (the checks say so once)."""
    held = results.get("container_image")
    return bool(args.get("image_required")) and isinstance(held, dict) and held.get("rc") != 0


def gather_paths(args: dict) -> dict:
    """The job's paths as this host has them (in a container run, where its mounts put them)."""
    outputs = set(args.get("outputs", ()))
    mounts = tuple(tuple(m) for m in args.get("mounts") or ())
    return {
        key: output_facts(path) if key in outputs else file_facts(path, key in args.get("text_for", ()), mounts)
        for key, path in args.get("paths", {}).items()
    }


def to_host(path: str, mounts: tuple) -> str:
    """A path the job's container names (a data YAML's `path:`), on this host: through the mount it
    is under (`mounts`: (inside, host), the deepest first), else as it is (`JobEnv.host_path`)."""
    for inside, host in mounts:
        if path == inside or path.startswith(inside.rstrip("/") + "/"):
            return host.rstrip("/") + path[len(inside.rstrip("/")) :] if path != inside else host
    return path


def sntp(server: str, timeout: float = 2.0) -> dict:
    """One SNTP exchange (RFC 4330): offset = ((t2-t1)+(t3-t4))/2 is server minus this clock."""
    host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "")
    addr = (host or server, int(port or 123))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        t1 = time.time()
        packet = b"\x23" + 47 * b"\0"  # LI=0, VN=4, mode=3 (client)
        packet = packet[:40] + struct.pack("!II", int(t1 + NTP_EPOCH), int((t1 % 1) * 2**32))
        s.sendto(packet, addr)
        data = s.recvfrom(512)[0]
        t4 = time.time()
    finally:
        s.close()
    if len(data) < 48:
        raise ValueError(f"short NTP reply ({len(data)} bytes)")
    stratum = data[1]
    secs2, frac2, secs3, frac3 = struct.unpack("!IIII", data[32:48])
    t2 = secs2 - NTP_EPOCH + frac2 / 2**32
    t3 = secs3 - NTP_EPOCH + frac3 / 2**32
    if stratum == 0 or secs3 == 0:
        raise ValueError(f"server is not synchronised (stratum {stratum})")
    return {"offset_s": ((t2 - t1) + (t3 - t4)) / 2, "delay_s": (t4 - t1) - (t3 - t2), "stratum": stratum}


def gather_ntp(args: dict) -> dict | None:
    """Best of a few SNTP samples (lowest delay) against checks.clock.ntp_server."""
    server = args.get("ntp_server")
    if not server:
        return None
    samples, errors = [], []
    for i in range(4):
        if i:
            pause(0.02)
        try:
            samples.append(sntp(server))
        except (OSError, ValueError) as exc:
            errors.append(str(exc) or type(exc).__name__)
    out = {"server": server, "method": "sntp (stdlib, inline)", "samples": len(samples), "errors": errors[-2:]}
    if samples:
        best = min(samples, key=lambda s: s["delay_s"])
        # node clock minus reference: the opposite sign of NTP's offset
        out.update(offset_ms=-best["offset_s"] * 1000, delay_ms=best["delay_s"] * 1000, stratum=best["stratum"])
    return out


def gather_chrony() -> dict | None:
    res = run_tool(["chronyc", "-n", "tracking"], timeout=5)
    return res if res["rc"] is not None else None


def gather(args: dict) -> dict:
    """Everything the checks need; the slow parts (torch import, NTP, nvidia-smi) run in threads."""
    facts = {
        "probe": PROBE_VERSION,
        "node": args.get("node"),
        "host": socket.gethostname(),
        "python": {"executable": sys.executable, "version": sys.version.split()[0]},
        "env": gather_env(args),
        "inventory_env": sorted(args.get("inventory_env", [])),
        "tz": gather_tz(),
        "ifaces": gather_ifaces(),
        "net_stack": gather_net_stack(),
        "ib": gather_ib(),
        "home": os.path.expanduser("~"),
        "gloo_host": gather_gloo_host(),
    }
    if args.get("master_addr"):
        facts["master_addr"] = gather_master_addr(str(args["master_addr"]))
    want = args.get("want") or ()
    results: dict = {}
    slow: dict = {"paths": lambda: gather_paths(args)}
    if "gpus" in want or not want:  # nvidia-smi runs twice, ~0.1-1 s each on a GPU node
        slow["gpus"] = gather_gpus
    if args.get("in_image"):  # the job runs in a container: one run of it answers what only it can tell
        slow["in_image"] = lambda: {} if image_gone(args, results) else gather_in_image(args)
    else:
        if args.get("torch_cuda") and ("gpus" in want or not want):  # which GPUs the node's torch can drive
            slow["torch_cuda"] = lambda: gather_torch_cuda(args)
        if args.get("job_check"):
            slow["job_check"] = lambda: gather_job_check(args)
        if args.get("software", True):
            slow["software"] = lambda: gather_software(args)
    if "clock" in want or not want:
        slow["ntp"] = lambda: gather_ntp(args)
        slow["chrony"] = gather_chrony

    timings = {}
    if args.get("container_leftovers"):  # first: before the probe's own container starts
        t0 = time.time()
        results["containers"] = run_tool(list(args["container_leftovers"]), timeout=30)
        timings["containers"] = round(time.time() - t0, 3)
    if args.get("container_image"):  # the image the launch runs: its ID and environment here
        t0 = time.time()
        results["container_image"] = run_tool(list(args["container_image"]), timeout=60)
        timings["container_image"] = round(time.time() - t0, 3)

    def work(key: str) -> None:
        t0 = time.time()
        try:
            results[key] = slow[key]()
        except Exception as exc:  # a fact, not a crash: the check says what broke
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        timings[key] = round(time.time() - t0, 3)

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in slow]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    inside = results.pop("in_image", None)
    if isinstance(inside, dict) and set(inside) != {"error"}:
        results.update(inside)
    elif isinstance(inside, dict):  # the probe's own failure, not the container's: the software row names it
        results["software"] = {"error": f"could not look inside the container: {inside['error']}"}
    facts.update(results)
    facts["timings_s"] = timings
    wd = args.get("workdir")
    facts["workdir"] = file_facts(wd, False) if wd else None
    root = args.get("run_root")
    if root:
        facts["run_root"] = {"path": root, "problem": run_root_problem(root)}
    facts["time"] = time.time()
    return facts


# ----------------------------------------------------------------------------- listen / connect


def open_listener(host: str, port: int) -> tuple:
    """Bind and listen; returns (socket, None) or (None, error text)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # like torchrun's TCPStore: TIME_WAIT leftovers of an earlier run must not read as "taken",
    # while a live listener still makes bind fail
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        s.listen(64)
        s.setblocking(False)
        return s, None
    except OSError as exc:
        s.close()
        return None, f"{exc.strerror or exc} (errno {exc.errno})"


def port_holder(port: int) -> str | None:
    """Who listens on a TCP port, from `ss` when present (best effort, for the hint)."""
    res = run_tool(["ss", "-Htlnp", f"sport = :{port}"], timeout=5)
    if res["rc"] != 0:
        return None
    return res["out"].strip()[:300] or None


def answer_peer(sock: socket.socket, token: str, node: str, kind: str) -> None:
    """Accept one connection on a listener and answer it with the token line."""
    try:
        conn, _ = sock.accept()
    except OSError:
        return
    try:
        conn.setblocking(True)
        conn.settimeout(2)
        conn.sendall(f"ORCH-PONG {token} {node} {kind}\n".encode())
        # let the client close first, so TIME_WAIT lands on its ephemeral port, not ours
        conn.recv(64)
    except OSError:
        pass
    finally:
        conn.close()


def command(line: str, args: dict) -> None:
    """One controller command from stdin (see the module docstring)."""
    word, _, rest = line.strip().partition(" ")
    if word == "PING":
        emit("ORCH-TIME", {"seq": rest, "time": time.time()})
    elif word == "CONNECT":
        req = json.loads(rest)
        threading.Thread(
            target=lambda: emit(
                "ORCH-REACH", connect_all(req.get("targets", []), args["token"], float(req.get("timeout", 5)))
            ),
            daemon=True,
        ).start()


def serve(listeners: dict, args: dict, deadline: float) -> None:
    """Answer each connection on the listeners with the token line, and the controller's commands
    on stdin, until stdin ends (the controller is done or gone) or the deadline passes."""
    token, node = args["token"], str(args.get("node"))
    socks = {s: kind for kind, s in listeners.items() if s is not None}
    stdin = sys.stdin.fileno()
    pending = b""
    while time.monotonic() < deadline:
        ready = select.select([stdin, *socks], [], [], max(0.0, min(1.0, deadline - time.monotonic())))[0]
        for s in ready:
            if not isinstance(s, int):
                answer_peer(s, token, node, socks[s])
                continue
            try:
                data = os.read(stdin, 65536)
            except OSError:
                data = b""
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    command(line.decode("utf-8", "replace"), args)
                except (ValueError, KeyError) as exc:
                    emit("ORCH-ERROR", {"line": line[:200].decode("utf-8", "replace"), "error": str(exc)})


def roce_gid_index(dev: str, port: str = "1") -> str | None:
    """A RoCE v2 GID index with a non-zero GID (RoCE needs `-g`; InfiniBand does not)."""
    base = os.path.join(ib_root(), dev, "ports", port)
    if (read_text(os.path.join(base, "link_layer")) or "") != "Ethernet":
        return None
    tdir = os.path.join(base, "gid_attrs", "types")
    names = os.listdir(tdir) if os.path.isdir(tdir) else []
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else 1 << 30):
        gid = read_text(os.path.join(base, "gids", name)) or ""
        if "v2" in (read_text(os.path.join(tdir, name)) or "").lower() and gid.replace("0", "").strip(":"):
            return name
    return None


def verbs_argv(tool: str, dev: str, port: int, peer: str | None = None) -> list:
    """`ibv_rc_pingpong -d DEV -p PORT [-g GID] [PEER]`: a reliable-connection ping over verbs."""
    argv = [tool, "-d", dev, "-p", str(port)]
    gid = roce_gid_index(dev)
    if gid is not None:
        argv += ["-g", gid]
    return argv + ([peer] if peer else [])


def start_verbs_server(dev: str) -> tuple:
    """(server process, listen info) when ibv_rc_pingpong is installed, else (None, None)."""
    tool = tool_path("ibv_rc_pingpong")
    if not tool:
        return None, None
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        verbs_argv(tool, dev, port), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, {"port": port, "device": dev, "tool": tool}


def verbs_ping(target: dict, timeout: float) -> dict:
    """The client side of the ring's verbs test, against the successor's server."""
    out = dict(target)
    tool = tool_path("ibv_rc_pingpong")
    if not tool:
        out.update(ok=False, error="ibv_rc_pingpong not installed here")
        return out
    t0 = time.time()
    deadline = t0 + timeout
    while True:
        rc, so, se = run_capture(
            verbs_argv(tool, target["device"], int(target["port"]), target["addr"]), max(1.0, deadline - time.time())
        )
        lines = [ln.strip() for ln in (so + se).decode("utf-8", "replace").splitlines() if ln.strip()]
        # the successor's server may still be starting (a loaded node, a slow device open): the
        # tool's "Couldn't connect to HOST:PORT" is retried until the deadline
        if rc == 0 or not any("couldn't connect" in ln.lower() for ln in lines) or time.time() + 0.5 >= deadline:
            break
        pause(0.5)
    out["ms"] = (time.time() - t0) * 1000
    result = [ln for ln in lines if "bytes in" in ln]
    out.update(
        ok=rc == 0 and bool(result),
        result=result[0] if result else None,
        error=None if rc == 0 else (lines[-1] if lines else f"exit {rc}"),
    )
    if rc is None:
        out["error"] = f"no answer within {timeout:.0f}s"
    return out


def facts_mode(args: dict) -> int:
    """The one run: listeners, facts, then the controller's commands until stdin ends."""
    start = time.monotonic()
    listeners = {}
    listen = {}
    mp = args.get("master_port")
    if mp:
        listeners["master"], err = open_listener("", int(mp))
        listen["master_port"] = {"port": int(mp), "bound": err is None, "error": err}
        if err is not None:
            listen["master_port"]["holder"] = port_holder(int(mp))
    if args.get("ring_addr"):
        listeners["ring"], err = open_listener(args["ring_addr"], 0)
        listen["ring"] = {
            "addr": args["ring_addr"],
            "port": listeners["ring"].getsockname()[1] if err is None else None,
            "error": err,
        }
    verbs = None
    if args.get("verbs_device"):
        verbs, listen["verbs"] = start_verbs_server(args["verbs_device"])
    gathered = threading.Event()
    if args.get("env_on_stdin"):  # stdin is the controller's: its end closing means it is gone
        threading.Thread(target=watch_controller, args=(gathered,), daemon=True).start()
    try:
        emit("ORCH-LISTEN", listen)
        facts = gather(args)
        gathered.set()
        facts["listen"] = listen
        emit("ORCH-FACTS", facts)
        serve(listeners, args, start + float(args.get("serve_s", 30)))
    finally:
        for s in listeners.values():
            if s is not None:
                s.close()
        if verbs is not None and verbs.poll() is None:
            verbs.kill()
            verbs.wait()
    return 0


def connect_one(target: dict, token: str, timeout: float) -> dict:
    """Connect until the deadline; the listener must answer with our token (not some other program)."""
    out = dict(target)
    deadline = time.time() + timeout
    last = "no attempt"
    while True:
        t0 = time.time()
        try:
            with socket.create_connection((target["addr"], int(target["port"])), timeout=max(0.5, deadline - t0)) as s:
                s.settimeout(max(0.5, deadline - time.time()))
                line = s.makefile("rb").readline().decode("utf-8", "replace").split()
            out["ms"] = (time.time() - t0) * 1000
            if len(line) >= 3 and line[0] == "ORCH-PONG" and line[1] == token:
                out.update(ok=True, answered_by=line[2])
            else:
                out.update(ok=False, error="something else answers on {}:{}".format(target["addr"], target["port"]))
            return out
        except OSError as exc:
            last = exc.strerror or str(exc) or type(exc).__name__
        if time.time() + 0.2 >= deadline:
            out.update(ok=False, error=last)
            return out
        pause(0.2)


def connect_all(targets: list, token: str, timeout: float) -> list:
    """Every target at once (TCP connect with the token check, or a verbs ping); results in order."""
    results: list = [None] * len(targets)

    def one(i: int) -> None:
        try:
            if targets[i].get("kind") == "verbs":
                results[i] = verbs_ping(targets[i], timeout * 3)
            else:
                results[i] = connect_one(targets[i], token, timeout)
        except Exception as exc:  # a fact for the check, never a silent gap
            results[i] = dict(targets[i], ok=False, error=f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def read_env(fd: int, limit: int = 1 << 20) -> dict:
    """The job's environment, sent as the first line on stdin (`{"K": "V", ...}`), never in argv
    where `ps` shows it to every user of the node. Read a byte at a time: the controller's later
    commands stay on the descriptor for `serve`."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk or len(data) >= limit:
            raise ValueError("the environment line ended early")
        data += chunk
    env = json.loads(data.decode("utf-8"))
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the environment line is not a mapping of strings")
    return env


PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH")
"""The variables that decide an interpreter's sys.path when it starts: the probe is already running
when it reads the job's environment, so it asks a fresh interpreter for the path they make."""


def apply_env(env: dict) -> None:
    """Take the job's environment, and the sys.path a job started with it would have: the probe's
    own was made from the login environment, and its file-reading software facts (`dist_versions`,
    `find_spec("torch")`) must see the packages an inventory's PYTHONPATH brings, as the job will."""
    os.environ.update(env)
    if not any(k in env for k in PATH_ENV):
        return
    rc, so, _err = run_capture([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], 30)
    if rc == 0:
        try:
            path = json.loads(so.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return
        if isinstance(path, list) and all(isinstance(p, str) for p in path):
            sys.path[1:] = path  # sys.path[0] stays this process's own (-c: the working directory)
            import importlib

            importlib.invalidate_caches()


def main(argv: list) -> int:
    args = json.loads(argv[1]) if len(argv) > 1 else {}
    if args.get("env_on_stdin"):
        try:
            apply_env(read_env(sys.stdin.fileno()))
        except ValueError as exc:
            emit("ORCH-ERROR", {"line": "", "error": f"the job's environment: {exc}"})
            return 2
    return facts_mode(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
