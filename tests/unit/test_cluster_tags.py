"""The test cluster's own bookkeeping: which processes a cluster owns. Its reset kills them, so a
tag that matches another cluster's processes kills that cluster's sshds under the other's tests."""

from __future__ import annotations

from tests.cluster import names_tag


def test_a_cluster_tag_names_its_own_files_and_not_those_of_a_cluster_whose_number_extends_it() -> None:
    log = b"/tmp/orchtest5c12-x/sshd-orchtest5c12.log"
    assert names_tag(log, b"orchtest5c12")
    assert not names_tag(log, b"orchtest5c1")  # cluster 1's reset killed cluster 12's sshds
    assert names_tag(b"/tmp/orchtest5c1-y/sshd-orchtest5c1.log", b"orchtest5c1")
    assert names_tag(b"sshd -f /tmp/orchtest5c1-y/node1/sshd_config", b"orchtest5c1")


def test_a_session_tag_names_each_of_its_clusters_and_not_another_sessions() -> None:
    assert names_tag(b"/tmp/orchtest5c12-x/sshd-orchtest5c12.log", b"orchtest5")
    assert not names_tag(b"/tmp/orchtest51c1-x/sshd-orchtest51c1.log", b"orchtest5")  # pid 51's session
    assert names_tag(b"orchtest51c1 orchtest5c3", b"orchtest5")  # any occurrence counts
    assert not names_tag(b"", b"orchtest5")
