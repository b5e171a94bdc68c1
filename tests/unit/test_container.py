"""job.container: the runtime argv builders (golden, like torchrun_argv), the stop hook, and the
rules that refuse a container setting orch cannot honour (file:line:key, one line, exit 2)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import inventory
from orchestrator.config.container import Pins
from orchestrator.config.jobenv import Sweep, job_env
from orchestrator.config.plan import job_command, job_python, job_stop, make_plan
from orchestrator.errors import InventoryError

REPO = Path(__file__).resolve().parents[2]
YOLOE = REPO / "inventory" / "yoloe-image.yaml"
PY = "/opt/conda/envs/yoloe/bin/python"
ENV_NAMES = [
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "ORCH_RUN_ID",
    "ORCH_NODE",
    "ORCH_NODE_RANK",
    "ORCH_NNODES",
    "ORCH_ATTEMPT",
    "ORCH_LAUNCH",
]


def golden_docker(node: str, rank: int) -> list[str]:
    """The field guide's `docker run --gpus '"device=0,1"' -v /data:/data yoloe-official:latest`, as orch
    runs it: named, labelled, removed with its job, the host's network, memlock, RDMA, the SSH user."""
    return [
        "docker",
        "run",
        "--rm",
        "--init",
        "--pull",  # pull: never, as the runtime reads it (issue 54.5)
        "never",
        "--name",
        f"orch-r1-{node}-abcd1234",
        "--label",
        "orch.run=r1",
        "--label",
        f"orch.node={node}",
        "--label",
        "orch.nonce=abcd1234",
        "--label",
        "orch.cluster=yoloe-image",
        "--network",
        "host",  # no --ipc host: options give --shm-size
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "--device",
        "/dev/infiniband",
        "--cap-add",
        "IPC_LOCK",
        "--user",
        "{ORCH_UID}:{ORCH_GID}",
        "-v",
        "/etc/passwd:/etc/passwd:ro",
        "-v",
        "/etc/group:/etc/group:ro",
        "--tmpfs",
        "/tmp/orch-home:rw,mode=1777",
        "-e",
        "HOME=/tmp/orch-home",  # not the host's: /root/yoloe stays
        "-v",
        "{ORCH_RUN_DIR}:{ORCH_RUN_DIR}",
        "-v",
        "/mnt/nfs/orch:/mnt/nfs/orch",
        "-v",
        "/data:/data",
        "-v",
        "/mnt/nfs/ckpt:/ckpt",
        "-v",
        "/models:/models:ro",
        "-w",
        "/root/yoloe",
        *[a for n in ENV_NAMES for a in ("-e", n)],
        "--gpus",
        '"device=0,1,2,3,4,5,6,7"',
        "--shm-size=32g",
        "yoloe-official:latest",
        PY,
        "-m",
        "torch.distributed.run",
        "--log-dir={ORCH_RUN_DIR}/torchrun",
        "--nnodes=4",
        "--nproc-per-node=8",
        f"--node-rank={rank}",
        "--master-addr=10.0.0.1",
        "--master-port=29500",
        "--rdzv-id=r1-abcd1234-a1",
        "--max-restarts=0",
        "--tee=3",
        "-m",
        "trainer",
        "--weights",
        "/models/yoloe-v8l-seg.pt",
        "--text-embeddings",
        "/models/coco_text_pe.pt",
        "--data",
        "/data/coco/coco.yaml",
        "--epochs",
        "80",
        "--batch",
        "64",
        "--sync-bn",  # 2 images per GPU: BatchNorm over the whole batch, as the guide trains it
        "--imgsz",
        "640",
        "--project",
        "/ckpt/yoloe",
    ]


def test_the_official_image_inventory_warns_of_nothing() -> None:
    """Its own dry run warned of BatchNorm over 2 images per rank (issue 54.10): it carries `sync-bn`."""
    from orchestrator.config.plan import job_warnings

    assert job_warnings(inventory.load(YOLOE), 32) == ()


def test_the_official_image_inventory_is_golden() -> None:
    plan = make_plan(inventory.load(YOLOE), "r1", nonce="abcd1234")
    assert plan.world_size == 32
    for p in plan.nodes:
        assert list(p.argv) == golden_docker(p.node.name, p.node_rank)
        assert p.stop == ("docker", "rm", "-f", f"orch-r1-{p.node.name}-abcd1234")
        assert p.workdir == "/mnt/nfs/orch"  # the runtime's cwd on the host; the job's is -w
        assert "CUDA_VISIBLE_DEVICES" not in p.env
    assert plan.to_json()["nodes"][0]["stop_hook"] == ["docker", "rm", "-f", "orch-r1-gpu1-abcd1234"]  # type: ignore[index]


def test_a_retrys_containers_have_names_of_their_own_and_each_stop_hook_names_its_own() -> None:
    """The nonce is the run's: a retry's container named like the first attempt's could be removed
    by a stop hook of that attempt still running late (a slow daemon), and a retry would die of
    it. Attempt 1 keeps the contract's name; attempt N >= 2 appends `-aN`."""
    inv = inventory.load(YOLOE)
    first, second = (make_plan(inv, "r1", attempt=a, nonce="abcd1234").nodes[0] for a in (1, 2))

    def name(argv: tuple[str, ...] | list[str]) -> str:
        return list(argv)[list(argv).index("--name") + 1]

    assert name(first.argv) == "orch-r1-gpu1-abcd1234" and first.stop[-1] == name(first.argv)
    assert name(second.argv) == "orch-r1-gpu1-abcd1234-a2" and second.stop[-1] == name(second.argv)
    assert "orch.nonce=abcd1234" in second.argv  # the sweep by label still finds every attempt's


def test_env_values_never_reach_the_argv() -> None:
    inv = inventory.parse(
        "nodes:\n  - host: a\n    gpus: 2\nenv: {HF_TOKEN: s3cr3t-value}\n"
        "job: {container: {runtime: podman, image: img:1}}\n",
        "t.yaml",
    )
    p = make_plan(inv, "r1", nonce="n0").nodes[0]
    assert "HF_TOKEN" in p.argv and not any("s3cr3t" in a for a in p.argv)
    assert p.env["HF_TOKEN"] == "s3cr3t-value"  # in launch.json, the runtime process's environment


def podman_inv(extra: str = "", node: str = "") -> inventory.Inventory:
    return inventory.parse(
        f"nodes:\n  - host: a\n    gpus: 4\n    nproc_per_node: 2\n{node}"
        f"job:\n  workdir: ~/w\n  container:\n    runtime: podman\n    image: img:1\n{extra}",
        "t.yaml",
    )


def test_podman_gets_the_gpus_by_cdi_and_ipc_host_and_the_nodes_home_for_a_tilde_workdir() -> None:
    inv = podman_inv()
    a = inv.nodes[0]
    argv = job_command(inv, a, ["-c", "pass"], run_id="r:1", nonce="n0", env=["X"])
    assert argv[:8] == ["podman", "run", "--rm", "--init", "--pull", "never", "--name", "orch-r-1-a-n0"]  # no ":"
    assert argv[argv.index("--network") : argv.index("--network") + 4] == ["--network", "host", "--ipc", "host"]
    assert "--device" in argv and argv[argv.index("--device") + 1] == "nvidia.com/gpu=0"
    assert argv[argv.index("nvidia.com/gpu=0") + 1 : argv.index("nvidia.com/gpu=0") + 3] == [
        "--device",
        "nvidia.com/gpu=1",
    ]
    assert argv[argv.index("{ORCH_HOME}/w:{ORCH_HOME}/w") - 1 :][:2] == ["-v", "{ORCH_HOME}/w:{ORCH_HOME}/w"]
    assert argv[argv.index("-w") + 1] == "{ORCH_HOME}/w" and argv[-4:] == ["img:1", "python3", "-c", "pass"]
    assert "--gpus" not in argv and "/dev/infiniband" not in argv  # no rdma.devices


def test_pins_choose_the_image_id_and_the_gpu_uuids_and_cuda_visible_devices_selects() -> None:
    inv = podman_inv(node="    env: {CUDA_VISIBLE_DEVICES: '2,3'}\n")
    a = inv.nodes[0]
    argv = job_command(inv, a, [], run_id="r", env=["CUDA_VISIBLE_DEVICES", "Y"])
    assert [argv[i + 1] for i, x in enumerate(argv) if x == "--device"] == ["nvidia.com/gpu=2", "nvidia.com/gpu=3"]
    assert "CUDA_VISIBLE_DEVICES" not in argv and "Y" in argv  # it selects, it is not forwarded
    pins = Pins(image_id="sha256:0123abcd", gpus={"a": ("GPU-aaa", "GPU-bbb")})
    argv = job_command(inv, a, [], run_id="r", pins=pins)
    assert [argv[i + 1] for i, x in enumerate(argv) if x == "--device"] == [
        "nvidia.com/gpu=GPU-aaa",
        "nvidia.com/gpu=GPU-bbb",
    ]
    assert argv[-2:] == ["sha256:0123abcd", "python3"]
    docker = inventory.parse("nodes:\n  - host: a\n    gpus: 2\njob: {container: {runtime: docker, image: i}}\n", "t")
    argv = job_command(docker, docker.nodes[0], [], pins=Pins(gpus={"a": ("GPU-1", "GPU-2")}))
    assert argv[argv.index("--gpus") + 1] == '"device=GPU-1,GPU-2"'
    assert shlex.join(argv[argv.index("--gpus") :][:2]) == "--gpus '\"device=GPU-1,GPU-2\"'"  # as the guide types it


def test_users_root_and_uid_gid() -> None:
    root = podman_inv("    user: root\n")
    argv = job_command(root, root.nodes[0], [])
    assert argv[argv.index("--user") + 1] == "0:0" and "/etc/passwd:/etc/passwd:ro" not in argv and "HOME" not in argv
    other = podman_inv("    user: '1001:1001'\n")
    argv = job_command(other, other.nodes[0], [])
    assert argv[argv.index("--user") + 1] == "1001:1001" and "/etc/passwd:/etc/passwd:ro" in argv
    assert "HOME=/tmp/orch-home" in argv and "/tmp/orch-home:rw,mode=1777" in argv
    # that uid cannot enter the SSH user's private run directory: torchrun's own logs stay in the container
    assert "--log-dir=/tmp/orch-home/torchrun" in make_plan(other, "r1").nodes[0].argv
    # root's folders there would be root's, 0700: the SSH account could not remove its own run (issue 54.7)
    assert "--log-dir=/tmp/orch-torchrun" in make_plan(root, "r1").nodes[0].argv
    host = podman_inv("    user: host\n")
    assert "--log-dir={ORCH_RUN_DIR}/torchrun" in make_plan(host, "r1").nodes[0].argv


def test_apptainer_binds_and_selects_gpus_through_its_environment() -> None:
    inv = inventory.parse(
        "nodes:\n  - host: a\n    gpus: 2\n"
        "job: {workdir: /w, container: {runtime: apptainer, image: /img/yoloe.sif, python: /py,"
        " mounts: [/data]}}\n",
        "t.yaml",
    )
    p = make_plan(inv, "r1", nonce="n0").nodes[0]
    assert list(p.argv[:14]) == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "{ORCH_RUN_DIR}:{ORCH_RUN_DIR}",
        "--bind",
        "/w:/w",
        "--bind",
        "/data:/data",
        "--pwd",
        "/w",
        "/img/yoloe.sif",
        "/py",
        "-m",
    ]
    assert p.env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "0,1" and p.stop == ()
    assert job_python(inv, p.node) == "/py"


def test_pull_never_is_the_runtimes_and_memlock_is_asked_only_for_rdma() -> None:
    """`pull: never` reaches docker and podman as `--pull never` (without it a node that lacks the
    image pulls a same-named one, issue 54.5); `--ulimit` only where checks.rdma.devices asks for
    pinned memory (any `--ulimit` fails every start on a node without CAP_SYS_RESOURCE, issue 53.9)."""
    for runtime in ("docker", "podman"):
        inv = inventory.parse(f"nodes:\n  - host: a\njob: {{container: {{runtime: {runtime}, image: i}}}}\n", "t")
        argv = job_command(inv, inv.nodes[0], [], run_id="r", role="probe")
        assert argv[2:6] == ["--rm", "--init", "--pull", "never"] and "--ulimit" not in argv, argv
        pulls = inventory.parse(
            f"nodes:\n  - host: a\njob: {{container: {{runtime: {runtime}, image: i, pull: missing}}}}\n", "t"
        )
        assert "--pull" not in job_command(pulls, pulls.nodes[0], [])
        rdma = inventory.parse(
            f"nodes:\n  - host: a\nchecks: {{rdma: {{devices: [mlx5_0]}}}}\n"
            f"job: {{container: {{runtime: {runtime}, image: i}}}}\n",
            "t",
        )
        assert "memlock=-1" in job_command(rdma, rdma.nodes[0], [])
    sif = inventory.parse("nodes:\n  - host: a\njob: {container: {runtime: apptainer, image: /i.sif}}\n", "t")
    assert "--pull" not in job_command(sif, sif.nodes[0], [])


def test_a_cpu_node_gets_no_gpu_flags_and_the_fabric_and_check_containers_have_names_of_their_own() -> None:
    inv = inventory.parse("nodes:\n  - host: a\njob: {container: {runtime: docker, image: i}}\n", "t.yaml")
    a = inv.nodes[0]
    assert "--gpus" not in job_command(inv, a, [])
    check = job_command(inv, a, [], run_id="preflight-1", role="check")
    assert check[check.index("--name") + 1] == "orch-preflight-1-a-check"
    assert job_stop(inv, a, "preflight-1", role="check") == ["docker", "rm", "-f", "orch-preflight-1-a-check"]


def test_sweep_and_leftover_listings_go_by_label() -> None:
    inv = podman_inv()
    env = job_env(inv, inv.nodes[0], run_id="r1", nonce="n0")
    assert env.sweep() == Sweep(
        ("podman", "ps", "-aq", "--no-trunc", "--filter", "label=orch.nonce=n0", "--filter", "label=orch.node=a"),
        ("podman", "rm", "-f"),
    )
    assert env.leftovers()[:5] == ["podman", "ps", "-a", "--filter", "label=orch.cluster=t"]
    # issue 54.3: podman 4.3 knows no `.Label` (every node failed exactly when a leftover was there)
    assert env.leftovers()[-1] == '{{.ID}}\t{{.Names}}\t{{index .Labels "orch.run"}}\t{{.State}}'
    docker = inventory.parse("nodes:\n  - host: a\njob: {container: {runtime: docker, image: i}}\n", "t.yaml")
    assert job_env(docker, docker.nodes[0]).leftovers()[-1] == '{{.ID}}\t{{.Names}}\t{{.Label "orch.run"}}\t{{.State}}'
    assert job_env(inv, inv.nodes[0], run_id="r1").sweep() is None  # a dry run: no nonce, nothing to find
    sif = inventory.parse("nodes:\n  - host: a\njob: {container: {runtime: apptainer, image: /i.sif}}\n", "t")
    assert job_env(sif, sif.nodes[0], run_id="r1", nonce="n0").sweep() is None  # nothing outlives the job


def test_plan_json_records_the_environment_as_data() -> None:
    """The runtime, the image as named, the image ID the launch ran (the report reads it) and the
    job's python, per node; a bare run's runtime is null."""
    inv = podman_inv()
    plan = make_plan(inv, "r1", nonce="n0", pins=Pins(image_id="0123abcd"))
    assert plan.to_json()["nodes"][0]["environment"] == {  # type: ignore[index]
        "runtime": "podman",
        "image": "img:1",
        "image_id": "0123abcd",
        "python": "python3",
    }
    bare = inventory.load(REPO / "inventory" / "v100.yaml")
    assert make_plan(bare, "r1").to_json()["nodes"][0]["environment"]["runtime"] is None  # type: ignore[index]


BAD = [
    ("    runtime: dokcer\n", 6, "job.container.runtime", "unknown runtime 'dokcer' (did you mean 'docker'?)"),
    ("    runtime: docker\n    mounts: [data]\n", 7, "job.container.mounts[0]", "is not an absolute path"),
    ("    runtime: docker\n    mounts: [/d, '/e:/d:ro']\n", 7, "job.container.mounts[1]", "/d is mounted twice"),
    (
        "    runtime: docker\n    mounts: ['/x:/srv/runs/r']\n",
        7,
        "job.container.mounts[0]",
        "would hide the run directory under job.run_root /srv/runs",
    ),
    ("    runtime: docker\n    mounts: ['/d:/d:rx']\n", 7, "job.container.mounts[0]", "the mode must be ro or rw"),
    ("    runtime: docker\n    options: [-d]\n", 7, "job.container.options[0]", "in the foreground"),
    ("    runtime: docker\n    options: [--detach]\n", 7, "job.container.options[0]", "in the foreground"),
    ("    runtime: docker\n    options: [--rm=false]\n", 7, "job.container.options[0]", "must be removed"),
    ("    runtime: docker\n    options: [--network, bridge]\n", 7, "job.container.options[0]", "host's network"),
    ("    runtime: podman\n    options: [--net=slirp4netns]\n", 7, "job.container.options[0]", "host's network"),
    ("    runtime: docker\n    options: [--gpus=all]\n", 7, "job.container.options[0]", "leave --gpus out"),
    (
        "    runtime: podman\n    options: [--device, nvidia.com/gpu=all]\n",
        7,
        "job.container.options[0]",
        "leave --device out",
    ),
    ("    runtime: docker\n    options: [--name=mine]\n", 7, "job.container.options[0]", "orch names the container"),
    ("    runtime: docker\n    options: [-u, '0']\n", 7, "job.container.options[0]", "job.container.user instead"),
    ("    runtime: docker\n    options: [-e, TOKEN=x]\n", 7, "job.container.options[0]", "never go on a command line"),
    ("    runtime: docker\n    options: [--label=orch.run=x]\n", 7, "job.container.options[0]", "orch.* labels"),
    # issue 53.4: what the runtime reads, not how it is spelt (short clusters, `=` forms, Go's booleans)
    ("    runtime: docker\n    options: ['-d=true']\n", 7, "job.container.options[0]", "in the foreground"),
    ("    runtime: podman\n    options: [-itd]\n", 7, "job.container.options[0]", "in the foreground"),
    ("    runtime: docker\n    options: ['--rm=False']\n", 7, "job.container.options[0]", "must be removed"),
    ("    runtime: podman\n    options: ['--rm=0']\n", 7, "job.container.options[0]", "must be removed"),
    ("    runtime: docker\n    options: [-u0]\n", 7, "job.container.options[0]", "job.container.user instead"),
    ("    runtime: docker\n    options: [--init, -ie, A=B]\n", 7, "job.container.options[1]", "never go on a"),
    ("    runtime: podman\n    options: [-l, orch.run=x]\n", 7, "job.container.options[0]", "orch.* labels"),
    ("    runtime: docker\n    options: [--label-file=/l]\n", 7, "job.container.options[0]", "give labels with"),
    ("    runtime: docker\n    options: [--shm-size, 1g, -w/x]\n", 7, "job.container.options[2]", "workdir instead"),
    ("    runtime: docker\n    options: [--some-new-flag, -d]\n", 7, "job.container.options[1]", "foreground"),
    ("    runtime: docker\n    options: [other-image]\n", 7, "job.container.options[0]", "is not a flag"),
    ("    runtime: docker\n    options: [-Z]\n", 7, "job.container.options[0]", "-Z is no one-letter flag"),
    ("    runtime: docker\n    mounts: ['--privileged']\n", 7, "job.container.mounts[0]", "starts with '-'"),
    ("    runtime: apptainer\n    options: [-e]\n", 7, "job.container.options[0]", "which it drops"),
    ("    runtime: docker\n    user: toor\n", 7, "job.container.user", "(did you mean 'root'?)"),
    ("    runtime: apptainer\n    user: root\n", 7, "job.container.user", "apptainer runs the job as the SSH user"),
    ("    runtime: docker\n    workdir: root/yoloe\n", 7, "job.container.workdir", "must be an absolute path"),
    ("    runtime: docker\n    pull: always\n", 7, "job.container.pull", "Input should be 'missing' or 'never'"),
    ("    runtime: docker\n    imag: x\n", 7, "job.container.imag", "(did you mean 'image'?)"),
]


@pytest.mark.parametrize("extra, line, key, text", BAD, ids=[b[3][:30] for b in BAD])
def test_a_container_setting_orch_cannot_honour_is_refused_with_its_line_and_key(
    extra: str, line: int, key: str, text: str
) -> None:
    yaml = (
        "nodes:\n  - host: a\n    gpus: 2\njob:\n  container:\n" + extra + "    image: /i.sif\n  run_root: /srv/runs\n"
    )
    with pytest.raises(InventoryError) as info:
        inventory.parse(yaml, "t.yaml")
    assert info.value.exit_code == 2
    message = str(info.value)
    assert f"t.yaml:{line}: [{key}]" in message and text in message, message


def test_an_image_named_like_a_flag_is_refused() -> None:
    """An image `--privileged` would be read by the runtime as a flag (and the python as the image)."""
    with pytest.raises(InventoryError) as info:
        inventory.parse("nodes:\n  - host: a\njob:\n  container:\n    runtime: docker\n    image: --privileged\n", "t")
    assert "t:6: [job.container.image]" in str(info.value) and "starts with '-'" in str(info.value)


def test_options_are_read_with_the_runtimes_grammar() -> None:
    """One-letter clusters, `=` forms and Go's booleans, as docker and podman read them; apptainer's
    own letters (its -e is --cleanenv, its -w --writable)."""
    from orchestrator.config.container import read_options

    def names(runtime: str, *options: str) -> list[tuple[str, str | None]]:
        found, bad = read_options(runtime, options)
        assert bad == []
        return [(o.name, o.value) for o in found]

    assert names("docker", "-itd") == [("--interactive", "true"), ("--tty", "true"), ("--detach", "true")]
    assert names("docker", "-d=false", "--rm=F") == [("--detach", "false"), ("--rm", "false")]
    assert names("podman", "-u0", "-eA=B") == [("--user", "0"), ("--env", "A=B")]
    assert names("podman", "--shm-size", "8g", "--privileged", "--memory-swap", "-1") == [
        ("--shm-size", "8g"),
        ("--privileged", "true"),
        ("--memory-swap", "-1"),
    ]
    assert names("apptainer", "-ew", "-B", "/a:/b") == [
        ("--cleanenv", "true"),
        ("--writable", "true"),
        ("--bind", "/a:/b"),
    ]


def test_options_that_do_not_contradict_pass_and_gpu_flags_are_the_users_without_gpus() -> None:
    inv = inventory.parse(
        "nodes:\n  - host: a\njob: {container: {runtime: docker, image: i, "
        "options: [--gpus=all, --network=host, --rm, --shm-size=8g, --privileged]}}\n",
        "t.yaml",
    )
    argv = job_command(inv, inv.nodes[0], [])
    assert argv[-7:-2] == ["--gpus=all", "--network=host", "--rm", "--shm-size=8g", "--privileged"]
    assert "--ipc" not in argv


def test_dry_run_shows_the_whole_container_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["up", str(YOLOE), "--dry-run", "--json"])
    assert info.value.code == 0
    plan = json.loads(capsys.readouterr().out)
    line = shlex.join(plan["nodes"][1]["argv"])
    assert line.startswith("docker run --rm --init --pull never --name orch-") and "--network host" in line
    assert "--gpus '\"device=0,1,2,3,4,5,6,7\"'" in line and " --shm-size=32g yoloe-official:latest " in line
    assert plan["nodes"][1]["stop_hook"][:3] == ["docker", "rm", "-f"]


def test_the_preflight_pins_each_nodes_chosen_gpus_by_uuid() -> None:
    """nvidia-smi's index → UUID on each node (the probe's query), for the GPUs the launch gives the
    container: the first nproc_per_node, or what CUDA_VISIBLE_DEVICES in env: selects."""
    from orchestrator.preflight.facts import NodeFacts
    from orchestrator.preflight.runner import container_pins

    inv = inventory.parse(
        "nodes:\n  - host: a\n    gpus: 4\n    nproc_per_node: 2\n"
        "  - host: b\n    gpus: 4\n    nproc_per_node: 2\n    env: {CUDA_VISIBLE_DEVICES: '3,GPU-x2'}\n"
        "  - host: c\n    gpus: 4\n    nproc_per_node: 2\n"
        "job: {rdzv: c10d, container: {runtime: docker, image: i}}\n",
        "t.yaml",
    )
    csv = "name, pci.bus_id, index, uuid\n" + "".join(
        f"A100, 0000:0{i}:00.0, {i}, GPU-{n}{i}\n" for i, n in enumerate("xxxx")
    )

    def facts(name: str, out: str) -> NodeFacts:
        return NodeFacts(
            inv.node(name),
            raw={
                "gpus": {
                    "source": "nvidia-smi",
                    "query": {"rc": 0, "out": out, "err": ""},
                    "table": {"rc": None, "out": "", "err": ""},
                }
            },
        )

    pins = container_pins(inv, {"a": facts("a", csv), "b": facts("b", csv), "c": facts("c", "")})
    assert pins is not None and dict(pins.gpus) == {"a": ("GPU-x0", "GPU-x1"), "b": ("GPU-x3", "GPU-x2")}
    argv = job_command(inv, inv.node("a"), [], pins=pins)
    assert argv[argv.index("--gpus") + 1] == '"device=GPU-x0,GPU-x1"'
    c = job_command(inv, inv.node("c"), [], pins=pins)  # no UUIDs known there: the indices, as chosen
    assert c[c.index("--gpus") + 1] == '"device=0,1"'
    assert container_pins(inventory.load(REPO / "inventory" / "v100.yaml"), {}) is None
