"""The copy chain's pure parts (issue 51): the relay's frames and handshake (a stranger without the
transfer's secret is refused, a flipped byte is caught), the files stream and its sink, rsync's
rule, the topology and its mending, the judges of a silent or stalled member, the choice of
method and the room check. The chain itself runs on real nodes in
tests/integration/test_chain_netns.py and on this machine in tests/local/test_chain_local.py."""

from __future__ import annotations

import hashlib
import io
import os
import random
import time
from pathlib import Path

import pytest

from orchestrator.cli import commands
from orchestrator.node import relay
from orchestrator.remote import chain
from orchestrator.remote.chain import Action, Seen

SECRET = bytes(range(32))
TID = b"0123456789abcdef"


# ----------------------------------------------------------------------------- frames


def split(frame: bytes) -> tuple[bytes, bytes]:
    assert frame[:1] == b"D"
    return frame[1 : relay.HEADER], frame[relay.HEADER :]


def test_a_data_frame_holds_with_the_secret_and_is_refused_without_it() -> None:
    frame = relay.data_frame(SECRET, TID, 4096, b"payload")
    header, payload = split(frame)
    offset, length, digest = relay.check_data(SECRET, TID, header)
    relay.check_payload(offset, digest, payload)
    assert (offset, length, payload) == (4096, 7, b"payload")
    with pytest.raises(relay.Refused, match="MAC"):
        relay.check_data(bytes(32), TID, header)  # a stranger's secret
    with pytest.raises(relay.Refused, match="MAC"):
        relay.check_data(SECRET, b"another-transfer", header)  # another transfer's frame replayed


def test_a_flipped_byte_is_caught_in_the_payload_and_in_the_header() -> None:
    header, payload = split(relay.data_frame(SECRET, TID, 0, b"x" * 1000))
    offset, _, digest = relay.check_data(SECRET, TID, header)
    flipped = payload[:-1] + bytes([payload[-1] ^ 0xFF])
    with pytest.raises(relay.Refused, match="sha256"):
        relay.check_payload(offset, digest, flipped)
    moved = bytearray(header)
    moved[7] ^= 1  # the offset: the MAC covers it
    with pytest.raises(relay.Refused, match="MAC"):
        relay.check_data(SECRET, TID, bytes(moved))
    big = bytearray(relay.data_frame(SECRET, TID, 0, b"")[1 : relay.HEADER])
    big[8:12] = (relay.MAX_CHUNK + 1).to_bytes(4, "big")
    with pytest.raises(relay.Refused, match="chunk of"):
        relay.check_data(SECRET, TID, bytes(big))


def test_acks_and_commands_round_trip() -> None:
    ack = relay.ack_frame(SECRET, TID, 12345)
    assert ack[:1] == b"A" and relay.check_ack(SECRET, TID, ack[1:]) == 12345
    with pytest.raises(relay.Refused):
        relay.check_ack(bytes(32), TID, ack[1:])
    message = {"op": "next", "host": "10.0.0.2", "port": 4000, "index": 3}
    frame = relay.ctrl_frame(message)
    assert frame[:1] == b"C" and relay.read_ctrl(io.BytesIO(frame[1:]).read) == message
    huge = relay.CTRL.pack(relay.MAX_CTRL + 1)
    with pytest.raises(relay.Refused, match="command of"):
        relay.read_ctrl(io.BytesIO(huge).read)


def test_the_handshake_refuses_a_stranger_and_an_impostor() -> None:
    challenge, nonce = os.urandom(16), os.urandom(16)
    answer = relay.hello_answer(SECRET, TID, challenge, 5, nonce)
    assert relay.check_hello(SECRET, TID, challenge, 5, answer) == nonce
    stranger = relay.hello_answer(bytes(32), TID, challenge, 5, nonce)
    with pytest.raises(relay.Refused, match="secret"):
        relay.check_hello(SECRET, TID, challenge, 5, stranger)
    with pytest.raises(relay.Refused):  # an answer made for another member's challenge or index
        relay.check_hello(SECRET, TID, os.urandom(16), 5, answer)
    with pytest.raises(relay.Refused):
        relay.check_hello(SECRET, TID, challenge, 6, answer)
    resume = relay.resume_answer(SECRET, TID, nonce, 777)
    assert relay.check_resume(SECRET, TID, nonce, resume) == 777
    with pytest.raises(relay.Refused, match="listener"):  # a port taken over by someone without the secret
        relay.check_resume(SECRET, TID, nonce, relay.resume_answer(bytes(32), TID, nonce, 777))


def test_read_exact_says_when_the_stream_ends_early() -> None:
    with pytest.raises(EOFError, match="after 3 of 5"):
        relay.read_exact(io.BytesIO(b"abc").read, 5)


@pytest.mark.parametrize("seed", range(5))
def test_ranges_expand_back(seed: int) -> None:
    rng = random.Random(seed)
    indices = sorted(rng.sample(range(200), rng.randint(0, 60)))
    assert relay.expand(relay.ranges(indices)) == indices
    assert relay.ranges([0, 1, 2, 5, 7, 8]) == [[0, 3], [5, 6], [7, 9]]


# ----------------------------------------------------------------------------- the files stream


def make_files(tmp_path: Path, sizes: list[int]) -> list[tuple[str, int]]:
    rng = random.Random(1)
    out = []
    for i, size in enumerate(sizes):
        path = tmp_path / "src" / f"f{i}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        out.append((str(path), size))
    return out


def expected_stream(files: list[tuple[str, int]]) -> bytes:
    out = b""
    for path, _ in files:
        data = Path(path).read_bytes()
        out += data + hashlib.sha256(data).digest()
    return out


def test_the_files_stream_is_each_file_then_its_sha256_read_at_any_offset(tmp_path: Path) -> None:
    files = make_files(tmp_path, [5000, 0, 3 * (1 << 20) + 7, 1])
    source = chain.FileSource(files)
    want = expected_stream(files)
    assert source.total == len(want) == sum(s for _, s in files) + 4 * relay.DIGEST
    assert relay.layout([s for _, s in files]) == [0, 5032, 5064, 5064 + 3 * (1 << 20) + 7 + 32]
    # a resumed head reads from where it stands: far ahead first, then behind
    assert source.read(len(want) - 100, 100) == want[-100:]
    for offset, n in [(0, 10), (4990, 60), (5030, 40), (1 << 20, 1 << 18), (0, len(want))]:
        assert source.read(offset, n) == want[offset : offset + n], (offset, n)
    source.close()


def test_a_file_that_changes_while_it_is_sent_fails_the_transfer(tmp_path: Path) -> None:
    files = make_files(tmp_path, [4000])
    source = chain.FileSource(files)
    Path(files[0][0]).write_bytes(b"short")
    with pytest.raises(chain.OrchError, match="changed on this machine"):
        source.read(0, 100)


def entries_for(files: list[tuple[str, int]], dest: Path) -> list[dict]:
    out = []
    for path, size in files:
        st = os.stat(path)
        out.append({"p": str(dest / Path(path).name), "t": "f", "s": size, "m": 0o640, "mt": st.st_mtime_ns})
    return out


def feed(sink: relay.FileSink, stream: bytes, piece: int) -> None:
    for offset in range(0, len(stream), piece):
        sink.write(offset, memoryview(stream[offset : offset + piece]))


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_the_sink_writes_what_it_lacks_renamed_once_its_sha256_holds(tmp_path: Path, piece: int) -> None:
    files = make_files(tmp_path, [3000, 0, 10_000])
    dest = tmp_path / "dest"
    entries = entries_for(files, dest)
    cfg = {"tid": "t" * 16, "manifest": entries}
    sink = relay.FileSink(cfg, {"send": [[0, 3]], "want": [[0, 2]]})  # the third is someone else's
    sink.prepare()
    feed(sink, expected_stream(files), piece)
    assert sink.end() == {"files": 2, "bytes": 3000}
    assert (dest / "f0").read_bytes() == Path(files[0][0]).read_bytes()
    assert (dest / "f1").read_bytes() == b"" and not (dest / "f2").exists()
    assert os.stat(dest / "f0").st_mode & 0o777 == 0o640
    assert os.stat(dest / "f0").st_mtime_ns == entries[0]["mt"]
    assert sorted(p.name for p in dest.iterdir()) == ["f0", "f1"]  # no temporary file left


def test_a_file_whose_bytes_do_not_match_its_sha256_is_never_put_in_place(tmp_path: Path) -> None:
    files = make_files(tmp_path, [3000])
    dest = tmp_path / "dest"
    (dest).mkdir()
    (dest / "f0").write_bytes(b"the old version")
    sink = relay.FileSink({"tid": "t" * 16, "manifest": entries_for(files, dest)}, {"send": [[0, 1]], "want": [[0, 1]]})
    stream = bytearray(expected_stream(files))
    stream[-1] ^= 0xFF  # the digest this machine sent does not match what was written
    with pytest.raises(OSError, match="holds sha256"):
        feed(sink, bytes(stream), 1000)
    sink.abort()
    assert (dest / "f0").read_bytes() == b"the old version"
    assert sorted(p.name for p in dest.iterdir()) == ["f0"]


def test_rsyncs_rule_size_and_time_or_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    st = os.stat(path)
    entry = {"s": 3, "mt": st.st_mtime_ns, "h": hashlib.sha256(b"abc").hexdigest()}
    assert relay.up_to_date(entry, st, False, str(path))
    assert not relay.up_to_date({**entry, "mt": st.st_mtime_ns + 10**9}, st, False, str(path))
    assert not relay.up_to_date({**entry, "s": 4}, st, False, str(path))
    assert not relay.up_to_date(entry, None, False, str(path))
    assert relay.up_to_date({**entry, "mt": 0}, st, True, str(path))  # --checksum: the time does not count
    assert not relay.up_to_date({**entry, "h": "0" * 64}, st, True, str(path))


# ----------------------------------------------------------------------------- the topology


def test_roles_and_upstreams() -> None:
    chains = (("a", "b", "c"), ("d",))
    assert [chain.role(chains, n) for n in "abcde"] == ["head", "relay", "tail", "head", None]
    assert [chain.upstream(chains, n) for n in "abcde"] == ["", "a", "b", "", None]


@pytest.mark.parametrize(
    ("gone", "after", "actions"),
    [
        ("a", (("b", "c", "d"),), [Action("feed", "b")]),
        ("b", (("a", "c", "d"),), [Action("next", "a", "c")]),
        ("c", (("a", "b", "d"),), [Action("next", "b", "d")]),
        ("d", (("a", "b", "c"),), [Action("tail", "c")]),
    ],
)
def test_a_member_spliced_out_its_predecessor_feeds_its_successor(gone: str, after: tuple, actions: list) -> None:
    assert chain.splice((("a", "b", "c", "d"),), gone) == (after, actions)


def test_the_last_member_of_a_chain_leaves_nothing_behind() -> None:
    assert chain.splice((("a",), ("b", "c")), "a") == ((("b", "c"),), [])
    assert chain.splice((("a", "b"),), "x") == ((("a", "b"),), [])


def test_a_member_that_cannot_reach_its_successor_cuts_the_chain_there() -> None:
    chains, actions = chain.cut((("a", "b", "c", "d"),), "b", "c")
    assert chains == (("a", "b"), ("c", "d"))
    assert actions == [Action("tail", "b"), Action("feed", "c")]
    assert chain.cut((("a", "b", "c"),), "a", "c") == ((("a", "b", "c"),), [])  # not neighbours: nothing


def test_the_slowest_member_moves_last() -> None:
    chains, actions = chain.move_last((("a", "b", "c", "d"),), "b")
    assert chains == (("a", "c", "d", "b"),)
    assert actions == [Action("tail", "b"), Action("next", "a", "c"), Action("next", "d", "b")]
    chains, actions = chain.move_last((("a", "b", "c"),), "a")
    assert chains == (("b", "c", "a"),)
    assert actions == [Action("tail", "a"), Action("feed", "b"), Action("next", "c", "a")]
    assert chain.move_last((("a", "b"),), "b") == ((("a", "b"),), [])  # already last


# ----------------------------------------------------------------------------- the judges


def test_a_member_not_heard_from_is_named() -> None:
    seen = {"a": Seen(10, 10, heard_s=0.4), "b": Seen(5, 5, heard_s=15.2)}
    assert chain.judge_silent(seen, 15.0) == [
        ("b", "no word from its relay for 15 s (its link is down, or the node stalled)")
    ]


def test_the_stall_names_the_member_that_does_not_take_what_was_sent_to_it() -> None:
    chains = (("a", "b", "c"),)
    total = 100
    # a forwarded 60 to b, which verified 40 and stays there: b holds the chain up
    seen = {"a": Seen(80, 60), "b": Seen(40, 40, "sink"), "c": Seen(40, 0)}
    name, why = chain.judge_stall(chains, seen, {"a": 80}, total)  # type: ignore[misc]
    assert name == "b" and "20 bytes waited for it" in why and "its disk or its load" in why
    # the controller wrote 50 to the head, which took 30: the head
    seen = {"a": Seen(30, 30, "up"), "b": Seen(30, 30), "c": Seen(30, 30)}
    assert chain.judge_stall(chains, seen, {"a": 50}, total)[0] == "a"  # type: ignore[index]
    # everything sent was received: no one to blame
    seen = {"a": Seen(30, 30), "b": Seen(30, 30), "c": Seen(30, 30)}
    assert chain.judge_stall(chains, seen, {"a": 30}, total) is None
    # a member that holds it all is not waited on: the one after it is
    seen = {"a": Seen(100, 100), "b": Seen(100, 100, "down"), "c": Seen(90, 0, "up")}
    name, why = chain.judge_stall(chains, seen, {"a": 100}, total)  # type: ignore[misc]
    assert name == "c" and why.endswith("(its link)")


def test_rates_over_a_span_of_samples() -> None:
    samples = [(0.0, 0), (0.5, 50), (1.0, 100), (1.5, 300)]
    assert chain.rate(samples, 1.0) == pytest.approx(250.0)
    assert chain.rate(samples[:2], 1.0) is None
    assert chain.rate(samples[:1], 0.1) is None


def test_the_bottleneck_is_the_first_member_well_below_its_predecessor() -> None:
    chains = (("a", "b", "c", "d"),)
    got = dict.fromkeys("abcd", 10)
    rates = {"a": 100.0, "b": 95.0, "c": 30.0, "d": 30.0}
    assert chain.bottleneck(chains, rates, 100, got) == "c"
    assert chain.bottleneck(chains, {**rates, "c": 90.0, "d": 89.0}, 100, got) is None
    assert chain.bottleneck(chains, {**rates, "c": 30.0}, 100, {**got, "c": 100}) is None  # it has it all
    # the tail is already last, and the head's rate is the controller's link's
    assert chain.bottleneck(chains, {"a": 10.0, "b": 100.0, "c": 100.0, "d": 5.0}, 100, got) is None


def test_the_limiting_hop_is_the_first_at_the_slowest_rate() -> None:
    chains = (("a", "b", "c"),)
    assert chain.limiting_hop(chains, {"a": 100.0, "b": 40.0, "c": 39.0}) == ("a", "b", 40.0)
    assert chain.limiting_hop(chains, {"a": 30.0, "b": 30.5, "c": 31.0}) == ("", "a", 30.0)
    assert chain.limiting_hop(chains, {}) is None


def test_auto_chains_big_payloads_to_two_nodes_or_more() -> None:
    assert chain.choose("auto", 8, 40_000_000)[0] == "chain"
    assert chain.choose("auto", 1, 40_000_000) == ("direct", "one node: a chain would carry the same one copy")
    assert chain.choose("auto", 8, chain.CHAIN_MIN_BYTES - 1)[0] == "direct"
    assert chain.choose("chain", 1, 0)[0] == "chain" and chain.choose("direct", 99, 10**12)[0] == "direct"


def test_the_room_check_adds_what_goes_to_one_filesystem() -> None:
    rooms = [
        {"path": "/var/lib/containers", "free": 150, "need": 100, "dev": 1},
        {"path": "/var/tmp", "free": 150, "need": 100, "dev": 1},
    ]
    assert chain.short_of_room(rooms) == "no room: needs 0.0 MB on /var/lib/containers, 0.0 MB free there"
    assert chain.short_of_room([{**rooms[0], "free": 200}, {**rooms[1], "free": 200}]) is None
    assert chain.short_of_room([{**rooms[0], "dev": 2}, rooms[1]]) is None
    big = [{"path": "/data", "free": 1_000_000, "need": 8_000_000}]
    assert chain.short_of_room(big) == "no room: needs 8.0 MB on /data, 1.0 MB free there"


def test_the_cli_offers_the_chains_methods() -> None:
    assert commands.METHODS == chain.METHODS


# ----------------------------------------------------------------------------- a stalled load


def wait_for(check: object, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {within:.0f} s: {what}"
        time.sleep(0.02)


def image_member(load: str, inspect: list[str], stall_s: float) -> tuple[relay.Relay, list[tuple[str, dict]]]:
    """An image chain's member whose load is the shell command `load`, and what it says."""
    said: list[tuple[str, dict]] = []
    cfg = {
        "secret": SECRET.hex(),
        "tid": TID.decode(),
        "index": 1,
        "window": 64 << 20,
        "mode": "image",
        "load": ["sh", "-c", load],
        "inspect": inspect,
        "stall_s": stall_s,
    }
    return relay.Relay(cfg, lambda ev, **fields: said.append((ev, fields))), said


def test_a_load_that_takes_no_byte_is_ended_by_its_relay_which_relays_on() -> None:
    """An image member's load reads a little, then stops reading (a real process: `sleep` holding
    its stdin). Past `stall_s` its relay ends it, says so (`sinkfail`, `stalled`, where it stood),
    and hands every frame on all the same: the members after it complete."""
    member, said = image_member("head -c 1000 >/dev/null; exec sleep 60", ["true"], 1.0)
    payload = random.Random(3).randbytes(4 << 20)
    member.start_sink({"total": len(payload)})
    sink = member.sink
    assert isinstance(sink, relay.ImageSink) and sink.proc is not None
    piece = 256 << 10
    for offset in range(0, len(payload), piece):
        frame = relay.data_frame(SECRET, TID, offset, payload[offset : offset + piece])
        assert member.take(io.BytesIO(frame[1:]).read, 0)

    import threading

    judge = threading.Thread(target=lambda: [member.judge_sink() or time.sleep(0.05) for _ in range(400)], daemon=True)
    judge.start()  # as its heartbeat does
    wait_for(lambda: member.sink_done, "the relay hands every frame on past the ended load")
    fails = [fields for ev, fields in said if ev == "sinkfail"]  # said before the member may end
    assert len(fails) == 1, said  # its write failing after the end is not said again
    assert fails[0]["stalled"] is True and fails[0]["why"] == "load took no byte for 1 s", fails
    assert 0 < fails[0]["at"] < len(payload), fails
    assert sink.proc.poll() is not None  # the load was ended
    assert member.sunk == len(payload) and not [ev for ev, _ in said if ev == "done"]


def test_a_load_that_took_every_byte_and_does_not_finish_is_ended_by_its_relay() -> None:
    """A load that takes the whole stream, then hangs (a disk that stops after the stream): its
    relay ends it `relay.finish_s` after the last byte and says so (`finishing`); nothing is held."""
    member, said = image_member("cat >/dev/null; exec sleep 60", ["echo", "held"], 0.5)
    payload = random.Random(5).randbytes(1 << 20)
    member.start_sink({"total": len(payload)})
    sink = member.sink
    assert isinstance(sink, relay.ImageSink) and sink.proc is not None
    assert member.take(io.BytesIO(relay.data_frame(SECRET, TID, 0, payload)[1:]).read, 0)
    started = time.monotonic()

    def finished() -> bool:
        member.judge_sink()
        return member.sink_done

    wait_for(finished, "the relay ends the load that does not finish")
    assert time.monotonic() - started >= relay.finish_s(0.5, len(payload)) - 0.1
    fails = [fields for ev, fields in said if ev == "sinkfail"]
    assert len(fails) == 1 and [ev for ev, _ in said] == ["sinkfail"], said
    assert fails[0]["stalled"] is True and fails[0]["finishing"] is True, fails
    assert fails[0]["why"] == "load took every byte and did not finish within 1 s", fails
    assert fails[0]["at"] == len(payload) and sink.proc.poll() is not None


def test_a_load_that_keeps_taking_bytes_is_never_judged() -> None:
    """The deadline is on progress: a load taking every byte (however slowly) and finishing is done."""
    member, said = image_member("cat >/dev/null", ["echo", "held"], 1.0)
    payload = random.Random(4).randbytes(1 << 20)
    member.start_sink({"total": len(payload)})
    frame = relay.data_frame(SECRET, TID, 0, payload)
    assert member.take(io.BytesIO(frame[1:]).read, 0)

    def finished() -> bool:
        member.judge_sink()
        return member.sink_done

    wait_for(finished, "the load takes the stream and finishes")
    assert [ev for ev, _ in said] == ["done"], said
    assert said[0][1]["held"]["out"] == "held\n"


def test_a_member_that_judges_its_own_load_is_blamed_by_the_controller_later() -> None:
    """The controller's stall judge waits `SINK_GRACE_S` past an image relay's `stall_s`: the
    relay's word (its load ended, relaying on) comes first; for files it judges at `stall_s`."""
    files = chain.Chain.__new__(chain.Chain)
    chain.Chain.__init__(files, {}, [], {"mode": "files"}, stall_s=12.0)  # type: ignore[arg-type]
    image = chain.Chain.__new__(chain.Chain)
    chain.Chain.__init__(image, {}, [], {"mode": "image", "stall_s": 12.0}, stall_s=12.0)  # type: ignore[arg-type]
    assert files.stall_s == 12.0 and image.stall_s == 12.0 + chain.SINK_GRACE_S


def test_a_member_told_its_successor_keeps_every_frame_its_sink_passed_until_the_successor_has_it() -> None:
    """Frames can arrive before a member's `go` (its predecessor was told first). A `go` naming a
    successor makes the member keep each frame its sink has passed until that successor acks it:
    else its sink, started first, trims them, and the successor, resuming at byte 0, is refused
    ("it resumes at byte 0, which this member no longer holds": a cut, one more copy from here)."""
    said: list[tuple[str, dict]] = []
    cfg = {"secret": SECRET.hex(), "tid": TID.decode(), "index": 1, "window": 64 << 20, "mode": "files", "manifest": []}
    member = relay.Relay(cfg, lambda ev, **fields: said.append((ev, fields)))
    payload = random.Random(5).randbytes(1 << 20)
    piece = 256 << 10
    for offset in range(0, len(payload), piece):
        frame = relay.data_frame(SECRET, TID, offset, payload[offset : offset + piece])
        assert member.take(io.BytesIO(frame[1:]).read, 0)
    member.start_sink({"total": len(payload), "write": False, "next": {"host": "127.0.0.1", "port": 9, "index": 2}})
    wait_for(lambda: member.sink_done, "the sink passes every frame")
    assert member.sunk == len(payload) and member.frames and member.frames[0][0] == 0, [f[0] for f in member.frames]
