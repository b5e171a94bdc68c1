"""The container check's image rows (preflight/checks.image_findings) on fabricated probe facts: the
image on every node under one ID, missing on one (or `pull: missing`), a tag that moved on one node
(the row names the node and both IDs), the driver against the image's CUDA (NVIDIA_REQUIRE_CUDA as
NVIDIA's toolkit enforces it, tests/fixtures' recorded nvidia-smi); and the ID the launch is pinned to."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.config import runtimes
from orchestrator.preflight import checks
from orchestrator.preflight.facts import probe_args
from orchestrator.preflight.runner import container_pins
from tests.unit.test_checks import NODES, _fixture_gpus, by, inventory, make_facts

IMG_A = "d9ff8d5725a6979dcf9fb3905a3d811e3881439e340b86201673e39e55efeba6"
IMG_B = "52f4c45746b6bee07e85b61cc732c243675328ff78dd248be27da4afe085a994"
CONTAINER = "  container: {runtime: podman, image: 'yoloe:latest'}\n"
CLEAN = {"rc": 0, "err": "", "out": ""}


def held(image_id: str, env: list[str] | None = None) -> dict[str, Any]:
    return {"rc": 0, "err": "", "out": f"{image_id}\t{json.dumps(env or ['PATH=/usr/bin'])}\n"}


MISSING = {"rc": 125, "out": "", "err": "Error: inspecting object: yoloe:latest: image not known\n"}


def facts_with(inv: Any, images: dict[str, dict[str, Any]], gpus: str | None = None) -> Any:
    def edit(node: str) -> Any:
        def apply(raw: dict[str, Any], nf: Any) -> None:
            raw.update(containers=CLEAN, container_image=images[node])
            if gpus:
                raw.update(gpus=_fixture_gpus(gpus))

        return apply

    return make_facts(inv, {n: edit(n) for n in NODES})


def test_the_probe_is_asked_for_the_image_with_its_id_and_environment() -> None:
    inv = inventory(CONTAINER)
    args = probe_args(inv, inv.nodes[0], ["container"], "tok", 4)
    assert args["container_image"] == [
        "podman",
        "image",
        "inspect",
        "--format",
        "{{.Id}}\t{{json .Config.Env}}",
        "yoloe:latest",
    ]
    assert runtimes.runtime("apptainer").inspect_argv("/i/y.sif") == ["sha256sum", "/i/y.sif"]
    assert probe_args(inventory(), inv.nodes[0], ["container"], "tok", 4)["container_image"] is None


def test_one_id_everywhere_is_ok_and_pins_the_launch() -> None:
    inv = inventory(CONTAINER)
    facts = facts_with(inv, dict.fromkeys(NODES, held("sha256:" + IMG_A)))
    c = by(checks.check_container(inv, facts), "container")
    assert {r.status for r in c.values()} == {"ok"}
    assert f"yoloe:latest is image {IMG_A[:12]} on every node that has it (4)" in c["n1"].detail
    assert container_pins(inv, facts).image_id == IMG_A


def test_a_node_without_the_image_fails_and_names_orch_image_push() -> None:
    inv = inventory(CONTAINER)
    facts = facts_with(inv, {**dict.fromkeys(NODES, held(IMG_A)), "n2": MISSING})
    c = by(checks.check_container(inv, facts), "container")
    assert c["n2"].status == "fail" and "yoloe:latest is not on this node (job.container.image)" in c["n2"].detail
    assert c["n2"].hint.startswith("orch image push yoloe:latest t.yaml")
    assert {c[n].status for n in ("n1", "n3", "n4")} == {"ok"}
    assert container_pins(inv, facts).image_id is None  # not pinned while a node lacks it
    pulls = inventory("  container: {runtime: podman, image: 'yoloe:latest', pull: missing}\n")
    c = by(
        checks.check_container(pulls, facts_with(pulls, {**dict.fromkeys(NODES, held(IMG_A)), "n2": MISSING})),
        "container",
    )
    assert c["n2"].status == "warn" and "the launch pulls it (job.container.pull: missing)" in c["n2"].detail


def test_a_tag_that_moved_on_one_node_fails_there_naming_both_ids() -> None:
    inv = inventory(CONTAINER)
    facts = facts_with(inv, {**dict.fromkeys(NODES, held(IMG_A)), "n3": held(IMG_B)})
    c = by(checks.check_container(inv, facts), "container")
    assert c["n3"].status == "fail"
    assert f"yoloe:latest is {IMG_B[:12]} here but {IMG_A[:12]} on n[1-2,4]" in c["n3"].detail
    assert "a tag that moved" in c["n3"].detail and "orch image push" in c["n3"].hint
    assert {c[n].status for n in ("n1", "n2", "n4")} == {"ok"}
    assert container_pins(inv, facts).image_id is None


def test_two_against_two_fails_every_node() -> None:
    inv = inventory(CONTAINER)
    facts = facts_with(inv, {"n1": held(IMG_A), "n2": held(IMG_A), "n3": held(IMG_B), "n4": held(IMG_B)})
    c = by(checks.check_container(inv, facts), "container")
    assert {r.status for r in c.values()} == {"fail"}
    assert f"but {IMG_B[:12]} on n[3-4]" in c["n1"].detail and f"but {IMG_A[:12]} on n[1-2]" in c["n4"].detail


def test_a_runtime_that_does_not_answer_is_not_a_missing_image() -> None:
    inv = inventory(CONTAINER)
    gone = {"rc": None, "out": "", "err": "podman: not found in PATH"}
    facts = facts_with(inv, {**dict.fromkeys(NODES, held(IMG_A)), "n4": gone})
    assert facts["n4"].image(runtimes.runtime("podman")).error == "podman: not found in PATH"
    c = by(checks.check_container(inv, facts), "container")
    assert c["n4"].status == "fail" and "could not ask podman for yoloe:latest" in c["n4"].detail


HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"
"""A node's answer in the ID's place: OSC title, BEL, clear screen, a C1 CSI, a bidi override."""


def test_an_answer_that_is_no_image_id_fails_its_node_and_is_never_pinned() -> None:
    """What a node's runtime printed for the image is the launch's image word once pinned: an answer
    that is not an ID (escapes, a login banner) fails that node's row, and nothing is pinned, even
    when every node printed the same."""
    inv = inventory(CONTAINER)
    facts = facts_with(inv, {**dict.fromkeys(NODES, held(IMG_A)), "n2": held(HOSTILE + IMG_A[20:])})
    c = by(checks.check_container(inv, facts), "container")
    assert c["n2"].status == "fail" and "podman answered \x1b]0;owned" in c["n2"].detail, c["n2"]
    assert "not an image ID (64 hex digits)" in c["n2"].detail and "login script" in c["n2"].hint
    assert {c[n].status for n in ("n1", "n3", "n4")} == {"ok"}
    assert container_pins(inv, facts).image_id is None
    for answer in (HOSTILE + IMG_A[20:], "Welcome", IMG_A[:12]):
        same = facts_with(inv, dict.fromkeys(NODES, held(answer)))
        assert container_pins(inv, same).image_id is None, answer
        assert {r.status for r in by(checks.check_container(inv, same), "container").values()} == {"fail"}


def test_the_image_cuda_against_the_node_driver() -> None:
    """The recorded V100 node: driver 535.129.03, CUDA 12.2. An image requiring cuda>=12.8 (as the
    recorded `nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8`) fails; one
    requiring 12.1 passes; an image with CUDA_VERSION 13.0.1 only needs driver 580 by the table."""
    inv = inventory("  container: {runtime: docker, image: 'pytorch:25.01'}\n", gpus=True)
    req = ["NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471", "CUDA_VERSION=12.8.0"]
    c = by(
        checks.check_container(inv, facts_with(inv, dict.fromkeys(NODES, held(IMG_A, req)), gpus="v100")), "container"
    )
    assert c["n1"].status == "fail"
    assert (
        "the image requires CUDA 12.8 or newer (its NVIDIA_REQUIRE_CUDA); this node's driver 535.129.03 "
        "supports CUDA 12.2"
    ) in c["n1"].detail
    ok = ["NVIDIA_REQUIRE_CUDA=cuda>=12.1", "CUDA_VERSION=12.1.0"]
    c = by(
        checks.check_container(inv, facts_with(inv, dict.fromkeys(NODES, held(IMG_A, ok)), gpus="v100")), "container"
    )
    assert c["n1"].status == "ok", c["n1"]
    new = ["CUDA_VERSION=13.0.1"]
    c = by(
        checks.check_container(inv, facts_with(inv, dict.fromkeys(NODES, held(IMG_A, new)), gpus="v100")), "container"
    )
    assert c["n1"].status == "fail" and "needs NVIDIA driver 580 or newer" in c["n1"].detail


def test_a_small_dev_shm_inside_the_container_fails() -> None:
    """The software facts measured /dev/shm inside the container: 64 MiB (a container's default,
    as the recorded `df -h` in a container shows) fails naming the options; the host's size passes."""
    inv = inventory(CONTAINER)

    def shm(size: int) -> Any:
        def edit(raw: dict[str, Any], nf: Any) -> None:
            raw.update(containers=CLEAN, container_image=held(IMG_A))
            raw["software"] = {**raw["software"], "shm_bytes": size}

        return edit

    facts = make_facts(inv, {n: shm(64 << 20 if n == "n2" else 32 << 30) for n in NODES})
    c = by(checks.check_container(inv, facts), "container")
    assert c["n2"].status == "fail" and "/dev/shm in the container is 64 MiB" in c["n2"].detail
    assert "--shm-size=16g" in c["n2"].hint
    assert {c[n].status for n in ("n1", "n3", "n4")} == {"ok"}


def test_the_gpus_the_container_gets() -> None:
    """On GPU nodes, the torch facts gathered in the container: podman without a CDI spec (recorded:
    shared fixtures podman-cdi-unresolvable-gpu-all_FasterLivePortrait-116.txt) and docker without
    the NVIDIA runtime (docker-run-error_could-not-select-device-driver_nvidia-docker-1034.txt) are
    named with their fix; a count other than nproc_per_node fails."""

    def torch_sees(runtime: str, tc: dict[str, Any]) -> Any:
        inv = inventory(f"  container: {{runtime: {runtime}, image: 'yoloe:latest'}}\n", gpus=True)

        def edit(raw: dict[str, Any], nf: Any) -> None:
            raw.update(containers=CLEAN, container_image=held(IMG_A), gpus=_fixture_gpus("v100"), torch_cuda=tc)

        return by(checks.check_container(inv, make_facts(inv, dict.fromkeys(NODES, edit))), "container")["n1"]

    cdi = (
        "python could not tell torch's CUDA build: Error: setting up CDI devices:"
        " unresolvable CDI devices nvidia.com/gpu=all"
    )
    r = torch_sees("podman", {"error": cdi})
    assert r.status == "fail" and "unresolvable CDI devices nvidia.com/gpu=all" in r.detail
    assert "nvidia-ctk cdi generate" in r.hint
    docker = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
    r = torch_sees("docker", {"error": docker})
    assert r.status == "fail" and "nvidia-ctk runtime configure --runtime=docker" in r.hint
    r = torch_sees("docker", {"torch": "2.5.1", "cuda": "12.4", "arch_list": [], "device_count": 0})
    assert r.status == "fail" and "torch in the container sees 0 GPU(s), but nproc_per_node is 8" in r.detail
    r = torch_sees("docker", {"torch": "2.5.1", "cuda": "12.4", "arch_list": [], "device_count": 8})
    assert r.status == "ok", r


def test_an_output_folder_not_writable_inside_the_container_fails() -> None:
    inv = inventory("  container: {runtime: podman, image: 'yoloe:latest', user: '1000:1000'}\n")

    def edit(raw: dict[str, Any], nf: Any) -> None:
        raw.update(
            containers=CLEAN,
            container_image=held(IMG_A),
            outputs_inside={"paths": {"project": {"checked": "/srv/runs", "writable": nf.node.name != "n3"}}},
        )

    c = by(checks.check_container(inv, make_facts(inv, dict.fromkeys(NODES, edit))), "container")
    assert c["n3"].status == "fail"
    assert "--project: /srv/runs is not writable inside the container (as uid:gid 1000:1000)" in c["n3"].detail
    assert {c[n].status for n in ("n1", "n2", "n4")} == {"ok"}


TINI_EACCES = "[FATAL tini (6)] exec /root/venv/bin/python failed: Permission denied\n"
"""What the bed's podman said (tests/integration/test_up_container_user.py) when uid 1000 could not
reach an interpreter mounted under the image's /root (0700)."""
RUNC_ENOENT = (
    'Error: runc: runc create failed: unable to start container process: exec: "/root/venv/bin/python": '
    "stat /root/venv/bin/python: no such file or directory: OCI runtime attempted to invoke a command "
    "that was not found\n"
)


def test_a_container_user_that_cannot_run_the_jobs_python_fails_naming_both_keys() -> None:
    """The job's interpreter could not be run inside (from the software facts' container, or the
    output folders' one): one row naming the node's container user and job.container.python, with
    what to change; not the generic "could not look" row."""
    inv = inventory(
        "  container: {runtime: podman, image: 'yoloe:latest', user: '1000:1000', python: /root/venv/bin/python}\n"
    )

    def edit(raw: dict[str, Any], nf: Any) -> None:
        raw.update(containers=CLEAN, container_image=held(IMG_A))
        if nf.node.name == "n2":
            raw.update(
                outputs_inside={"error": "could not look inside the container: " + TINI_EACCES.strip()},
                software={"python": "3.11.2", "error": "version probe failed: " + TINI_EACCES},
            )
        if nf.node.name == "n3":
            raw.update(software={"python": "3.11.2", "error": "version probe failed: " + RUNC_ENOENT})

    c = by(checks.check_container(inv, make_facts(inv, dict.fromkeys(NODES, edit))), "container")
    for node, why in (("n2", "Permission denied"), ("n3", "no such file or directory")):
        r = c[node]
        assert r.status == "fail", r
        assert (
            "job.container.python /root/venv/bin/python cannot be run inside the container as uid:gid "
            "1000:1000 (job.container.user)"
        ) in r.detail, r.detail
        assert why in r.detail and "could not look" not in r.detail, r.detail
        assert "job.container.user" in r.hint and "job.container.python" in r.hint and "/root" in r.hint, r.hint
    assert {c[n].status for n in ("n1", "n4")} == {"ok"}


def test_the_container_check_alone_looks_inside_as_the_jobs_user() -> None:
    """`orch check --only container`: the output folders (not the job's other files) are looked at
    from inside, which runs the job's interpreter as the container's user even with none."""
    inv = inventory("    project: /srv/runs\n" + CONTAINER)
    args = probe_args(inv, inv.nodes[0], ["container"], "tok", 4)
    assert args["outputs_inside"] is True
    assert args["in_container"]["project"] == "/srv/runs" and args["outputs"] == ["project"]
    assert args["paths"] == {}  # nothing judged on the host: that is the job check's
    assert probe_args(inv, inv.nodes[0], ["software"], "tok", 4)["paths"] == {}


def test_the_probe_starts_one_container_of_the_image_per_node_for_every_question_inside() -> None:
    """The software and torch facts, the output folders seen inside and the job's own check are
    answered by one run of the job's container (`in_image`, named `...-probe`), where there were a
    container for each (four on a GPU master): its env names include the check's, which only the
    check sees inside."""
    inv = inventory(CONTAINER, gpus=True)
    master = inv.nodes[0]
    args = probe_args(inv, master, ["container", "job", "software", "gpus"], "tok", 4)
    argv = args["job_python"]
    assert args["in_image"] is True and argv[:2] == ["podman", "run"] and argv[-1] == "python3"
    assert argv[argv.index("--name") + 1].endswith("-probe")
    assert "RANK" in args["job_check"]["env"] and "RANK" in argv and "job_python" not in args["job_check"]
    assert args["job_check"]["inner"][:3] == ["-m", "trainer", "--check"]
    assert args["torch_cuda"] and args["software"] and args["outputs_inside"]
    bare = probe_args(inventory(), master, ["container", "job"], "tok", 4)
    assert bare["outputs_inside"] is False and bare["in_image"] is False
    assert bare["job_python"] == ["/opt/py/bin/python"]  # the host's: the job's check runs it


def test_rdma_inside_the_container_needs_unlimited_memlock_and_the_devices() -> None:
    """checks.rdma.devices set: 8 MiB memlock inside the container (this sandbox's hard limit, as
    the podman bed measured it) or no /dev/infiniband there fails; unlimited with the devices
    passes; without rdma.devices nothing is asked."""

    def row(memlock: int, devices: list[str], rdma: bool = True) -> Any:
        inv = inventory(CONTAINER, rdma=rdma)

        def edit(raw: dict[str, Any], nf: Any) -> None:
            raw.update(containers=CLEAN, container_image=held(IMG_A))
            raw["software"] = {**raw["software"], "memlock": memlock, "infiniband": devices}

        return by(checks.check_container(inv, make_facts(inv, dict.fromkeys(NODES, edit))), "container")["n1"]

    r = row(8 << 20, ["uverbs0", "rdma_cm"])
    assert r.status == "fail" and "memlock is 8192 KiB inside the container, not unlimited" in r.detail
    r = row(-1, [])
    assert r.status == "fail" and "no /dev/infiniband inside the container" in r.detail
    assert row(-1, ["uverbs0", "rdma_cm"]).status == "ok"
    assert row(8 << 20, [], rdma=False).status == "ok"


def test_a_missing_image_skips_the_rows_that_need_it_with_one_line() -> None:
    """Issue 54.6: the image missing on n1 (the master, where the trainer's check runs) under
    `pull: never`. Before, three rows: `software` compared the host's python with the image's and
    said "install identical versions everywhere", `job` said "pip install -e '.[trainer]'". Now the
    container row says what to do, and each row that needed the image is `skip`, in one line."""
    inv = inventory(CONTAINER)
    said = "Error: localhost/yoloe:latest: image not known"
    facts = facts_with(inv, {**dict.fromkeys(NODES, held(IMG_A)), "n1": MISSING})
    # what the probe brought back before it knew not to start a container of a missing image
    facts["n1"].raw["software"] = {"python": "3.11.2", "error": f"could not look inside the container: {said}"}
    facts["n1"].raw["job_check"] = {"kind": "trainer", "rc": 125, "out": "", "err": said, "seconds": 0.1}
    results = checks.run_checks(inv, facts, ["software", "job", "container"])
    rows = {(r.check, r.node): r for r in results}
    assert rows["container", "n1"].status == "fail" and "orch image push" in rows["container", "n1"].hint
    for check in ("software", "job"):
        row = rows[check, "n1"]
        assert row.status == "skip", row
        assert "yoloe:latest is not here, so no container of the job's image ran on this node" in row.detail, row
        assert "pip install" not in row.hint and "identical versions" not in row.hint, row
    assert {rows["software", n].status for n in ("n2", "n3", "n4")} == {"ok"}  # n1 is no odd one out


def test_the_probe_starts_no_container_of_an_image_the_node_lacks() -> None:
    """The image is asked first wherever anything runs in it (not only with the container check);
    under `pull: never` a failed `inspect` keeps the probe from starting a container of it."""
    from orchestrator.node import probe

    inv = inventory(CONTAINER)
    args = probe_args(inv, inv.nodes[0], ["software"], "tok", 4)
    assert args["container_image"][:3] == ["podman", "image", "inspect"] and args["image_required"] is True
    pulls = inventory("  container: {runtime: podman, image: 'yoloe:latest', pull: missing}\n")
    assert probe_args(pulls, pulls.nodes[0], ["software"], "tok", 4)["image_required"] is False
    assert probe.image_gone(args, {"container_image": MISSING})
    assert not probe.image_gone(args, {"container_image": held(IMG_A)})
    assert not probe.image_gone({**args, "image_required": False}, {"container_image": MISSING})


def test_a_start_the_node_refuses_is_named_with_its_fix() -> None:
    """Issue 53.9: a node that grants no CAP_SYS_RESOURCE refuses any `--ulimit` past its own limits,
    and Debian's podman without catatonit any `--init`: the container row names the runtime's words
    and the fix (with RDMA, that orch asked for the memlock); the software row is one line."""
    rlimit = (
        "Error: runc: runc create failed: error setting rlimit type 8: operation not permitted: OCI permission denied"
    )
    init = "Error: container-init binary not found on the host: stat /usr/libexec/podman/catatonit: no such file"
    for inv in (inventory(CONTAINER), inventory(CONTAINER, rdma=True)):
        facts = facts_with(inv, dict.fromkeys(NODES, held(IMG_A)))
        facts["n1"].raw["container_start"] = {"rc": 126, "out": "", "err": rlimit + "\n"}
        facts["n2"].raw["container_start"] = {"rc": 125, "out": "", "err": init + "\n"}
        facts["n3"].raw["container_start"] = {"rc": 125, "out": "", "err": "Error: something else\n"}
        rows = {(r.check, r.node): r for r in checks.run_checks(inv, facts, ["software", "container"])}
        one = rows["container", "n1"]
        assert one.status == "fail" and f"podman cannot start the job's container on this node: {rlimit}" in one.detail
        assert "no CAP_SYS_RESOURCE" in one.hint and "default_ulimits = []" in one.hint, one
        assert ("checks.rdma.devices is set" in one.hint) == bool(inv.checks.rdma_devices), one
        two = rows["container", "n2"]
        assert init in two.detail and "install catatonit" in two.hint and 'init_path = "/usr/bin/tini"' in two.hint
        three = rows["container", "n3"]
        assert "podman could not start the job's container: Error: something else" in three.detail, three
        assert {rows["software", n].status for n in ("n1", "n2", "n3")} == {"skip"}
        assert "the job's container did not start on this node" in rows["software", "n1"].detail
        assert rows["container", "n4"].status == "ok" and rows["software", "n4"].status == "ok"
